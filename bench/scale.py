"""Scale: one daemon with 100 extensions, measured as an operator would see it.

Reports the time from daemon start to every extension running, ``status`` latency (median and
p99 over N requests on the control socket), the daemon's RSS and that of all children, the
daemon's context switches while idle for a while (a supervisor that polls shows up here), and
SIGTERM to exit. JSON out.

    python bench/scale.py [--extensions 100] [--idle 30] [--status-calls 200]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from typing import Any

import anyio
import psutil
from _daemon import daemon, fixture, wait_for

from supervisor import client


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extensions", type=int, default=100)
    parser.add_argument("--idle", type=float, default=30)
    parser.add_argument("--status-calls", type=int, default=200)
    print(json.dumps(main(parser.parse_args()), indent=2))
