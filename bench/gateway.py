"""Gateway overhead: echo-call latency and throughput through the daemon against a direct session.

Four ways to call the ``echo`` tool of ``tests/servers/echo.py``, in one run:

  direct   the SDK's stdio_client + ClientSession spawning the fixture (what a client does today)
  socket   the same ClientSession on the daemon's ``mcp.sock`` itself: the daemon's share alone
  connect  the same client code spawning ``mcp-supervisor connect`` to a daemon supervising it
  http     the SDK's streamable-HTTP client to the daemon's ``/mcp``
  proxy    the same HTTP client to ``mcp-proxy`` (PyPI) in front of the fixture, installed for this
           benchmark only, in bench/.venv-mcp-proxy

Latency: median and p99 of N sequential calls on one session (after a warm-up), and the CPU
time each process on the path spent per call meanwhile (``cpu_us``: this client, ``connect``, the
daemon, the fixture). Throughput: 8 clients calling at once (direct: 8 sessions, 8 fixture
processes; the others: 8 sessions sharing one supervised fixture). Prints JSON, with each
figure's ratio to ``direct``.

    python bench/gateway.py [--calls 2000] [--clients 8] [--skip-proxy]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import psutil
from _daemon import BIN, ROOT, SERVERS, daemon, fixture, free_port, wait_for
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(ROOT))  # the test suite's client for mcp.sock
from tests.gateway_client import unix_transport

FIXTURE = str(SERVERS / "echo.py")
PROXY_VENV = ROOT / "bench" / ".venv-mcp-proxy"
PROXY_VERSION = "0.13.0"

_QUIET = open(os.devnull, "w")  # noqa: SIM115 - the children's stderr, for the whole run

Opener = Callable[[], AbstractAsyncContextManager[ClientSession]]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@asynccontextmanager
async def _stdio(command: str, *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=command, args=list(args), env={**os.environ})
    async with stdio_client(params, errlog=_QUIET) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def _http(url: str) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def _unix(path: str) -> AsyncIterator[ClientSession]:
    """A ClientSession on a unix socket speaking JSON lines (the daemon's mcp.sock)."""
    async with unix_transport(path) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _path_processes(daemon_pid: int | None) -> dict[str, psutil.Process]:
    """The processes on a call's path: this client, its connect (if any), the daemon, the fixture."""
    me = psutil.Process()
    found = {"client": me}
    for child in me.children(recursive=True):
        line = " ".join(child.cmdline())
        if " connect " in f"{line} ":
            found["connect"] = child
        elif FIXTURE in line and daemon_pid is None:
            found["fixture"] = child
    if daemon_pid is not None:
        found["daemon"] = supervisor = psutil.Process(daemon_pid)
        found.update(
            ("fixture", child)
            for child in supervisor.children(recursive=True)
            if FIXTURE in " ".join(child.cmdline())
        )
    return found


def _cpu(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}


async def _latency(open_session: Opener, tool: str, calls: int, daemon_pid: int | None) -> dict[str, Any]:
    async with open_session() as session:
        for _ in range(50):
            await session.call_tool(tool, {"text": "warm"})
        processes = _path_processes(daemon_pid)
        before = _cpu(processes)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await session.call_tool(tool, {"text": "ping"})
            times.append(time.perf_counter() - started)
        after = _cpu(processes)
    times.sort()
    return {
        "median_ms": round(statistics.median(times) * 1000, 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1] * 1000, 3),
        "cpu_us": {name: round((after[name] - before[name]) / calls * 1e6) for name in processes},
    }


async def _throughput(open_session: Opener, tool: str, clients: int, calls_each: int) -> float:
    sessions: list[ClientSession] = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(clients):
            sessions.append(await stack.enter_async_context(open_session()))
        for session in sessions:
            await session.call_tool(tool, {"text": "warm"})

        async def client(session: ClientSession) -> None:
            for _ in range(calls_each):
                await session.call_tool(tool, {"text": "ping"})

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(client, session)
        elapsed = time.perf_counter() - started
    return round(clients * calls_each / elapsed, 1)


def _install_proxy() -> Path:
    exe = PROXY_VENV / "bin" / "mcp-proxy"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PROXY_VENV)], check=True)
        pip = [str(PROXY_VENV / "bin" / "pip"), "install", "--quiet", f"mcp-proxy=={PROXY_VERSION}"]
        subprocess.run(pip, check=True)
    return exe


@contextlib.contextmanager
def _proxy() -> Any:
    exe = _install_proxy()
    port = free_port()
    with open(os.devnull, "wb") as quiet:
        proc = subprocess.Popen(
            [str(exe), "--port", str(port), "--", sys.executable, FIXTURE], stdout=quiet, stderr=quiet
        )
    try:
        wait_for(lambda: _listening(port), "mcp-proxy to listen")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _measure(
    name: str, open_session: Opener, tool: str, args: argparse.Namespace, daemon_pid: int | None = None
) -> dict[str, Any]:
    latency = await _latency(open_session, tool, args.calls, daemon_pid)
    throughput = await _throughput(open_session, tool, args.clients, args.calls // args.clients)
    print(f"bench: {name}: {latency} {throughput} calls/s", file=sys.stderr)
    return {**latency, "throughput_cps": throughput}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    results["direct"] = await _measure("direct", lambda: _stdio(sys.executable, FIXTURE), "echo", args)
    with daemon({"fx": fixture("echo.py")}, http=True) as running:
        wait_for(lambda: running.all_running(["fx"]), "the daemon's fixture to run")
        connect = [str(BIN / "mcp-supervisor"), "connect", "--socket", running.socket]
        sock = str(Path(running.socket).parent / "mcp.sock")
        url = running.http_url or ""
        pid = running.proc.pid
        results["socket"] = await _measure("socket", lambda: _unix(sock), "fx__echo", args, pid)
        results["connect"] = await _measure("connect", lambda: _stdio(*connect), "fx__echo", args, pid)
        results["http"] = await _measure("http", lambda: _http(url), "fx__echo", args, pid)
    if not args.skip_proxy:
        with _proxy() as url:
            results["proxy"] = await _measure("proxy", lambda: _http(url), "echo", args)
    base = results["direct"]
    for figures in results.values():
        figures["median_ratio"] = round(figures["median_ms"] / base["median_ms"], 2)
        figures["throughput_ratio"] = round(figures["throughput_cps"] / base["throughput_cps"], 2)
    return {
        "calls": args.calls,
        "clients": args.clients,
        "python": sys.version.split()[0],
        "results": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--skip-proxy", action="store_true", help="do not install and measure mcp-proxy")
    report = anyio.run(main, parser.parse_args())
    print(json.dumps(report, indent=2))
    shutil.rmtree(ROOT / "bench" / "__pycache__", ignore_errors=True)
