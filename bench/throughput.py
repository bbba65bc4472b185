"""Eight clients at once: calls per second, and the CPU each process spends per call.

``bench/gateway.py`` times a burst of calls per round; this runs each way for a few seconds
with every client calling at once, and reads the CPU time of every process on the path
before and after, to say where a throughput ratio comes from. Ways (the ``echo`` tool of
``tests/servers/echo.py``, each client its own session):

  direct    the SDK's stdio_client spawning the fixture: 8 clients, 8 fixtures
  floor1    the same through a bare byte relay on asyncio (``_relay.py hop``)
  floor1uv  the same relay on uvloop, the daemon's loop
  own       ``mcp-supervisor connect`` to an extension with ``instances: per-client``
  shared    ``mcp-supervisor connect`` to a shared extension: 8 clients, one fixture

Every way runs once per round, in a rotating order; a ratio is the median over rounds of
that round's ratio to ``direct``. ``cpu_us`` is CPU time per call, summed by kind of process
(``client`` is this process, where the 8 sessions run); ``idle`` is the share of both cores
left idle. Prints JSON.

    python bench/throughput.py [--seconds 6] [--rounds 3] [--clients 8] [--skip WAY ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import psutil
from _daemon import BIN, ROOT, daemon, fixture, wait_for
from gateway import _stdio, _throughput

FIXTURE = str(ROOT / "tests" / "servers" / "echo.py")
RELAY = str(ROOT / "bench" / "_relay.py")
WAYS = ("direct", "floor1", "floor1uv", "own", "shared")


def _kind(proc: psutil.Process, daemon_pid: int) -> str:
    if proc.pid == daemon_pid:
        return "daemon"  # idle on the ways that do not cross it
    line = " ".join(proc.cmdline())
    if "_relay.py" in line:
        return "relay"
    return "fixture" if "echo.py" in line else "connect" if " connect " in line else "other"


def _cpu(procs: list[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        seconds[proc.pid] = times.user + times.system
    return seconds


class _Window:
    """The CPU time of this process and its children, and the cores' idle time, across the
    counted seconds (entered around them by :func:`gateway._throughput`)."""

    def __init__(self, daemon_pid: int) -> None:
        self._daemon_pid = daemon_pid
        self.cpu: dict[str, float] = {}
        self.idle = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        kinds = {p.pid: "client" if p is me else _kind(p, self._daemon_pid) for p in procs}
        before, idle_before = _cpu(procs), psutil.cpu_times().idle
        yield
        after, self.idle = _cpu(procs), psutil.cpu_times().idle - idle_before
        for pid, seconds in after.items():
            kind = kinds[pid]
            self.cpu[kind] = self.cpu.get(kind, 0.0) + seconds - before.get(pid, seconds)


async def _run(
    command: list[str], tool: str, env: dict[str, str], args: argparse.Namespace, daemon_pid: int
) -> dict[str, Any]:
    window = _Window(daemon_pid)
    calls, elapsed = await _throughput(
        lambda: _stdio(*command, env=env), tool, args.clients, args.seconds, window
    )
    return {
        "calls_per_s": round(calls / elapsed, 1),
        "cpu_us": {
            kind: round(seconds / calls * 1e6) for kind, seconds in sorted(window.cpu.items()) if seconds
        },
        "idle": round(window.idle / elapsed / psutil.cpu_count(), 3),
    }


def _summary(runs: list[dict[str, Any]], direct: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [run["calls_per_s"] / base["calls_per_s"] for run, base in zip(runs, direct, strict=True)]
    kinds = {kind for run in runs for kind in run["cpu_us"]}
    return {
        "calls_per_s": statistics.median(run["calls_per_s"] for run in runs),
        "ratio": round(statistics.median(ratios), 2),
        "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        "cpu_us": {k: statistics.median(run["cpu_us"].get(k, 0) for run in runs) for k in sorted(kinds)},
        "idle": statistics.median(run["idle"] for run in runs),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    ways = [way for way in WAYS if way == "direct" or way not in args.skip]
    python = sys.executable
    load_before = os.getloadavg()
    extensions = {
        "fx": fixture("echo.py"),
        "own": fixture("echo.py", instances="per-client", max_instances=4 * args.clients),
    }
    with daemon(extensions) as running:
        wait_for(lambda: running.all_running(["fx", "own"]), "the daemon's fixtures to run")
        connect = [str(BIN / "mcp-supervisor"), "connect", "--socket", running.socket]
        plain, on_uvloop = dict(os.environ), {**os.environ, "RELAY_LOOP": "uvloop"}
        routes: dict[str, tuple[list[str], str, dict[str, str]]] = {
            "direct": ([python, FIXTURE], "echo", plain),
            "floor1": ([python, RELAY, "hop", python, FIXTURE], "echo", plain),
            "floor1uv": ([python, RELAY, "hop", python, FIXTURE], "echo", on_uvloop),
            "own": (connect, "own__echo", plain),
            "shared": (connect, "fx__echo", plain),
        }
        results: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
        for round_ in range(args.rounds):
            for way in ways[round_ % len(ways) :] + ways[: round_ % len(ways)]:
                command, tool, env = routes[way]
                results[way].append(anyio.run(_run, command, tool, env, args, running.proc.pid))
            print(f"throughput: round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    return {
        "seconds": args.seconds,
        "rounds": args.rounds,
        "clients": args.clients,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "results": {way: _summary(runs, results["direct"]) for way, runs in results.items()},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="counted seconds per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--skip", action="append", default=[], choices=WAYS[1:], metavar="WAY")
    print(json.dumps(main(parser.parse_args()), indent=2))
