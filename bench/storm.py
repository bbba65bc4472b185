"""Start storm: many SDK-based extensions started at once, on however many cores this host has.

Phase one starts a daemon with N fixture servers that import the MCP SDK (``echo.py``: about
0.6 s of CPU each to start) and polls ``status`` until every one runs (or ``--within`` passes):
time to all running, restarts (total and worst), the most extensions seen ``queued`` at once,
then SIGTERM to exit. Phase two starts the same storm ``--sigterm-trials`` times and sends SIGTERM
at a random moment of it: each exit time against ``shutdown_timeout``, and whether any process of
a tree outlived the daemon. Machine load is reported beside the numbers (the load average
before and after, and how busy the host's CPUs were during phase one), since the figures mean
little without it; ``--burn K`` adds K busy-looping processes for a loaded machine on demand.

    python bench/storm.py [--extensions 60] [--start-timeout 10] [--start-slots N] [--burn 0]
                          [--within 300] [--sigterm-trials 3] [--shutdown-timeout 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import anyio
from _daemon import Running, daemon, fixture, wait_for

from supervisor.control import client
from supervisor.daemon.identity import instance_key
from supervisor.process import children as process


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [float(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


@contextlib.contextmanager
def _burners(count: int) -> Iterator[None]:
    """*count* processes that spin on a core each: other work on the machine, on demand."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _status(socket: str) -> dict[str, dict[str, Any]]:
    try:
        reply = anyio.run(lambda: client.request(socket, "status", timeout=30))
    except Exception:  # the daemon busy or not up yet: the caller polls again
        return {}
    return {record["name"]: record for record in reply["extensions"]}


def _config(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    entry = fixture(args.fixture, start_timeout=args.start_timeout)
    extensions = {f"ext{i}": entry for i in range(args.extensions)}
    settings: dict[str, Any] = {"shutdown_timeout": args.shutdown_timeout}
    if args.start_slots is not None:
        settings["start_slots"] = args.start_slots
    return extensions, settings


def _sigterm(running: Running) -> dict[str, Any]:
    """SIGTERM the daemon: seconds to exit (and to its log's milestones), exit code, processes left."""
    sent, stopping = time.time(), time.monotonic()
    running.proc.send_signal(signal.SIGTERM)
    code = running.proc.wait(timeout=600)
    took = time.monotonic() - stopping
    left = process.find_marked(f"{instance_key(running.socket)}:")
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return {
        "sigterm_to_exit_s": round(took, 2),
        **_milestones(running, sent),
        "exit_code": code,
        "processes_left": len(left),
    }


def _milestones(running: Running, sent: float) -> dict[str, float]:
    """Seconds from the SIGTERM to the daemon's shutdown events, from its JSON log."""
    wanted = {
        "daemon.shutting_down": "to_shutting_down_s",
        "daemon.shutdown_timeout": "to_shutdown_timeout_s",
        "daemon.stopped": "to_stopped_s",
    }
    found: dict[str, float] = {}
    with open(running.directory / "daemon.log", errors="replace") as log:
        for line in log:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            key = wanted.get(event.get("event", ""))
            if key and "timestamp" in event:
                moment = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                found[key] = round(moment - sent, 2)
    return found


def _keep_log(args: argparse.Namespace, running: Running, name: str) -> None:
    if args.keep_logs:
        os.makedirs(args.keep_logs, exist_ok=True)
        shutil.copy(running.directory / "daemon.log", os.path.join(args.keep_logs, f"{name}.log"))


def converge(args: argparse.Namespace) -> dict[str, Any]:
    extensions, settings = _config(args)
    names = list(extensions)
    load_before, cpu_before = _load(), _cpu_times()
    started = time.monotonic()
    most_queued, records = 0, {}
    with daemon(extensions, **settings) as running:
        deadline = started + args.within
        while time.monotonic() < deadline:
            records = _status(running.socket) or records
            most_queued = max(most_queued, sum(1 for r in records.values() if r.get("queued")))
            if len(records) == len(names) and all(r["state"] == "running" for r in records.values()):
                break
            time.sleep(0.5)
        took = time.monotonic() - started
        cpu_after = _cpu_times()
        states: dict[str, int] = {}
        for record in records.values():
            states[record["state"]] = states.get(record["state"], 0) + 1
        restarts = [r["restarts"] for r in records.values()]
        shutdown = _sigterm(running)
        _keep_log(args, running, "converge")
    busy = (cpu_after[0] - cpu_before[0]) / max(1.0, cpu_after[1] - cpu_before[1])
    return {
        "all_running": states.get("running") == len(names),
        "start_to_all_running_s": round(took, 1),
        "states": states,
        "restarts_total": sum(restarts),
        "restarts_max": max(restarts, default=0),
        "most_queued_seen": most_queued,
        "host_cpu_busy_pct": round(100 * busy, 1),
        "loadavg_before": load_before,
        "loadavg_after": _load(),
        "shutdown": shutdown,
    }


def sigterm_trials(args: argparse.Namespace, rng: random.Random) -> list[dict[str, Any]]:
    extensions, settings = _config(args)
    trials = []
    for _ in range(args.sigterm_trials):
        delay = rng.uniform(0.5, args.sigterm_window)
        with daemon(extensions, **settings) as running:
            wait_for(lambda r=running: r.proc.poll() is not None or bool(_status(r.socket)), "status")
            time.sleep(delay)
            states: dict[str, int] = {}
            for record in _status(running.socket).values():
                key = "queued" if record.get("queued") else record["state"]
                states[key] = states.get(key, 0) + 1
            shutdown = _sigterm(running)
            _keep_log(args, running, f"trial{len(trials)}")
        trials.append(
            {
                "sigterm_after_s": round(delay, 1),
                "states_at_sigterm": states,
                **shutdown,
                "loadavg": _load(),
            }
        )
    return trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extensions", type=int, default=60)
    parser.add_argument(
        "--fixture", default="echo.py", help="a server in tests/servers/ (echo.py imports the SDK)"
    )
    parser.add_argument("--start-timeout", type=float, default=10.0)
    parser.add_argument(
        "--start-slots", type=int, default=None, help="default: the daemon's (about two per core)"
    )
    parser.add_argument("--shutdown-timeout", type=float, default=30.0)
    parser.add_argument("--within", type=float, default=300.0, help="give up on phase one after this long")
    parser.add_argument("--burn", type=int, default=0, help="busy-looping processes beside the storm")
    parser.add_argument("--sigterm-trials", type=int, default=3)
    parser.add_argument("--sigterm-window", type=float, default=20.0, help="SIGTERM within this many s")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--skip-converge", action="store_true")
    parser.add_argument("--keep-logs", default=None, help="copy each daemon's log into this directory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    report: dict[str, Any] = {
        "cpus": len(os.sched_getaffinity(0)),
        "extensions": args.extensions,
        "fixture": args.fixture,
        "start_timeout": args.start_timeout,
        "start_slots": args.start_slots,
        "shutdown_timeout": args.shutdown_timeout,
        "burners": args.burn,
        "seed": seed,
    }
    with _burners(args.burn):
        if not args.skip_converge:
            report["converge"] = converge(args)
        report["sigterm_trials"] = sigterm_trials(args, random.Random(seed))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
