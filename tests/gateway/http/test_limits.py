"""The HTTP listener's bounds, on a real uvicorn in this process with small limits.

The gateway has no extensions here: what is under test is what a client can hold of the
listener (connections, bytes, sessions, time), not what the tools do. Real sockets, the real
app (:func:`serve_http`); daemon-level tests of the same bounds are in test_gateway_hostile.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from supervisor.extension.supervised import Extension
from supervisor.gateway.http import HttpLimits, Listening, serve_http
from supervisor.gateway.server import Gateway
from tests.harness import eventually
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(30),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]


class _NoExtensions:
    def extensions(self) -> Sequence[Extension]:
        return []

    def instance_of(self, name: str, client: Any) -> Extension:
        raise AssertionError("no per-client extension here")

    async def instance_when_room(self, name: str, client: Any) -> Extension:
        raise AssertionError("no per-client extension here")

    def existing_instance(self, name: str, client: Any) -> Extension | None:
        return None


@asynccontextmanager
async def listening(
    tmp: Path, limits: HttpLimits, health: Callable[[], Any] = dict
) -> AsyncIterator[Listening]:
    gateway = Gateway(_NoExtensions(), spool_dir=tmp)
    async with anyio.create_task_group() as tg:
        await tg.start(gateway.run)
        started: Listening = await tg.start(
            lambda task_status: serve_http(
                gateway,
                host="127.0.0.1",
                port=0,
                token=None,
                metrics=lambda: "",
                health=health,
                limits=limits,
                task_status=task_status,
            )
        )
        yield started
        tg.cancel_scope.cancel()


def _connect(port: int, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if first:
        sock.sendall(first)
    return sock


async def _closed(sock: socket.socket, within: float = 5.0) -> bytes:
    """Everything the server sent until it closed *sock* (failing if it does not, in time)."""

    def read_all() -> bytes:
        sock.settimeout(within)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data

    with fail_after(within + 1):
        return await anyio.to_thread.run_sync(read_all)


def _post(port: int, path: str, body: bytes, **headers: str) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n"
    head += f"content-length: {headers.pop('length', len(body))}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return head.encode() + b"\r\n" + body


def _initialize(request_id: int = 1) -> bytes:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}).encode()


MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class TestConnections:
    async def test_a_half_open_connection_gets_408_at_the_header_deadline(self, short_tmp: Path) -> None:
        """A client that sends half a request line and stalls is answered 408 and closed in time."""
        async with listening(short_tmp, HttpLimits(header_timeout=0.5)) as http:
            stalled = _connect(http.port, b"POST /mcp HTTP/1.1\r\n")
            silent = _connect(http.port)  # not a byte: the deadline runs from the connection
            assert (await _closed(stalled)).startswith(b"HTTP/1.1 408")
            assert (await _closed(silent)).startswith(b"HTTP/1.1 408")
            await eventually(lambda: len(http.connections) == 0)

    async def test_at_the_cap_the_idlest_connection_makes_room(self, short_tmp: Path) -> None:
        """A flood of stalled connections never locks an honest client out: the oldest goes."""
        async with listening(short_tmp, HttpLimits(max_connections=4)) as http:
            flood = [_connect(http.port, b"GET /healthz HT") for _ in range(4)]
            await eventually(lambda: len(http.connections) == 4)
            async with httpx2.AsyncClient() as client:
                answer = await client.get(f"http://127.0.0.1:{http.port}/healthz")
            assert answer.status_code == 200
            assert await _closed(flood[0]) == b""  # the idlest, closed without a word
            assert len(http.connections) <= 4

    async def test_when_every_connection_is_busy_a_newcomer_gets_503(self, short_tmp: Path) -> None:
        """Connections serving a request (here: receiving a body) are never closed for a newcomer."""
        async with listening(short_tmp, HttpLimits(max_connections=2)) as http:
            busy = [_connect(http.port, _post(http.port, "/metrics", b"x" * 100)[:-50]) for _ in range(2)]
            await eventually(lambda: len(http.connections) == 2)
            newcomer = _connect(http.port, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = await _closed(newcomer)
            assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer
            for sock in busy:
                sock.sendall(b"x" * 50)
                assert b"405" in (await _closed(sock)).split(b"\r\n")[0]  # served: POST /metrics

    async def test_a_body_that_stalls_gets_408_at_its_deadline(self, short_tmp: Path) -> None:
        async with listening(short_tmp, HttpLimits(body_timeout=0.5)) as http:
            sock = _connect(http.port, _post(http.port, "/mcp", b"{" * 100)[:-10])
            assert (await _closed(sock)).startswith(b"HTTP/1.1 408")

    async def test_an_answer_left_unread_ends_the_connection(self, short_tmp: Path) -> None:
        """A client that stops reading holds no connection past ``send_timeout``."""
        big = {"padding": "x" * (16 << 20)}  # more than the socket buffers take
        async with listening(short_tmp, HttpLimits(send_timeout=0.5), health=lambda: big) as http:
            sock = _connect(http.port)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(f"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1:{http.port}\r\n\r\n".encode())
            await eventually(lambda: len(http.connections) == 1)
            await eventually(lambda: len(http.connections) == 0, within=10)
            sock.close()

    async def test_tcp_nodelay_is_set_on_every_connection(self, short_tmp: Path) -> None:
        """Without it a keep-alive client waits out Nagle's 40 ms on every answer."""
        async with listening(short_tmp, HttpLimits()) as http:
            sock = _connect(http.port, b"GET /healthz HT")
            await eventually(lambda: len(http.connections) == 1)
            (connection,) = http.connections.open
            raw = connection.transport.get_extra_info("socket")
            assert raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            sock.close()


