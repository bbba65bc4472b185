"""What open dashboards cost the daemon: its CPU with three pages' event streams open, against none.

A daemon with ten quiet extensions (quick.py) and, for the flood, one that crashes as it starts
(exit_now.py, backoff 0.05 s): a stream of state changes. Four phases per round, interleaved so
that the machine's noise falls on all of them alike:

* ``idle``: no page open; ``idle_3_pages``: three event streams open and read;
* ``flood``: the crash loop, no page; ``flood_3_pages``: the crash loop, three streams.

The daemon's own CPU (its process only, not its children) over each phase, as a share of one
core, and the events each page received per second. The goal (issue 35): three pages cost under
1% of a core while nothing changes, and a flood reaches them coalesced.

Usage: ``python bench/dashboard.py [--seconds 15] [--rounds 3]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from typing import Any

import httpx2
import psutil

from bench._daemon import BIN, Running, daemon, fixture, wait_for

PAGES = 3
QUIET = {f"quiet{i}": fixture("quick.py") for i in range(10)}
CRASHING = fixture("exit_now.py", backoff={"initial": 0.05, "max": 0.05, "jitter": 0})


def open_session(running: Running) -> tuple[str, httpx2.Client]:
    printed = subprocess.run(
        [str(BIN / "mcp-supervisor"), "dashboard", "--no-browser", "--socket", running.socket],
        capture_output=True,
        text=True,
        check=True,
    )
    url = printed.stdout.strip()
    client = httpx2.Client(timeout=30)
    assert client.get(url, follow_redirects=False).status_code == 303
    return url.split("/dashboard/")[0], client


class Page(threading.Thread):
    """One page's event stream, read until :meth:`close`; counts its events."""

    def __init__(self, base: str, client: httpx2.Client) -> None:
        super().__init__(daemon=True)
        self.base, self.client = base, client
        self.events = 0
        self.bytes = 0
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            with self.client.stream("GET", self.base + "/dashboard/events", timeout=60) as stream:
                for line in stream.iter_lines():
                    self.bytes += len(line) + 1
                    if line.startswith("event: "):
                        self.events += 1
                    if self._stop.is_set():
                        return
        except httpx2.HTTPError:  # closed under it at the phase's end
            return

    def close(self) -> None:
        self._stop.set()


def cpu_share(process: psutil.Process, seconds: float) -> float:
    before = process.cpu_times()
    time.sleep(seconds)
    after = process.cpu_times()
    return (after.user + after.system - before.user - before.system) / seconds


def phase(running: Running, *, pages: int, flood: bool, seconds: float) -> dict[str, Any]:
    process = psutil.Process(running.proc.pid)
    action = "start" if flood else "stop"
    subprocess.run(
        [str(BIN / "mcp-supervisor"), action, "crashing", "--no-wait", "--socket", running.socket],
        capture_output=True,
        check=True,
    )
    opened = []
    for _ in range(pages):
        base, client = open_session(running)
        page = Page(base, client)
        page.start()
        opened.append(page)
    time.sleep(1.0)  # the first status of each page, and the crash loop under way
    counted = [p.events for p in opened]
    share = cpu_share(process, seconds)
    rates = [(p.events - c) / seconds for p, c in zip(opened, counted, strict=True)]
    for page in opened:
        page.close()
        page.client.close()
    return {"cpu": share, "events_per_s": statistics.mean(rates) if rates else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    extensions = {**QUIET, "crashing": {**CRASHING, "autostart": False}}
    phases = ("idle", "idle_3_pages", "flood", "flood_3_pages")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in phases}
    with daemon(extensions, http=True) as running:
        wait_for(lambda: running.all_running(list(QUIET)), "the quiet extensions", within=120)
        for _ in range(args.rounds):
            results["idle"].append(phase(running, pages=0, flood=False, seconds=args.seconds))
            results["idle_3_pages"].append(phase(running, pages=PAGES, flood=False, seconds=args.seconds))
            results["flood"].append(phase(running, pages=0, flood=True, seconds=args.seconds))
            results["flood_3_pages"].append(phase(running, pages=PAGES, flood=True, seconds=args.seconds))
        restarts = running.status()["crashing"]["restarts"]

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    report = {
        "seconds_per_phase": args.seconds,
        "rounds": args.rounds,
        "cpu_share_of_a_core": {name: round(median(name, "cpu"), 4) for name in results},
        "three_pages_cost_idle": round(median("idle_3_pages", "cpu") - median("idle", "cpu"), 4),
        "three_pages_cost_flood": round(median("flood_3_pages", "cpu") - median("flood", "cpu"), 4),
        "events_per_page_per_s": {
            "idle": round(median("idle_3_pages", "events_per_s"), 2),
            "flood": round(median("flood_3_pages", "events_per_s"), 2),
        },
        "crash_loop_restarts": restarts,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
