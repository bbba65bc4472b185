"""Soak: clients calling through the gateway while extensions are SIGKILLed at random.

A real daemon supervises N extensions (quick.py, restart always); C clients, each a real
``mcp-supervisor connect`` driven by the SDK's ClientSession, call random extensions' ``echo``
for the whole run, while a killer SIGKILLs a random extension's child every 0.5-2 s. Every call
must end: with its answer, or with an error (a child that died mid-call, one restarting past
``call_timeout``). A call still open after 15 s counts as hung.

Reports calls, answers, errors, hung calls, kills and restarts, the daemon's RSS, tasks and fds
before and after (``health``), and how many processes outlived the daemon's SIGTERM. JSON out.

    python bench/soak.py [--seconds 60] [--extensions 10] [--clients 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import anyio
from _daemon import BIN, daemon, fixture, wait_for
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client

from supervisor.daemon.identity import instance_key
from supervisor.process import children as process

HUNG_AFTER = 15.0


def _health(socket: str) -> dict[str, Any]:
    out = subprocess.run(
        [str(BIN / "mcp-supervisor"), "health", "--json", "--socket", socket], capture_output=True, text=True
    )
    return json.loads(out.stdout)["process"] if out.returncode == 0 else {}


async def _client(socket: str, names: list[str], until: float, tally: dict[str, int]) -> None:
    params = StdioServerParameters(
        command=str(BIN / "mcp-supervisor"), args=["connect", "--socket", socket], env=dict(os.environ)
    )
    with open(os.devnull, "w") as quiet:  # noqa: ASYNC230 - once per client, at start
        async with stdio_client(params, errlog=quiet) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            while time.monotonic() < until:
                tally["calls"] += 1
                with anyio.move_on_after(HUNG_AFTER) as timer:
                    try:
                        result = await session.call_tool(f"{random.choice(names)}__echo", {"text": "soak"})
                        tally["errors" if result.is_error else "answers"] += 1
                    except MCPError:
                        tally["errors"] += 1
                if timer.cancelled_caught:
                    tally["hung"] += 1


async def _killer(socket: str, names: list[str], until: float, tally: dict[str, int]) -> None:
    while time.monotonic() < until:
        await anyio.sleep(random.uniform(0.5, 2.0))
        pid = (await anyio.to_thread.run_sync(_status, socket)).get(random.choice(names), {}).get("pid")
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
                tally["kills"] += 1
            except ProcessLookupError:
                pass


def _status(socket: str) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [str(BIN / "mcp-supervisor"), "status", "--json", "--socket", socket], capture_output=True, text=True
    )
    return {r["name"]: r for r in json.loads(out.stdout)["extensions"]} if out.returncode == 0 else {}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"ext{i}" for i in range(args.extensions)]
    extensions = {
        name: fixture("quick.py", restart="always", backoff={"initial": 0.1, "max": 1}, call_timeout=10)
        for name in names
    }
    tally = dict.fromkeys(("calls", "answers", "errors", "hung", "kills"), 0)
    with daemon(extensions) as running:
        wait_for(lambda: running.all_running(names), "every extension to run")
        before = _health(running.socket)
        until = time.monotonic() + args.seconds
        async with anyio.create_task_group() as tg:
            for _ in range(args.clients):
                tg.start_soon(_client, running.socket, names, until, tally)
            tg.start_soon(_killer, running.socket, names, until, tally)
        after = _health(running.socket)
        restarts = sum(record["restarts"] for record in _status(running.socket).values())
        running.proc.send_signal(signal.SIGTERM)
        exit_code = running.proc.wait(timeout=60)
        survivors = process.find_marked(f"{instance_key(running.socket)}:")
    return {
        "seconds": args.seconds,
        "extensions": args.extensions,
        "clients": args.clients,
        **tally,
        "restarts": restarts,
        "before": {k: before.get(k) for k in ("rss_bytes", "asyncio_tasks", "threads", "open_fds")},
        "after": {k: after.get(k) for k in ("rss_bytes", "asyncio_tasks", "threads", "open_fds")},
        "rss_growth_mib": round((after.get("rss_bytes", 0) - before.get("rss_bytes", 0)) / 2**20, 1),
        "daemon_exit_code": exit_code,
        "processes_left": len(survivors),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--extensions", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    report = anyio.run(main, parser.parse_args())
    print(json.dumps(report, indent=2))
    sys.exit(1 if report["hung"] or report["processes_left"] else 0)
