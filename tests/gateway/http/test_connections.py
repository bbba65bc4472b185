"""HTTP connections against a real daemon: what one connection may make the daemon hold.

The listener's other bounds (connections, deadlines, bodies, sessions) are in test_limits.py on
an in-process listener; this needs a daemon with an extension, for the fast path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket
from collections.abc import Callable

import anyio
import httpx2
import pytest

from supervisor.gateway.http.connections import MAX_AHEAD
from tests.gateway.http.test_fastcalls import Raw
from tests.harness import RICH, Daemon, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]  # a daemon's start and stop, loaded: 60 s missed


def _requests(url: str, headers: dict[str, str], bodies: list[bytes]) -> bytes:
    """*bodies* as POSTs to /mcp on one connection, back to back (pipelined)."""
    host, port = url.removeprefix("http://").split(":")
    common = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    heads = [
        f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n{common}\r\n"
        for body in bodies
    ]
    return b"".join(head.encode() + body for head, body in zip(heads, bodies, strict=True))


def _echo(request_id: int) -> bytes:
    params = {"name": "rich__echo", "arguments": {"text": str(request_id)}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


def _waiting(request_id: int, seconds: float) -> bytes:
    params = {"name": "rich__wait", "arguments": {"seconds": seconds}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


async def _session(http: Daemon) -> Raw:
    """A handshake-era session of *http* that listed tools (its calls take the fast path)."""
    async with httpx2.AsyncClient(timeout=10, headers=http.headers) as client:
        session = Raw(client, http.url + "/mcp")
        await session.open()
    return session


def _listing(request_id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/list"}).encode()


def _answered_ids(data: bytes) -> list[int]:
    return [int(found) for found in re.findall(rb'"id":\s*(\d+)', data)]


def _batches(
    url: str, headers: dict[str, str], body: Callable[[int], bytes], rounds: int, ahead: int
) -> list[int]:
    """*rounds* times: *ahead* requests in one write, then their answers; the ids answered, in order."""
    answered: list[int] = []
    with socket.create_connection(tuple(url.removeprefix("http://").split(":")), timeout=10) as sock:  # type: ignore[arg-type]
        for first in range(0, rounds * ahead, ahead):
            sock.sendall(_requests(url, headers, [body(n) for n in range(first, first + ahead)]))
            data = b""
            while len(_answered_ids(data)) < ahead:
                chunk = sock.recv(1 << 16)
                assert chunk, f"the connection closed after {answered + _answered_ids(data)}"
                data += chunk
            answered += _answered_ids(data)
    return answered


def _flood(url: str, headers: dict[str, str], bodies: list[bytes]) -> bytes:
    """*bodies* in one write, then everything until the daemon closes."""
    data = b""
    with socket.create_connection(tuple(url.removeprefix("http://").split(":")), timeout=10) as sock:  # type: ignore[arg-type]
        with contextlib.suppress(OSError):  # it may close while we still send: that is the point
            sock.sendall(_requests(url, headers, bodies))
        with contextlib.suppress(OSError):
            while chunk := sock.recv(1 << 16):
                data += chunk
    return data


class TestPipelining:
    @pytest.mark.parametrize("body", [_echo, _listing], ids=["fast path", "sdk path"])
    async def test_requests_sent_ahead_within_the_bound_are_all_answered_in_order(
        self,
        http_gateway: Callable[..., Daemon],
        body: Callable[[int], bytes],
    ) -> None:
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        batches = functools.partial(_batches, http.url, session.headers, body, 20, MAX_AHEAD)
        answered = await anyio.to_thread.run_sync(batches)
        assert answered == list(range(20 * MAX_AHEAD))

    @pytest.mark.parametrize("body", [_echo, _listing], ids=["fast path", "sdk path"])
    async def test_past_the_bound_the_answers_owed_come_in_order_then_the_connection_ends(
        self,
        http_gateway: Callable[..., Daemon],
        body: Callable[[int], bytes],
    ) -> None:
        """A call that takes a moment, then 30 requests sent ahead of its answer: the call and the
        16 that may wait are answered, in order, then the connection closes; the rest was never
        run. Before, a 400 went out at once, ahead of the call's answer, as if it were that."""
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        slow = _waiting(0, seconds=0.5)
        data = await anyio.to_thread.run_sync(
            _flood, http.url, session.headers, [slow] + [body(n) for n in range(1, 31)]
        )
        statuses = re.findall(rb"HTTP/1.1 (\d+)", data)
        assert statuses == [b"200"] * (1 + MAX_AHEAD)
        assert _answered_ids(data) == list(range(1 + MAX_AHEAD))

    @pytest.mark.parametrize("body", [_echo(1), _listing(1)], ids=["fast path", "sdk path"])
    async def test_a_flood_sent_ahead_is_cut_short_and_holds_nothing(
        self,
        http_gateway: Callable[..., Daemon],
        body: bytes,
    ) -> None:
        """A client sending thousands of requests ahead of their answers: the daemon takes the few
        that may wait, answers them and closes, and does not grow. Before, uvicorn resumed reading
        for every body read and every answer, and h11 took one more 256 KiB read into its buffer
        each time: 620-700 MiB in 4 s (1.3 GB in 15 s), at 45 answers a second."""
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        before = http.rss()
        for _ in range(3):  # three floods, one after the other
            data = await anyio.to_thread.run_sync(_flood, http.url, session.headers, [body] * 20_000)
            assert 0 < len(re.findall(rb"HTTP/1.1 200", data)) <= 1 + MAX_AHEAD
        assert http.rss() - before < 64 << 20, f"the daemon grew {(http.rss() - before) >> 20} MiB"
        # The session goes on, on a connection of its own.
        answer = httpx2.post(http.url + "/mcp", content=_echo(2), headers=session.headers, timeout=10)
        assert answer.status_code == 200 and answer.json()["id"] == 2

    async def test_a_client_that_goes_is_heard_while_requests_wait_their_turn(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        """A long call with a request sent ahead of its answer, then the client goes: the call is
        cancelled in the child. Before, reading stayed paused while a request waited, and the
        close went unheard until the call ended by itself."""
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        slow = _waiting(0, seconds=30)
        host, port = http.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(_requests(http.url, session.headers, [slow, _echo(1)]))
            await eventually(lambda: http.status()["rich"]["in_flight"] == 1, within=10)
        await eventually(lambda: "rich: cancelled" in http.cli("logs", "rich").stdout, within=10)
        assert http.status()["rich"]["in_flight"] == 0
