"""Scale: one daemon with 100 extensions, measured as an operator would see it.

Reports the time from daemon start to every extension running, ``status`` latency (median and
p99 over N requests on the control socket), the daemon's RSS and that of all children, the
daemon's context switches while idle for a while (a supervisor that polls shows up here), and
SIGTERM to exit. JSON out.

With ``--on-demand``: 100 ``on_demand`` extensions with ``idle_stop``. A first daemon learns and
saves their listings; a second one starts from the saved catalogs: start to ready (every one
idle on demand), then the RSS of the daemon's tree and of the host before and after one call
to each, and after the idle stop.

    python bench/scale.py [--extensions 100] [--idle 30] [--status-calls 200]
    python bench/scale.py --on-demand [--extensions 100] [--idle-stop 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from typing import Any

import anyio
import psutil
from _daemon import daemon, fixture, wait_for

from supervisor.control import client


async def _status_latency(socket: str, calls: int) -> dict[str, float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await client.request(socket, "status")
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p99_ms": round(times[max(0, int(len(times) * 0.99) - 1)] * 1000, 2),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"ext{i}" for i in range(args.extensions)]
    extensions = {name: fixture("quick.py") for name in names}
    started = time.monotonic()
    with daemon(extensions, shutdown_timeout=60) as running:
        ready = wait_for(
            lambda: running.all_running(names), "every extension to run", within=300, interval=0.2
        )
        to_running = time.monotonic() - started
        status = anyio.run(_status_latency, running.socket, args.status_calls)
        me = psutil.Process(running.proc.pid)
        children = me.children(recursive=True)
        rss = me.memory_info().rss
        children_rss = sum(child.memory_info().rss for child in children if child.is_running())
        switches = sum(me.num_ctx_switches())
        time.sleep(args.idle)  # the measurement is what the daemon does while nothing happens
        idle_switches = sum(me.num_ctx_switches()) - switches
        stopping = time.monotonic()
        running.proc.send_signal(signal.SIGTERM)
        exit_code = running.proc.wait(timeout=120)
        sigterm_to_exit = time.monotonic() - stopping
    return {
        "extensions": args.extensions,
        "start_to_all_running_s": round(to_running, 2),
        "polled_for_s": round(ready, 2),
        "status": status,
        "daemon_rss_mib": round(rss / 2**20, 1),
        "children": len(children),
        "children_rss_mib": round(children_rss / 2**20, 1),
        "idle_seconds": args.idle,
        "idle_context_switches": idle_switches,
        "idle_context_switches_per_s": round(idle_switches / args.idle, 2),
        "sigterm_to_exit_s": round(sigterm_to_exit, 2),
        "exit_code": exit_code,
    }


def _tree_rss_mib(pid: int) -> float:
    """The daemon and all its descendants."""
    me = psutil.Process(pid)
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return round(total / 2**20, 1)


def _extension_processes(pid: int) -> list[psutil.Process]:
    """The daemon's descendants that are extensions (not its containment guardian)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if any("quick.py" in part for part in child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _host_used_mib() -> float:
    return round(psutil.virtual_memory().used / 2**20, 1)


async def _call_each(socket: str, names: list[str]) -> float:
    started = time.monotonic()
    clients = anyio.CapacityLimiter(16)  # the control socket keeps a bounded number of connections

    async def call(name: str) -> None:
        async with clients:
            params = {"name": name, "tool": "echo", "arguments": {"text": name}}
            await client.request(socket, "call", params, timeout=120)

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(call, name)
    return time.monotonic() - started


def on_demand(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"ext{i}" for i in range(args.extensions)]
    entry = fixture("quick.py", on_demand=True, idle_stop=args.idle_stop)
    extensions = {name: entry for name in names}
    with tempfile.TemporaryDirectory(prefix="mcps-od-", dir="/tmp") as tmp:
        os.environ["STATE_DIRECTORY"] = f"{tmp}/state"  # the daemons inherit it: catalogs go there
        socket = f"{tmp}/control.sock"  # the same socket twice: the second daemon finds the catalogs

        def all_idle(running: Any) -> bool:
            status = running.status()
            return all(status.get(name, {}).get("detail") == "on demand" for name in names)

        started = time.monotonic()
        with daemon(extensions, socket=socket, shutdown_timeout=60) as running:
            wait_for(lambda: all_idle(running), "every listing learned", within=600, interval=0.2)
            learned = time.monotonic() - started
        started = time.monotonic()
        with daemon(extensions, socket=socket, shutdown_timeout=60) as running:
            wait_for(lambda: all_idle(running), "every extension idle on demand", within=120, interval=0.05)
            ready = time.monotonic() - started
            pid = running.proc.pid
            before = (_tree_rss_mib(pid), _host_used_mib())
            calls = anyio.run(_call_each, running.socket, names)
            after_calls = (_tree_rss_mib(pid), _host_used_mib())
            stopping = time.monotonic()
            wait_for(lambda: all_idle(running), "every idle stop", within=args.idle_stop + 120, interval=0.2)
            idle_stopped = time.monotonic() - stopping
            wait_for(lambda: not _extension_processes(pid), "the trees gone", within=60)
            after_idle = (_tree_rss_mib(pid), _host_used_mib())
    return {
        "extensions": args.extensions,
        "idle_stop_s": args.idle_stop,
        "first_start_learned_all_s": round(learned, 2),
        "start_to_ready_from_saved_catalogs_s": round(ready, 2),
        "first_calls_all_answered_s": round(calls, 2),
        "all_idle_stopped_after_calls_s": round(idle_stopped, 2),
        "tree_rss_mib": {
            "before_calls": before[0],
            "after_calls": after_calls[0],
            "after_idle_stop": after_idle[0],
        },
        "host_used_mib": {
            "before_calls": before[1],
            "after_calls": after_calls[1],
            "after_idle_stop": after_idle[1],
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extensions", type=int, default=100)
    parser.add_argument("--idle", type=float, default=30)
    parser.add_argument("--status-calls", type=int, default=200)
    parser.add_argument("--on-demand", action="store_true", help="100 on-demand extensions instead")
    parser.add_argument("--idle-stop", type=float, default=5)
    parsed = parser.parse_args()
    print(json.dumps(on_demand(parsed) if parsed.on_demand else main(parsed), indent=2))
