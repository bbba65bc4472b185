"""Cold start: from launching the daemon to a client's first ``tools/list`` that lists every tool.

A client's first list after a boot or a ``systemctl restart`` waits on the daemon's own start
and its children's handshakes. Ways, in interleaved rounds (every way once per round, rotating):

  direct   spawn the extensions' fixtures and, on each one's stdio, initialize and list tools
           (the floor: what a client spawning its own servers waits for)
  http     launch ``mcp-supervisor daemon`` with the HTTP listener and poll ``/mcp`` (initialize,
           ``tools/list``) until the list holds every extension's tools
  socket   the same on ``mcp.sock``
  late     the same with ``MCP_SUPERVISOR_HEAD_START=0``: the daemon spawns nothing before it has
           imported the MCP SDK and the gateway (the order before the head start)

Raw JSON-RPC from this process (no SDK client), with a fresh state directory each time (no
saved listings). Prints JSON: the median seconds of each way and its median ratio to direct.

    python bench/coldstart.py [--rounds 5] [--extensions 3]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _daemon import BIN, SERVERS, free_port

FIXTURE = [sys.executable, str(SERVERS / "echo.py")]
DEADLINE = 60.0
HELLO = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "coldstart", "version": "1"},
}


def _line(request_id: int | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def _direct(extensions: int) -> float:
    return _spawn_and_list(extensions)[0]


def _spawn_and_list(extensions: int) -> tuple[float, int]:
    """Seconds until every fixture listed its tools, and how many tools they listed in all."""
    started = time.perf_counter()
    procs = [
        subprocess.Popen(FIXTURE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for _ in range(extensions)
    ]
    try:
        for proc in procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(_line(0, "initialize", HELLO) + _line(None, "notifications/initialized"))
            proc.stdin.write(_line(1, "tools/list"))
            proc.stdin.flush()
        tools = 0
        for proc in procs:
            assert proc.stdout is not None
            while (message := json.loads(proc.stdout.readline())).get("id") != 1:
                pass
            tools += len(message["result"]["tools"])
        return time.perf_counter() - started, tools
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _daemon(extensions: int, port: int, **env: str) -> Iterator[tuple[Path, float]]:
    with tempfile.TemporaryDirectory(prefix="mcps-cold-", dir="/tmp") as tmp:
        directory = Path(tmp)
        config = {
            "socket": str(directory / "control.sock"),
            "spool": {"dir": str(directory / "spool")},
            "gateway": {"http": {"enabled": True, "port": port}},
            "extensions": {f"e{n}": {"command": FIXTURE[0], "args": FIXTURE[1:]} for n in range(extensions)},
        }
        (directory / "config.json").write_text(json.dumps(config))
        environ = {**os.environ, "XDG_STATE_HOME": str(directory / "state"), **env}
        started = time.perf_counter()
        command = [str(BIN / "mcp-supervisor"), "daemon", "-c", str(directory / "config.json")]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ)
        try:
            yield directory, started
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _until(list_tools: Callable[[], int | None], expected: int, started: float) -> float:
    while time.perf_counter() - started < DEADLINE:
        with contextlib.suppress(OSError, ValueError, KeyError, StopIteration, http.client.HTTPException):
            if (list_tools() or 0) >= expected:
                return time.perf_counter() - started
        time.sleep(0.005)
    raise SystemExit("bench: no full tools/list within the deadline")


def _http_tools(port: int) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        conn.request("POST", "/mcp", _line(0, "initialize", HELLO), headers)
        answer = conn.getresponse()
        answer.read()
        headers |= {"mcp-session-id": answer.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        conn.request("POST", "/mcp", _line(None, "notifications/initialized"), headers)
        conn.getresponse().read()
        conn.request("POST", "/mcp", _line(1, "tools/list"), headers)
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    data = [line.removeprefix("data:").strip() for line in body.splitlines() if line.startswith("data:")]
    message = json.loads(next(line for line in data if line) if data else body)
    return len(message["result"]["tools"])


def _socket_tools(path: Path) -> int | None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(_line(0, "initialize", HELLO) + _line(None, "notifications/initialized"))
        sock.sendall(_line(1, "tools/list"))
        reader = sock.makefile("rb")
        while (message := json.loads(reader.readline())).get("id") != 1:
            pass
    return len(message["result"]["tools"])


def _http(extensions: int, expected: int) -> float:
    port = free_port()
    with _daemon(extensions, port) as (_, started):
        return _until(lambda: _http_tools(port), expected, started)


def _socket(extensions: int, expected: int) -> float:
    with _daemon(extensions, free_port()) as (directory, started):
        return _until(lambda: _socket_tools(directory / "mcp.sock"), expected, started)


def _late(extensions: int, expected: int) -> float:
    with _daemon(extensions, free_port(), MCP_SUPERVISOR_HEAD_START="0") as (directory, started):
        return _until(lambda: _socket_tools(directory / "mcp.sock"), expected, started)


def main(args: argparse.Namespace) -> dict[str, Any]:
    _, expected = _spawn_and_list(args.extensions)  # and a warm page cache for every way
    ways: dict[str, Callable[[int, int], float]] = {
        "direct": lambda extensions, _: _direct(extensions),
        "http": _http,
        "socket": _socket,
        "late": _late,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            times[name].append(ways[name](args.extensions, expected))
        print(f"bench: round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    ratios = {
        name: statistics.median(mine / base for mine, base in zip(times[name], times["direct"], strict=True))
        for name in names
    }
    return {
        "extensions": args.extensions,
        "rounds": args.rounds,
        "load": os.getloadavg(),
        "median_s": {name: round(statistics.median(values), 3) for name, values in times.items()},
        "median_ratio": {name: round(ratio, 2) for name, ratio in ratios.items()},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--extensions", type=int, default=3)
    print(json.dumps(main(parser.parse_args()), indent=2))
