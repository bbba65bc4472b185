"""The daemon's own cost per plain tool call, against a bare relay server, without an SDK client.

``bench/gateway.py`` measures every way with the SDK's client, whose own work (about 0.4 ms of
CPU per call) and pauses blur what one hop costs. Here one raw JSON-lines client calls the
``echo`` tool of ``tests/servers/echo.py`` in two ways, in interleaved rounds:

  daemon  the daemon's ``mcp.sock`` (the fast path: what ``connect`` carries)
  relay   ``bench/_relay.py serve``: a bare byte relay server spawning the same fixture

and reports, per way, the CPU the server process spent per call (user and system, from its
rusage) and the median round trip, then the ratio of the daemon's CPU to the relay's. Prints JSON.

    python bench/hop.py [--calls 2000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil
from _daemon import SERVERS, daemon, fixture, wait_for

FIXTURE = str(SERVERS / "echo.py")
RELAY = str(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_relay.py"))


class _Client:
    """One session on a unix socket, speaking JSON lines: initialize, list tools, then calls."""

    def __init__(self, path: str, tool: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.settimeout(30)
        self.reader = self.sock.makefile("rb")
        info = {"name": "bench", "version": "0"}
        self.request("initialize", protocolVersion="2025-06-18", capabilities={}, clientInfo=info)
        self.sock.sendall(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.request("tools/list")  # opens the daemon's fast path
        call = {"name": tool, "arguments": {"text": "ping"}}
        self.call_line = json.dumps(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
        ).encode()
        self.call_line += b"\n"

    def request(self, method: str, **params: Any) -> dict[str, Any]:
        self.sock.sendall(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\n"
        )
        return json.loads(self.reader.readline())

    def calls(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            self.sock.sendall(self.call_line)
            answer = self.reader.readline()
            times.append(time.perf_counter() - started)
        if b'"result"' not in answer:
            raise SystemExit(f"bench: the call failed: {answer[:300]!r}")
        return times


def _round(client: _Client, server: psutil.Process, calls: int) -> tuple[float, float, float]:
    before = server.cpu_times()
    times = client.calls(calls)
    after = server.cpu_times()
    return (
        (after.user - before.user) / calls,
        (after.system - before.system) / calls,
        statistics.median(times),
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    with daemon({"echo": fixture("echo.py")}) as running:
        relay_path = str(running.directory / "relay.sock")
        relay = subprocess.Popen([sys.executable, RELAY, "serve", relay_path, sys.executable, FIXTURE])
        try:
            wait_for(lambda: running.all_running(["echo"]) and os.path.exists(relay_path), "both servers")
            ways = {
                "daemon": (
                    _Client(str(running.directory / "mcp.sock"), "echo__echo"),
                    psutil.Process(running.proc.pid),
                ),
                "relay": (_Client(relay_path, "echo"), psutil.Process(relay.pid)),
            }
            for client, _ in ways.values():
                client.calls(300)  # warm: the fixture's first calls, the daemon's route cache
            rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
            for round_ in range(args.rounds):
                order = list(ways) if round_ % 2 else list(ways)[::-1]
                for name in order:
                    rounds[name].append(_round(*ways[name], args.calls))
        finally:
            relay.terminate()
            relay.wait(timeout=30)
    results = {}
    for name, figures in rounds.items():
        cpu = [user + system for user, system, _ in figures]
        results[name] = {
            "cpu_us": round(statistics.median(cpu) * 1e6),
            "cpu_us_rounds": [round(c * 1e6) for c in cpu],
            "user_us": round(statistics.median(f[0] for f in figures) * 1e6),
            "system_us": round(statistics.median(f[1] for f in figures) * 1e6),
            "median_us": round(statistics.median(f[2] for f in figures) * 1e6),
        }
    return {
        "calls": args.calls,
        "rounds": args.rounds,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
        "cpu_ratio": round(results["daemon"]["cpu_us"] / max(results["relay"]["cpu_us"], 1), 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    print(json.dumps(main(parser.parse_args()), indent=2))
