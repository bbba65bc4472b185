"""``connect`` start and size, and many ``connect`` clients calling at once.

Each client is a real ``mcp-supervisor connect`` process (the console script, as an MCP client
configures it) driven here with JSON lines on its stdin and stdout: no SDK on the client side,
so the figures are ``connect``'s and the daemon's.

start  One daemon supervising ``tests/servers/echo.py``. N clients (50) started one after
       another and left running: each one's time from spawn to its answer to ``initialize``
       (sent at once, as a client does) and to the answer to its first ``tools/call``; then
       the RSS and USS (the pages only it holds) of every client with all N up, and the
       daemon's RSS before and after. The same again with all N spawned at once. Baseline in
       the same run, interleaved: this interpreter starting and exiting (``python -c pass``).
scale  One daemon with E echo fixtures (10); C clients (100), client i on extension i mod E,
       every one calling at once at R calls/s (2, each at its own phase) for S seconds (20):
       call latency p50/p99/max, errors (error answers, no answer within 30 s, a client gone),
       the total RSS of the clients, the daemon and the fixtures, and the daemon's CPU per call.

The machine's load average is reported beside every part. Prints JSON.

    python bench/connect.py [--clients 50] [--scale-clients 100] [--extensions 10]
                            [--rate 2] [--seconds 20] [--only start|scale]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import psutil
from _daemon import BIN, ROOT, daemon, fixture, wait_for
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

MAX_LINE = 16 << 20
CALL_TIMEOUT = 30.0
INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "bench-connect", "version": "0"},
}


class ClientGone(Exception):
    """The ``connect`` process closed its stdout."""


@dataclass
class Client:
    """One ``connect`` process and a JSON-lines conversation with it, one request at a time."""

    process: Process
    started: float  # perf_counter at spawn
    reader: BufferedByteReceiveStream = field(init=False)
    last_id: int = 0

    def __post_init__(self) -> None:
        assert self.process.stdout is not None
        self.reader = BufferedByteReceiveStream(self.process.stdout)

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request; return its answer (notifications in between are dropped)."""
        self.last_id += 1
        await self.send({"id": self.last_id, "method": method, **({"params": params} if params else {})})
        while True:
            try:
                line = await self.reader.receive_until(b"\n", MAX_LINE)
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError) as exc:
                raise ClientGone from exc
            answer = json.loads(line)
            if answer.get("id") == self.last_id:
                return answer


def _connect_command(control: str) -> list[str]:
    return [str(BIN / "mcp-supervisor"), "connect", "--socket", control]


@contextlib.asynccontextmanager
async def _clients() -> AsyncIterator[list[Client]]:
    """A list to put clients in; every one closed (stdin first, as a client does) at the end."""
    clients: list[Client] = []
    try:
        yield clients
    finally:
        with anyio.CancelScope(shield=True):
            for client in clients:
                with anyio.move_on_after(10):
                    await client.process.aclose()  # closes stdin and waits: connect exits on EOF
                if client.process.returncode is None:
                    client.process.kill()
                    await client.process.wait()


async def _spawn(control: str) -> Client:
    started = time.perf_counter()
    process = await anyio.open_process(_connect_command(control), stderr=subprocess.DEVNULL)
    return Client(process, started)


async def _handshake(client: Client, tool: str | None) -> dict[str, float]:
    """initialize (+ initialized, tools/list) and one call of *tool*: ms from spawn to each answer."""
    answer = await client.request("initialize", INITIALIZE)
    if "result" not in answer:
        raise SystemExit(f"bench: initialize failed: {answer}")
    first = time.perf_counter() - client.started
    await client.send({"method": "notifications/initialized"})
    await client.request("tools/list")
    figures = {"first_answer_ms": first * 1000}
    if tool is not None:
        answer = await client.request("tools/call", {"name": tool, "arguments": {"text": "first"}})
        if "result" not in answer:
            raise SystemExit(f"bench: the first call failed: {answer}")
        figures["first_call_ms"] = (time.perf_counter() - client.started) * 1000
    return figures


async def _record_handshake(client: Client, figures: list[dict[str, float]]) -> None:
    figures.append(await _handshake(client, "fx__echo"))


def _mib(value: float) -> float:
    return round(value / 2**20, 2)


def _spread(values: list[float], digits: int = 1) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), digits),
        "p99": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], digits),
        "max": round(ordered[-1], digits),
    }


def _memory(clients: list[Client]) -> dict[str, list[float]]:
    rss, uss = [], []
    for client in clients:
        info = psutil.Process(client.process.pid).memory_full_info()
        rss.append(info.rss)
        uss.append(info.uss)
    return {"rss": rss, "uss": uss}


