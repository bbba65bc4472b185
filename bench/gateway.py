"""Gateway overhead: echo-call latency and throughput through the daemon against a direct session.

Ways to call the ``echo`` tool of ``tests/servers/echo.py``, in one run:

  direct   the SDK's stdio_client + ClientSession spawning the fixture (what a client does today)
  floor1   the same client spawning a bare byte relay that spawns the fixture (``_relay.py hop``):
           the least one extra process on the path costs
  floor2   the same client spawning a bare pump to a bare relay server that spawns a fixture per
           connection (``_relay.py pump`` / ``serve``): the least any ``connect`` + daemon path costs
  floorhttp the SDK's streamable-HTTP client to a bare HTTP relay that spawns a fixture per session
           (``_relay.py http``): the least any path through an HTTP listener costs
  floormodern the SDK's ``mcp.Client`` to the same relay (2026-07-28: a fixture per connection)
  socket   the same ClientSession on the daemon's ``mcp.sock`` itself: the daemon's share alone
  connect  the same client code spawning ``mcp-supervisor connect`` to a daemon supervising it
           (connect hands the client's pipes to the daemon: fd passing)
  pumping  the same with ``MCP_SUPERVISOR_HANDOFF=0``: connect pumps the bytes itself
  own      the same, to an extension with ``instances: per-client``: each session its own fixture
  http     the SDK's streamable-HTTP client to the daemon's ``/mcp`` (the handshake era)
  modern   the SDK's ``mcp.Client`` to the same URL as it comes (``mode="auto"``: 2026-07-28 here,
           one POST per request, no session; it lists tools again after a call, as it does)

Peers, each installed from its registry on first use into an ignored cache (``bench/_peers.py``)
and serving the same fixture:

  proxy         the same HTTP client to ``mcp-proxy`` (PyPI) in front of the fixture
  hub           the SDK's SSE client to ``mcp-hub`` (npm), its unified endpoint
  fastmcp       the stdio client spawning FastMCP's ``create_proxy`` (PyPI), which spawns the fixture
  fastmcp-http  the HTTP client to ``fastmcp run mcp.json --transport http``
  supergateway  the HTTP client to ``supergateway`` (npm), stdio to stateful streamable HTTP

Latency: N sequential calls per way on one session each, in interleaved rounds (every way once
per round, in a rotating order), so that the machine's slow spells fall on every way alike:
the median and p99 of all calls, the median over rounds of each round's ratio to ``direct``
(and their range), and the CPU time each process on the path spent per call (``cpu_us``).
Throughput: 8 clients calling at once, counted for 3 s once all call, once per round (direct,
floor* and own: 8 sessions, 8 fixture processes; socket, connect, pumping, http and modern: 8
sessions sharing one supervised fixture; proxy, hub, fastmcp-http: one fixture shared; fastmcp,
supergateway: a fixture per session). ``bench/throughput.py`` says where the CPU goes.
Also the resident memory of each process on the path (``rss_mib``) and the machine's load
average before and after. Prints JSON.

``--uvloop-floors`` runs floor1 and floor2's relays on uvloop, the daemon's loop, instead of
asyncio's (the loop issue 19's goals were set on): a relay costs less than half as much there.

    python bench/gateway.py [--calls 2000] [--rounds 5] [--clients 8] [--throughput-seconds 3]
                            [--skip-peers] [--skip WAY ...] [--uvloop-floors]
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
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil
from _daemon import BIN, ROOT, SERVERS, daemon, fixture, wait_for
from _peers import HTTP_PEERS, VERSIONS, fastmcp_stdio, install, serve
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

sys.path.insert(0, str(ROOT))  # the test suite's client for mcp.sock
from tests.harness.gateway_client import unix_transport

FIXTURE = str(SERVERS / "echo.py")
OURS = (
    "direct",
    "floor1",
    "floor2",
    "floorhttp",
    "floormodern",
    "socket",
    "connect",
    "pumping",
    "own",
    "http",
    "modern",
)
PEERS = ("proxy", "hub", "fastmcp", "fastmcp-http", "supergateway")
_PEER_TOOLS = {"hub": "echo__echo"}  # mcp-hub prefixes a tool with its server's name

_PUMPING = {"MCP_SUPERVISOR_HANDOFF": "0"}  # connect pumps the bytes instead of handing them over
_QUIET = open(os.devnull, "w")  # noqa: SIM115 - the children's stderr, for the whole run

Opener = Callable[[], AbstractAsyncContextManager[ClientSession | Client]]


@asynccontextmanager
async def _stdio(command: str, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=command, args=list(args), env={**os.environ, **(env or {})})
    async with stdio_client(params, errlog=_QUIET) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def _http(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def _modern(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    if headers is None:
        async with Client(url) as client:
            yield client
        return
    async with create_mcp_http_client(headers=headers) as http, Client(_carrying(url, http)) as client:
        yield client


@asynccontextmanager
async def _carrying(url: str, http: Any) -> AsyncIterator[Any]:
    """The streamable-HTTP transport to *url* over *http* (a client that sends the token)."""
    async with streamable_http_client(url, http_client=http) as streams:
        yield streams


@asynccontextmanager
async def _sse(url: str) -> AsyncIterator[ClientSession]:
    async with sse_client(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def _unix(path: str) -> AsyncIterator[ClientSession]:
    """A ClientSession on a unix socket speaking JSON lines (the daemon's mcp.sock)."""
    async with unix_transport(path) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


_LABELS = (
    ("relay", "_relay.py"),
    ("proxy", "mcp-proxy"),
    ("hub", "mcp-hub"),
    ("fastmcp", ".venv-fastmcp"),
    ("supergateway", "supergateway"),
    ("connect", " connect "),
    ("fixture", FIXTURE),
)
_OFF_PATH = ("client", "fixture")  # what every way has: the rest is the gateway's cost


def _label(process: psutil.Process) -> str:
    line = f"{' '.join(process.cmdline())} "
    return next((label for label, mark in _LABELS if mark in line), "other")


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@dataclass
class Route:
    """One way to reach the fixture: how to open a session, the tool's name, the server behind it."""

    name: str
    open_session: Opener
    tool: str
    server_pid: int | None = None  # the daemon, the relay server, mcp-proxy: a process the session uses
    processes: dict[str, list[psutil.Process]] = field(default_factory=dict)
    times: list[list[float]] = field(default_factory=list)  # per round
    cpu: dict[str, float] = field(default_factory=dict)  # seconds, summed over the rounds
    rss: dict[str, float] = field(default_factory=dict)  # MiB per label, after the latency rounds
    throughput: list[float] = field(default_factory=list)  # per round

    def find_processes(self, before: set[int]) -> None:
        """The processes on this way's calls: this client, what its session spawned, the server's tree."""
        spawned = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
        served = _tree(self.server_pid) if self.server_pid is not None else []
        self.processes = {"client": [psutil.Process()]}
        unique = {process.pid: process for process in spawned + served}
        for process in unique.values():
            label = _label(process)
            if label == "other" and process in served:  # the daemon, or a helper of its own
                label = "daemon"
            self.processes.setdefault(label, []).append(process)

    def cpu_now(self) -> dict[str, float]:
        return {
            label: sum(sum(process.cpu_times()[:2]) for process in processes)
            for label, processes in self.processes.items()
        }

    def rss_now(self) -> dict[str, float]:
        """MiB per label: what this way's processes hold (the client's is the bench's own)."""
        return {
            label: round(sum(process.memory_info().rss for process in processes) / 2**20, 1)
            for label, processes in self.processes.items()
            if label != "client"
        }


async def _latency_round(path: Route, session: ClientSession, calls: int) -> None:
    before = path.cpu_now()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await session.call_tool(path.tool, {"text": "ping"})
        times.append(time.perf_counter() - started)
    after = path.cpu_now()
    path.times.append(times)
    for label, seconds in after.items():
        path.cpu[label] = path.cpu.get(label, 0.0) + seconds - before[label]


async def _throughput(
    open_session: Opener,
    tool: str,
    clients: int,
    seconds: float,
    window: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> tuple[int, float]:
    """*clients* sessions calling at once: the calls counted for *seconds* once all call, and
    the seconds they took. *window* is entered around the counted seconds (a measurement)."""
    sessions: list[ClientSession] = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(clients):
            sessions.append(await stack.enter_async_context(open_session()))
        for session in sessions:
            await session.call_tool(tool, {"text": "warm"})
        counted, state = [0], {"counting": False, "stop": False}

        async def client(session: ClientSession) -> None:
            while not state["stop"]:
                await session.call_tool(tool, {"text": "ping"})
                counted[0] += state["counting"]

        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(client, session)
            await anyio.sleep(0.3)  # every client calling
            with window():
                state["counting"], started = True, time.perf_counter()
                await anyio.sleep(seconds)
                state["counting"], state["stop"] = False, True
                elapsed = time.perf_counter() - started
    return counted[0], elapsed


@contextlib.contextmanager
def _http_relay(command: list[str], fixture_cmd: list[str]) -> Iterator[tuple[str, int]]:
    """``_relay.py http`` on a port of its choosing (a free one picked here may be the daemon's,
    which binds its own a moment later): its URL and pid."""
    proc = subprocess.Popen([*command, "0", *fixture_cmd], stdout=subprocess.PIPE, stderr=_QUIET)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline() or 0)
        if not port:
            raise RuntimeError("the HTTP relay did not start")
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _accepts(url: str) -> bool:
    host, _, port = url.removeprefix("http://").partition("/")[0].partition(":")
    with contextlib.suppress(OSError, ValueError), socket.create_connection((host, int(port)), timeout=1):
        return True
    return False


@contextlib.contextmanager
def _relay_server(command: list[str], fixture_cmd: list[str]) -> Iterator[tuple[str, int]]:
    """``_relay.py serve``: its socket and pid."""
    with tempfile.TemporaryDirectory(prefix="mcps-relay-", dir="/tmp") as tmp:
        path = str(Path(tmp) / "relay.sock")
        proc = subprocess.Popen([*command, path, *fixture_cmd], stderr=_QUIET)
        try:
            wait_for(lambda: os.path.exists(path), "the relay server to listen")
            yield path, proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _p99(times: list[list[float]]) -> float:
    pooled = sorted(t for round_ in times for t in round_)
    return pooled[max(0, int(len(pooled) * 0.99) - 1)]


def _summary(path: Route, base: Route, calls: int) -> dict[str, Any]:
    """The figures of one way, and its ratios to *base* (direct)."""
    pooled = [t for times in path.times for t in times]
    round_ratios = [
        statistics.median(mine) / statistics.median(theirs)
        for mine, theirs in zip(path.times, base.times, strict=True)
    ]
    throughput_ratios = [mine / theirs for mine, theirs in zip(path.throughput, base.throughput, strict=True)]
    on_path = sum(seconds for label, seconds in path.cpu.items() if label not in _OFF_PATH)
    return {
        "median_ms": round(statistics.median(pooled) * 1000, 3),
        "p99_ms": round(_p99(path.times) * 1000, 3),
        "median_ratio": round(statistics.median(round_ratios), 2),
        "median_ratio_range": [round(min(round_ratios), 2), round(max(round_ratios), 2)],
        "p99_ratio": round(_p99(path.times) / _p99(base.times), 2),
        "cpu_us": {label: round(seconds / calls * 1e6) for label, seconds in path.cpu.items()},
        "gateway_cpu_us": round(on_path / calls * 1e6),
        "rss_mib": path.rss,
        "throughput_cps": round(statistics.median(path.throughput), 1),
        "throughput_ratio": round(statistics.median(throughput_ratios), 2),
    }


async def _run(paths: list[Route], args: argparse.Namespace) -> None:
    """Every path in every round, in a rotating order, so that a slow spell of the machine is shared."""
    per_round = args.calls // args.rounds
    async with contextlib.AsyncExitStack() as stack:
        sessions = {}
        for path in paths:
            before = {child.pid for child in psutil.Process().children(recursive=True)}
            sessions[path.name] = session = await stack.enter_async_context(path.open_session())
            for _ in range(50):
                await session.call_tool(path.tool, {"text": "warm"})
            path.find_processes(before)
        for round_ in range(args.rounds):
            for path in paths[round_ % len(paths) :] + paths[: round_ % len(paths)]:
                await _latency_round(path, sessions[path.name], per_round)
        for path in paths:
            path.rss = path.rss_now()
    for round_ in range(args.rounds):
        for path in paths[round_ % len(paths) :] + paths[: round_ % len(paths)]:
            calls, elapsed = await _throughput(
                path.open_session, path.tool, args.clients, args.throughput_seconds
            )
            path.throughput.append(round(calls / elapsed, 1))
        print(f"bench: round {round_ + 1} of {args.rounds} done", file=sys.stderr)


def _ways(args: argparse.Namespace) -> list[str]:
    skipped = (
        set(args.skip)
        | (set(PEERS) if args.skip_peers else set())
        | ({"proxy"} if args.skip_proxy else set())
    )
    return [name for name in (*OURS, *PEERS) if name == "direct" or name not in skipped]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    ways = _ways(args)
    if args.uvloop_floors:
        os.environ["RELAY_LOOP"] = "uvloop"  # the relays inherit it
    install([name for name in ways if name in PEERS])
    load_before = os.getloadavg()
    fixture_cmd = [sys.executable, FIXTURE]
    relay = [sys.executable, str(ROOT / "bench" / "_relay.py")]
    with contextlib.ExitStack() as stack:
        per_client = fixture("echo.py", instances="per-client", max_instances=4 * args.clients)
        extensions = {"fx": fixture("echo.py"), "own": per_client}
        running = stack.enter_context(daemon(extensions, http=True))
        # Its port was picked free and is bound a moment later: nothing else picks one before.
        wait_for(lambda: _accepts(running.http_url or ""), "the daemon's HTTP listener")
        relay_sock, relay_pid = stack.enter_context(_relay_server([*relay, "serve"], fixture_cmd))
        relay_url, http_relay_pid = stack.enter_context(_http_relay([*relay, "http"], fixture_cmd))
        served = {name: stack.enter_context(serve(name, fixture_cmd)) for name in HTTP_PEERS if name in ways}
        wait_for(lambda: running.all_running(["fx", "own"]), "the daemon's fixtures to run")
        connect = [str(BIN / "mcp-supervisor"), "connect", "--socket", running.socket]
        sock = str(Path(running.socket).parent / "mcp.sock")
        pid = running.proc.pid
        http = running.http_url or ""
        routes = {
            "direct": Route("direct", lambda: _stdio(*fixture_cmd), "echo"),
            "floor1": Route("floor1", lambda: _stdio(*relay, "hop", *fixture_cmd), "echo"),
            "floor2": Route("floor2", lambda: _stdio(*relay, "pump", relay_sock), "echo", relay_pid),
            "floorhttp": Route("floorhttp", lambda: _http(relay_url), "echo", http_relay_pid),
            "floormodern": Route("floormodern", lambda: _modern(relay_url), "echo", http_relay_pid),
            "socket": Route("socket", lambda: _unix(sock), "fx__echo", pid),
            "connect": Route("connect", lambda: _stdio(*connect), "fx__echo", pid),
            "pumping": Route("pumping", lambda: _stdio(*connect, env=_PUMPING), "fx__echo", pid),
            "own": Route("own", lambda: _stdio(*connect), "own__echo", pid),
            "http": Route("http", lambda: _http(http, running.http_headers), "fx__echo", pid),
            "modern": Route("modern", lambda: _modern(http, running.http_headers), "fx__echo", pid),
            "fastmcp": Route("fastmcp", lambda: _stdio(*fastmcp_stdio(fixture_cmd)), "echo"),
        }
        for name, (url, peer_pid) in served.items():
            opener = _sse if name == "hub" else _http
            routes[name] = Route(
                name, lambda opener=opener, url=url: opener(url), _PEER_TOOLS.get(name, "echo"), peer_pid
            )
        paths = [routes[name] for name in ways]
        await _run(paths, args)
    per_path_calls = args.calls // args.rounds * args.rounds
    results = {path.name: _summary(path, paths[0], per_path_calls) for path in paths}
    for name, figures in results.items():
        print(f"bench: {name}: {figures}", file=sys.stderr)
    return {
        "calls": per_path_calls,
        "rounds": args.rounds,
        "clients": args.clients,
        "throughput_seconds": args.throughput_seconds,
        "floors_loop": "uvloop" if args.uvloop_floors else "asyncio",
        "python": sys.version.split()[0],
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "peers": {name: VERSIONS[name] for name in ways if name in PEERS},
        "results": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--throughput-seconds", type=float, default=3.0, help="counted seconds of 8 clients per way per round"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (ratios: their median)")
    parser.add_argument("--skip-peers", action="store_true", help="measure only our ways: install no peer")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=[*OURS[1:], *PEERS],
        metavar="WAY",
        help="leave a way out",
    )
    parser.add_argument("--skip-proxy", action="store_true", help="the same as --skip proxy")
    parser.add_argument("--uvloop-floors", action="store_true", help="floor1 and floor2's relays on uvloop")
    report = anyio.run(main, parser.parse_args())
    print(json.dumps(report, indent=2))
    shutil.rmtree(ROOT / "bench" / "__pycache__", ignore_errors=True)
