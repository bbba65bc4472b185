"""Hostile soak: every attack on the listeners at once, while honest clients keep calling.

A real daemon (one echo extension, the HTTP listener on with a token) is attacked for the whole
run by: half-open HTTP connections (half a request line, then nothing), slow headers (a byte a
second), slow 60 MiB bodies (1 MiB a second), pipelining floods (2,000 requests sent ahead of
their answers in one write), a session flood (``initialize`` and never again) and a token-less
flood. Meanwhile honest clients call ``echo`` in a loop: some through
``mcp.sock`` (the SDK's ClientSession over ``mcp-supervisor connect``), some over HTTP with the
token. The daemon's fds, RSS and tasks are sampled throughout; after the attacks stop, the time
until its fds are back near their baseline is the time to recover.

Goals (issue 17): 0 honest errors, RSS under 200 MiB, fds under 512, honest p99 under 100 ms.
Prints JSON; exits 1 when an honest call failed or a bound was broken (``--check``).

    python bench/hostile.py [--seconds 60] [--unix 4] [--http 4] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import anyio
import httpx2
import psutil
from _daemon import BIN, daemon, fixture, wait_for
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from supervisor.control import client as control

TOKEN = "hostile-bench-token-0123456789"
GOALS = {"rss_mib": 200, "fds": 512, "p99_ms": 100}
_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "x", "version": "1"},
    },
}
_MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class Tally:
    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {"unix": [], "http": []}
        self.errors: dict[str, list[str]] = {"unix": [], "http": []}
        self.attacks: dict[str, int] = {}

    def count(self, key: str) -> None:
        self.attacks[key] = self.attacks.get(key, 0) + 1


# ---- honest clients -------------------------------------------------------------------------


async def _calls(kind: str, session: ClientSession, until: float, tally: Tally) -> None:
    """Honest calls until *until*, one at least: on a loaded machine a client may take the whole
    window to connect, and what the soak asks is whether its calls fail."""
    while True:
        started = time.perf_counter()
        try:
            with anyio.fail_after(15):
                result = await session.call_tool("echo__echo", {"text": "honest"})
            if result.is_error:
                tally.errors[kind].append(str(result.content)[:200])
            else:
                tally.latencies[kind].append(time.perf_counter() - started)
        except Exception as exc:  # every failure of an honest call is the finding
            tally.errors[kind].append(f"{type(exc).__name__}: {str(exc)[:200]}")
        if time.monotonic() >= until:
            return
        await anyio.sleep(0.02)


async def _honest_unix(socket: str, until: float, tally: Tally) -> None:
    params = StdioServerParameters(
        command=str(BIN / "mcp-supervisor"), args=["connect", "--socket", socket], env=dict(os.environ)
    )
    with open(os.devnull, "w") as quiet:  # noqa: ASYNC230 - once per client
        async with stdio_client(params, errlog=quiet) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await _calls("unix", session, until, tally)


async def _honest_http(url: str, until: float, tally: Tally) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write, *_),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await _calls("http", session, until, tally)


# ---- attackers ------------------------------------------------------------------------------


async def _held(
    port: int, until: float, tally: Tally, kind: str, first: bytes, drip: bytes, every: float
) -> None:
    """One attacking connection after another: *first*, then *drip* every *every* s until closed."""
    while time.monotonic() < until:
        try:
            stream = await anyio.connect_tcp("127.0.0.1", port)
        except OSError:
            tally.count(f"{kind}_refused")
            await anyio.sleep(0.1)
            continue
        tally.count(kind)
        async with stream:
            with anyio.move_on_after(max(0.0, until - time.monotonic())):
                try:
                    await stream.send(first)
                    while True:
                        with anyio.move_on_after(every):
                            if not await stream.receive():
                                break
                            tally.count(f"{kind}_answered")
                            break
                        if drip:
                            await stream.send(drip)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    pass


async def _flood(url: str, until: float, tally: Tally, kind: str, per_second: float, token: bool) -> None:
    headers = {**_MCP_HEADERS, **({"Authorization": f"Bearer {TOKEN}"} if token else {})}
    async with httpx2.AsyncClient(timeout=10) as http:
        while time.monotonic() < until:
            try:
                answer = await http.post(url, content=json.dumps(_INIT).encode(), headers=headers)
                tally.count(f"{kind}_{answer.status_code}")
            except httpx2.HTTPError:
                tally.count(f"{kind}_failed")
            await anyio.sleep(1 / per_second)


# ---- the daemon, watched --------------------------------------------------------------------


def _sample(pid: int) -> tuple[int, int]:
    process = psutil.Process(pid)
    return process.num_fds(), process.memory_info().rss


async def _watch(pid: int, socket: str, until: float, peaks: dict[str, int]) -> None:
    async with control.Client(socket) as daemon:
        while time.monotonic() < until:
            fds, rss = _sample(pid)
            peaks["fds"], peaks["rss"] = max(peaks["fds"], fds), max(peaks["rss"], rss)
            health = await daemon.request("health", timeout=10)
            peaks["tasks"] = max(peaks["tasks"], health["process"]["asyncio_tasks"])
            await anyio.sleep(0.25)


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1000, 1)


async def soak(seconds: float, unix: int, http: int, *, scale: float = 1.0) -> dict[str, Any]:
    """Run the attacks for *seconds* against a fresh daemon; *scale* shrinks the attackers' numbers."""
    tally = Tally()
    with daemon(
        {"echo": fixture("echo.py")},
        http=True,
        gateway={"http": {"enabled": True, "port": 0, "token": TOKEN}},
    ) as running:
        wait_for(lambda: running.all_running(["echo"]), "the echo extension")
        log = running.directory / "daemon.log"
        wait_for(lambda: "gateway.http_listening" in log.read_text(), "the HTTP listener")
        url = next(
            json.loads(line)["url"]
            for line in log.read_text().splitlines()
            if "gateway.http_listening" in line
        )
        pid = running.proc.pid
        baseline_fds, baseline_rss = _sample(pid)
        peaks = {"fds": baseline_fds, "rss": baseline_rss, "tasks": 0}
        started = time.monotonic()
        until = started + seconds
        command = [
            sys.executable,
            __file__,
            "--attack",
            url,
            "--seconds",
            str(seconds),
            "--scale",
            str(scale),
        ]

        async def attack() -> None:  # a process of its own: its CPU is not the honest clients' loop
            tally.attacks = json.loads((await anyio.run_process(command)).stdout)

        cpu_before = psutil.Process(pid).cpu_times()
        async with anyio.create_task_group() as tg:
            tg.start_soon(attack)
            tg.start_soon(_watch, pid, running.socket, until, peaks)
            await anyio.sleep(min(2.0, seconds / 4))  # the attacks are under way first
            for _ in range(unix):
                tg.start_soon(_honest_unix, running.socket, until, tally)
            for _ in range(http):
                tg.start_soon(_honest_http, url, until, tally)
        cpu_after = psutil.Process(pid).cpu_times()
        ended = time.monotonic()
        recover = wait_for(
            lambda: _sample(pid)[0] <= baseline_fds + 16, "the daemon's fds to settle", within=90
        )
        load = os.getloadavg()
    latencies = tally.latencies["unix"] + tally.latencies["http"]
    report = {
        "seconds": round(ended - started, 1),
        "load_average": [round(x, 2) for x in load],
        "honest": {
            kind: {
                "calls": len(tally.latencies[kind]) + len(tally.errors[kind]),
                "errors": len(tally.errors[kind]),
                "first_errors": tally.errors[kind][:3],
                "p50_ms": _percentile(tally.latencies[kind], 0.5),
                "p99_ms": _percentile(tally.latencies[kind], 0.99),
            }
            for kind in ("unix", "http")
        },
        "honest_p99_ms": _percentile(latencies, 0.99),
        "daemon": {
            "baseline_fds": baseline_fds,
            "peak_fds": peaks["fds"],
            "baseline_rss_mib": round(baseline_rss / 2**20, 1),
            "peak_rss_mib": round(peaks["rss"] / 2**20, 1),
            "peak_tasks": peaks["tasks"],
            "recover_seconds": round(recover, 2),
            "cpu_share": round(
                (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / (ended - started),
                2,
            ),
        },
        "attacks": dict(sorted(tally.attacks.items())),
    }
    report["goals"] = {
        "no_honest_errors": sum(v["errors"] for v in report["honest"].values()) == 0,
        "rss_under_200_mib": report["daemon"]["peak_rss_mib"] < GOALS["rss_mib"],
        "fds_under_512": report["daemon"]["peak_fds"] < GOALS["fds"],
        "p99_under_100_ms": (report["honest_p99_ms"] or 0) < GOALS["p99_ms"],
    }
    return report


async def attack(url: str, seconds: float, scale: float) -> dict[str, int]:
    """Every attacker at once against *url* for *seconds* (run in a process of its own)."""
    tally = Tally()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    until = time.monotonic() + seconds
    body_head = (
        f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {TOKEN}\r\n"
        f"content-type: application/json\r\ncontent-length: {60 << 20}\r\n\r\n"
    ).encode()
    ahead = (
        f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {TOKEN}\r\n"
        "content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
        "mcp-session-id: none\r\ncontent-length: 2\r\n\r\n{}"
    ).encode() * 2000
    async with anyio.create_task_group() as tg:
        for _ in range(int(4 * scale)):
            tg.start_soon(_held, port, until, tally, "pipelined", ahead, b"", 3600)
        for _ in range(int(300 * scale)):
            tg.start_soon(_held, port, until, tally, "half_open", b"POST /mcp HTTP/1.1\r\n", b"", 3600)
        for _ in range(int(50 * scale)):
            tg.start_soon(_held, port, until, tally, "slow_headers", b"P", b"O", 1.0)
        for _ in range(int(10 * scale)):
            tg.start_soon(_held, port, until, tally, "slow_body", body_head, b"{" * (1 << 20), 1.0)
        if scale > 0:
            tg.start_soon(_flood, url, until, tally, "session_flood", 50 * scale, True)
            tg.start_soon(_flood, url, until, tally, "tokenless_flood", 100 * scale, False)
    return dict(sorted(tally.attacks.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--unix", type=int, default=4)
    parser.add_argument("--http", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the attackers (the test uses 0.3)")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless no honest call failed and bounds held"
    )
    parser.add_argument("--attack", metavar="URL", help=argparse.SUPPRESS)  # the attackers' own process
    args = parser.parse_args()
    if args.attack:
        print(json.dumps(anyio.run(attack, args.attack, args.seconds, args.scale)))
        sys.exit(0)
    result = anyio.run(lambda: soak(args.seconds, args.unix, args.http, scale=args.scale))
    print(json.dumps(result, indent=2))
    bounds = ("no_honest_errors", "rss_under_200_mib", "fds_under_512")
    sys.exit(1 if args.check and not all(result["goals"][goal] for goal in bounds) else 0)
