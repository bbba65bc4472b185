"""A remote extension's cost: a call through the gateway against the same client talking to the
remote server directly, and a fresh daemon's first full ``tools/list`` with a remote extension.

The remote server is ``tests/servers/remote.py`` (the SDK's own, streamable HTTP on loopback).

  direct   the SDK's streamable-HTTP client + ClientSession to the server itself
  gateway  the same client code on the daemon's ``mcp.sock``, to an extension with that ``url``
           (the daemon's own session to the server: one hop more)

Latency: N sequential ``echo`` calls per way on one session each, in interleaved rounds (each
way once per round, alternating which goes first), so the machine's slow spells fall on both:
the median and p90 of all calls, and the median over rounds of each round's ratio to
``direct`` (the issue's goal: at most 1.2x). ``first_list``: a fresh daemon with one remote
and one stdio extension (``quick.py``), from its launch to a client's first ``tools/list``
holding both, median of ``--starts`` launches. Prints JSON.

Usage: ``python bench/remote.py [--rounds 10] [--calls 200] [--starts 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from _daemon import ROOT, SERVERS, daemon, fixture, wait_for
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(ROOT))  # the test suite's client for mcp.sock
from tests.harness.gateway_client import unix_transport


@asynccontextmanager
async def _direct(url: str) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def _gateway(socket: str) -> AsyncIterator[ClientSession]:
    async with unix_transport(socket) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _calls(session: ClientSession, tool: str, calls: int) -> list[float]:
    took = []
    for n in range(calls):
        started = time.perf_counter()
        await session.call_tool(tool, {"text": str(n)})
        took.append(time.perf_counter() - started)
    return took


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered) * 1000, 3),
        "p90": round(ordered[int(len(ordered) * 0.9)] * 1000, 3),
    }


async def latency(url: str, socket: str, rounds: int, calls: int) -> dict[str, Any]:
    direct: list[float] = []
    gateway: list[float] = []
    ratios: list[float] = []
    async with _direct(url) as near, _gateway(socket) as far:
        await _calls(near, "echo", 20)  # warm both
        await _calls(far, "remote__echo", 20)
        for n in range(rounds):
            order = [(near, "echo", direct), (far, "remote__echo", gateway)]
            for session, tool, into in order if n % 2 == 0 else reversed(order):
                took = await _calls(session, tool, calls)
                into += took
            ratios.append(statistics.median(gateway[-calls:]) / statistics.median(direct[-calls:]))
    return {
        "direct_ms": _ms(direct),
        "gateway_ms": _ms(gateway),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def first_list(url: str, starts: int) -> dict[str, Any]:
    extensions = {"remote": {"url": url}, "local": fixture("quick.py")}
    took = []
    for _ in range(starts):
        started = time.monotonic()
        with daemon(extensions) as running:

            def both() -> bool:
                try:
                    names = anyio.run(_names, str(Path(running.socket).with_name("mcp.sock")))
                except Exception:
                    return False
                return any(n.startswith("remote__") for n in names) and any(
                    n.startswith("local__") for n in names
                )

            wait_for(both, "both extensions listed", within=60, interval=0.02)
            took.append(time.monotonic() - started)
    return {"median_s": round(statistics.median(took), 3), "all_s": [round(t, 3) for t in took]}


async def _names(socket: str) -> list[str]:
    async with _gateway(socket) as session:
        return [tool.name for tool in (await session.list_tools()).tools]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, str(SERVERS / "remote.py"), "http"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        with daemon({"remote": {"url": url}}) as running:
            wait_for(lambda: running.all_running(["remote"]), "the remote extension")
            socket = str(Path(running.socket).with_name("mcp.sock"))
            result = {"latency": anyio.run(latency, url, socket, args.rounds, args.calls)}
        result["first_list"] = first_list(url, args.starts)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