def _python_start() -> float:
    """ms for this interpreter to start and exit: what any Python ``connect`` pays first."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - started) * 1000


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


async def _start_part(args: argparse.Namespace) -> dict[str, Any]:
    with daemon({"fx": fixture("echo.py")}) as running:
        wait_for(lambda: running.all_running(["fx"]), "the fixture to run")
        me = psutil.Process(running.proc.pid)
        report: dict[str, Any] = {"clients": args.clients, "load_before": _load()}
        for mode in ("one_by_one", "at_once"):
            rss_before = me.memory_info().rss
            baseline, figures = [], []
            async with _clients() as clients:
                if mode == "one_by_one":
                    for _ in range(args.clients):
                        baseline.append(_python_start())
                        clients.append(await _spawn(running.socket))
                        figures.append(await _handshake(clients[-1], "fx__echo"))
                else:
                    for _ in range(args.clients):
                        clients.append(await _spawn(running.socket))
                    async with anyio.create_task_group() as tg:
                        for client in clients:
                            tg.start_soon(_record_handshake, client, figures)
                memory = _memory(clients)
                rss_after = me.memory_info().rss
            part = {
                "first_answer_ms": _spread([f["first_answer_ms"] for f in figures]),
                "first_call_ms": _spread([f["first_call_ms"] for f in figures]),
                "client_rss_mib": _spread([_mib(x) for x in memory["rss"]], 2),
                "client_uss_mib": _spread([_mib(x) for x in memory["uss"]], 2),
                "daemon_rss_mib": [_mib(rss_before), _mib(rss_after)],
                "daemon_kib_per_client": round((rss_after - rss_before) / args.clients / 1024, 1),
            }
            if baseline:
                part["python_start_ms"] = _spread(baseline)
            report[mode] = part
            print(f"bench: start, {mode}: {part}", file=sys.stderr)
        report["load_after"] = _load()
        return report


@dataclass
class Tally:
    times: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def _paced_calls(client: Client, tool: str, args: argparse.Namespace, t0: float, tally: Tally) -> None:
    """Calls at *rate* per second from *t0* plus a random phase; a late answer delays the next call."""
    phase = random.random() / args.rate
    for k in range(int(args.seconds * args.rate)):
        await anyio.sleep_until(t0 + phase + k / args.rate)
        started = time.perf_counter()
        try:
            with anyio.fail_after(CALL_TIMEOUT):
                answer = await client.request("tools/call", {"name": tool, "arguments": {"text": "ping"}})
        except TimeoutError:
            tally.error("timeout")
            return  # a late answer would be taken for the next call's
        except ClientGone:
            tally.error("client gone")
            return
        tally.times.append(time.perf_counter() - started)
        if "error" in answer:
            tally.error(f"error {answer['error'].get('code')}")
        elif answer["result"].get("isError"):
            tally.error("tool error")


def _tree_rss(pid: int, skip: set[int]) -> tuple[float, float]:
    """(the daemon's RSS, its descendants' RSS but those in *skip*)."""
    me = psutil.Process(pid)
    children = 0
    for child in me.children(recursive=True):
        if child.pid not in skip:
            with contextlib.suppress(psutil.NoSuchProcess):
                children += child.memory_info().rss
    return me.memory_info().rss, children


async def _scale_part(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"ext{i}" for i in range(args.extensions)]
    with daemon({name: fixture("echo.py") for name in names}, shutdown_timeout=60) as running:
        wait_for(lambda: running.all_running(names), "every fixture to run", within=300, interval=0.2)
        pid = running.proc.pid
        me = psutil.Process(pid)
        daemon_idle, _ = _tree_rss(pid, set())
        report: dict[str, Any] = {
            "clients": args.scale_clients,
            "extensions": args.extensions,
            "rate_per_client": args.rate,
            "seconds": args.seconds,
            "load_before": _load(),
        }
        tally = Tally()
        async with _clients() as clients:
            started = time.perf_counter()
            for batch in range(0, args.scale_clients, 10):  # ten at a time: a realistic burst, not a herd
                fresh = [await _spawn(running.socket) for _ in range(min(10, args.scale_clients - batch))]
                clients.extend(fresh)
                async with anyio.create_task_group() as tg:
                    for client in fresh:
                        tg.start_soon(_handshake, client, None)
            report["all_connected_s"] = round(time.perf_counter() - started, 2)
            memory = _memory(clients)
            daemon_rss, fixtures_rss = _tree_rss(pid, set())
            cpu_before = sum(me.cpu_times()[:2])
            psutil.cpu_percent()
            t0 = anyio.current_time() + 0.5
            async with anyio.create_task_group() as tg:
                for i, client in enumerate(clients):
                    tg.start_soon(_paced_calls, client, f"{names[i % len(names)]}__echo", args, t0, tally)
            machine_busy = psutil.cpu_percent()
            daemon_cpu = sum(me.cpu_times()[:2]) - cpu_before
            daemon_after, _ = _tree_rss(pid, set())
        calls = len(tally.times)
        report.update(
            {
                "load_after": _load(),
                "machine_cpu_busy_pct": machine_busy,
                "calls": calls,
                "errors": tally.errors,
                "latency_ms": _spread([t * 1000 for t in tally.times], 2) if tally.times else None,
                "daemon_cpu_us_per_call": round(daemon_cpu / max(calls, 1) * 1e6),
                "rss_mib": {
                    "clients_total": _mib(sum(memory["rss"])),
                    "clients_uss_total": _mib(sum(memory["uss"])),
                    "client_median": _mib(statistics.median(memory["rss"])),
                    "daemon_idle": _mib(daemon_idle),
                    "daemon_with_clients": _mib(daemon_rss),
                    "daemon_after_calls": _mib(daemon_after),
                    "fixtures_total": _mib(fixtures_rss),
                    "clients_plus_daemon": _mib(sum(memory["rss"]) + daemon_rss),
                },
            }
        )
        print(f"bench: scale: {report}", file=sys.stderr)
        return report


async def main(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if args.only in (None, "start"):
        report["start"] = await _start_part(args)
    if args.only in (None, "scale"):
        report["scale"] = await _scale_part(args)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50, help="connect processes in the start part")
    parser.add_argument("--scale-clients", type=int, default=100, help="connect processes in the scale part")
    parser.add_argument("--extensions", type=int, default=10, help="echo fixtures in the scale part")
    parser.add_argument("--rate", type=float, default=2.0, help="calls per second per client (scale)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the clients call (scale)")
    parser.add_argument("--only", choices=["start", "scale"])
    report = anyio.run(main, parser.parse_args())
    print(json.dumps(report, indent=2))
    shutil.rmtree(ROOT / "bench" / "__pycache__", ignore_errors=True)
