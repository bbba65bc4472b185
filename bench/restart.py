"""How fast a SIGKILLed extension is noticed and running again, against a naive baseline.

Starts a real daemon with two fixture extensions (backoff initial 0): ``plain`` (quick.py)
and ``tree`` (tree.py, whose grandchild keeps holding the child's stdout). Each is SIGKILLed
N times; the daemon's own timestamps give

* ``noticed_ms``: kill -> the exit recorded in ``last_exit.at``
* ``left_running_ms``: kill -> the status no longer says running (polled at 1 ms)
* ``running_again_ms``: kill -> ``since`` of the new running state

The baseline, in the same run, is what a naive supervisor does: an asyncio
``Process.wait()`` already pending when the same fixture is SIGKILLed (capped at 2 s).

Usage: ``python bench/restart.py [--kills 20]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from supervisor.control import client

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"
BASELINE_CAP = 2.0


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    median = statistics.median(ordered)
    return {"median": round(median, 2), "p95": round(p95, 2), "max": round(ordered[-1], 2)}


async def status(sock: str, name: str) -> dict[str, Any]:
    result = await client.request(sock, "status", {"name": name})
    return result["extensions"][0]


async def kill_and_measure(sock: str, name: str) -> dict[str, float]:
    before = await status(sock, name)
    killed_at = time.time()
    os.kill(before["pid"], signal.SIGKILL)
    left_at = None
    with anyio.fail_after(10):
        while True:
            record = await status(sock, name)
            if left_at is None and record["state"] != "running":
                left_at = time.time()
            if record["state"] == "running" and record["pid"] != before["pid"]:
                break
            await anyio.sleep(0.001)
    if left_at is None:  # restarted between two polls: it left running before we looked
        left_at = datetime.fromisoformat(record["last_exit"]["at"]).timestamp()
    noticed = datetime.fromisoformat(record["last_exit"]["at"]).timestamp()
    running = datetime.fromisoformat(record["since"]).timestamp()
    return {
        "noticed_ms": (noticed - killed_at) * 1000,
        "left_running_ms": (min(left_at, running) - killed_at) * 1000,
        "running_again_ms": (running - killed_at) * 1000,
    }


async def baseline(script: str) -> float:
    """An asyncio wait() pending at SIGKILL: when does it return? (ms, capped)"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SERVERS / script),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    if script == "tree.py":  # wait until the grandchild exists (tree.py spawns it before serving)
        await asyncio.sleep(0.3)
    waiter = asyncio.ensure_future(proc.wait())
    await asyncio.sleep(0.05)
    killed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    done, _ = await asyncio.wait([waiter], timeout=BASELINE_CAP)
    elapsed = (time.monotonic() - killed_at) * 1000 if done else BASELINE_CAP * 1000
    with contextlib.suppress(ProcessLookupError):  # the tree fixture's grandchild, if any
        os.killpg(proc.pid, signal.SIGKILL)
    await waiter
    return elapsed


def write_config(directory: str) -> str:
    path = Path(directory) / "bench.yaml"
    extensions = {
        name: {
            "command": sys.executable,
            "args": [str(SERVERS / script)],
            "restart": "always",
            "backoff": {"initial": 0, "jitter": 0},
            "stop_timeout": 1,
        }
        for name, script in (("plain", "quick.py"), ("tree", "tree.py"))
    }
    path.write_text(json.dumps({"socket": f"{directory}/control.sock", "extensions": extensions}))
    return str(path)


def start_daemon(config: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "supervisor", "daemon", "-c", config]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def main(kills: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="mcps-bench-", dir="/tmp")
    sock = f"{directory}/control.sock"
    daemon = start_daemon(write_config(directory))
    try:
        with anyio.fail_after(30):
            while True:
                try:
                    records = (await client.request(sock, "status"))["extensions"]
                    if all(r["state"] == "running" for r in records):
                        break
                except client.DaemonUnreachable:
                    pass
                await anyio.sleep(0.05)
        report: dict[str, Any] = {"kills": kills}
        for name, script in (("plain", "quick.py"), ("tree", "tree.py")):
            samples = [await kill_and_measure(sock, name) for _ in range(kills)]
            naive = [await baseline(script) for _ in range(min(kills, 5))]
            report[name] = {key: summary([s[key] for s in samples]) for key in samples[0]}
            report[name]["baseline_asyncio_wait_ms"] = summary(naive)
            report[name]["baseline_capped_at_ms"] = BASELINE_CAP * 1000
        return report
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    print(json.dumps(anyio.run(main, parser.parse_args().kills), indent=2))