class TestBodies:
    async def test_a_body_over_the_limit_is_refused_before_it_is_read(self, short_tmp: Path) -> None:
        async with listening(short_tmp, HttpLimits(max_body=1000)) as http:
            sock = _connect(http.port, _post(http.port, "/mcp", b"", length="5000"))
            assert (await _closed(sock)).startswith(b"HTTP/1.1 413")

    async def test_bodies_being_received_share_one_budget(self, short_tmp: Path) -> None:
        """Past the budget a body gets 503 at once; the bytes held never exceed it."""
        limits = HttpLimits(receiving_budget=1 << 20, stall_grace=30)
        async with listening(short_tmp, limits) as http:
            big = _post(http.port, "/metrics", b"x" * (900 << 10))
            first = _connect(http.port, big[: len(big) - (400 << 10)])  # most of the headers' promise unsent
            await eventually(lambda: http.app.bodies.receiving == 900 << 10)
            second = _connect(http.port, _post(http.port, "/metrics", b"y" * (200 << 10)))
            assert (await _closed(second)).startswith(b"HTTP/1.1 503")
            small = _connect(http.port, _post(http.port, "/metrics", b"z" * 1000))
            assert b"405" in (await _closed(small)).split(b"\r\n")[0]  # fits: read and served
            first.sendall(big[len(big) - (400 << 10) :])
            assert b"405" in (await _closed(first)).split(b"\r\n")[0]
            assert http.app.bodies.receiving == 0

    async def test_a_stalled_body_makes_room_for_one_that_arrives(self, short_tmp: Path) -> None:
        """At the budget, a body stalled past ``stall_grace`` is dropped (503) for a newcomer."""
        limits = HttpLimits(receiving_budget=1 << 20, stall_grace=0)
        async with listening(short_tmp, limits) as http:
            big = _post(http.port, "/metrics", b"x" * (900 << 10))
            stalled = _connect(http.port, big[:-1000])
            await eventually(lambda: http.app.bodies.receiving > 0)
            honest = _connect(http.port, _post(http.port, "/metrics", b"y" * (500 << 10)))
            assert b"405" in (await _closed(honest)).split(b"\r\n")[0]
            assert (await _closed(stalled)).startswith(b"HTTP/1.1 503")

    async def test_a_session_has_a_bounded_number_of_requests_in_flight(self, short_tmp: Path) -> None:
        async with listening(short_tmp, HttpLimits(max_in_flight=2)) as http:
            partial = _post(http.port, "/metrics", b"x" * 100, **{"mcp-session-id": "s1"})[:-50]
            held = [_connect(http.port, partial) for _ in range(2)]
            await eventually(lambda: len(http.connections) == 2)
            third = _connect(http.port, _post(http.port, "/metrics", b"x", **{"mcp-session-id": "s1"}))
            assert (await _closed(third)).startswith(b"HTTP/1.1 429")
            other = _connect(http.port, _post(http.port, "/metrics", b"x", **{"mcp-session-id": "s2"}))
            assert b"405" in (await _closed(other)).split(b"\r\n")[0]
            for sock in held:
                sock.close()


class TestSessions:
    async def test_a_session_flood_never_locks_out_an_honest_client(self, short_tmp: Path) -> None:
        """At the cap the session idle longest is ended; an honest client's open session stays."""
        async with listening(short_tmp, HttpLimits(max_sessions=3)) as http:
            url = f"http://127.0.0.1:{http.port}/mcp"
            async with Client(url, mode="legacy") as honest:
                async with httpx2.AsyncClient() as flood:
                    for n in range(10):
                        answer = await flood.post(url, content=_initialize(n), headers=MCP_HEADERS)
                        assert answer.status_code == 200, answer.text
                assert len(http.app.sessions) <= 3
                assert (await honest.list_tools()).tools == []  # still served: it was not the idlest

    async def test_a_session_without_a_request_after_initialize_expires_soon(self, short_tmp: Path) -> None:
        async with listening(short_tmp, HttpLimits(fresh_session=0.5)) as http:
            url = f"http://127.0.0.1:{http.port}/mcp"
            async with httpx2.AsyncClient() as client:
                answer = await client.post(url, content=_initialize(), headers=MCP_HEADERS)
                assert answer.status_code == 200
                session = answer.headers["mcp-session-id"]
                assert len(http.app.sessions) == 1
                await eventually(lambda: len(http.app.sessions) == 0)
                gone = await client.post(
                    url, content=_initialize(2), headers={**MCP_HEADERS, "mcp-session-id": session}
                )
                assert gone.status_code == 404

    async def test_a_session_in_use_keeps_the_long_idle_timeout(self, short_tmp: Path) -> None:
        """Its follow-up requests (initialized, a listing) took it past the fresh period's rule."""
        async with (
            listening(short_tmp, HttpLimits(fresh_session=0.3)) as http,
            Client(f"http://127.0.0.1:{http.port}/mcp", mode="legacy") as client,
        ):
            assert (await client.list_tools()).tools == []
            (transport,) = http.app.sessions._server_instances.values()
            assert transport.idle_scope is not None
            assert transport.idle_scope.deadline - anyio.current_time() > 60
