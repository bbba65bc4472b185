"""Quick calls: plain tool calls answered in the HTTP connection's callbacks (:mod:`..quick`).

Which requests are held until their body is whole is decided at their headers, on the real
app's parts (no extensions needed); the calls that are not held, or that a child cannot take at
once, go the ASGI way and are answered as JSON all the same, by a real daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from supervisor.gateway.http import HttpLimits
from supervisor.gateway.http.listener import build_app
from supervisor.gateway.http.quick import MAX_BODY
from supervisor.gateway.server import Gateway
from tests.gateway.http.test_connections import _echo, _requests, _session
from tests.gateway.http.test_limits import _NoExtensions
from tests.harness import RICH, Daemon
from tests.harness.inprocess import in_process_daemon

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PORT = 8765


def _scope(method: str = "POST", path: str = "/mcp", **headers: str) -> dict[str, object]:
    given = {"host": f"127.0.0.1:{PORT}", "content-length": "100"}
    given.update({name.replace("_", "-"): value for name, value in headers.items()})
    raw = [(name.encode(), value.encode()) for name, value in given.items() if value]
    return {"type": "http", "method": method, "path": path, "headers": raw}


class TestWhatIsHeld:
    @pytest.fixture
    def wants(self, tmp_path: Path) -> Callable[..., bool]:
        def wants(scope: dict[str, object], token: str | None = None, max_body: int = 64 << 20) -> bool:
            app = build_app(
                Gateway(_NoExtensions(), spool_dir=tmp_path),
                host="127.0.0.1",
                port=PORT,
                token=token,
                metrics=str,
                health=dict,
                limits=HttpLimits(max_body=max_body),
            )
            return app.quick.wants(scope)

        return wants

    def test_a_post_to_mcp_or_a_profile_with_a_small_body_of_known_length(self, wants) -> None:
        assert wants(_scope())
        assert wants(_scope(path="/mcp/coding"))  # the profile's name is checked with the body
        assert wants(_scope(content_length=str(MAX_BODY)))

    @pytest.mark.parametrize(
        "scope",
        [
            pytest.param(_scope(method="GET"), id="a GET"),
            pytest.param(_scope(path="/metrics"), id="another path"),
            pytest.param(_scope(content_length=""), id="no length"),
            pytest.param(_scope(content_length=str(MAX_BODY + 1)), id="a big body"),
            pytest.param(_scope(transfer_encoding="chunked"), id="chunks"),
            pytest.param(_scope(expect="100-continue"), id="a 100 Continue to send first"),
            pytest.param(_scope(host="evil.example:8765"), id="a Host the Guard refuses"),
            pytest.param(_scope(origin="http://evil.example"), id="an Origin the Guard refuses"),
        ],
    )
    def test_anything_else_goes_the_asgi_way_at_once(self, wants, scope: dict[str, object]) -> None:
        assert not wants(scope)

    def test_nor_a_request_without_the_token_or_over_the_body_limit(self, wants) -> None:
        assert not wants(_scope(), token="secret")
        assert wants(_scope(authorization="Bearer secret"), token="secret")
        assert not wants(_scope(), max_body=99)  # the budget answers 413 before reading it


class TestTheAsgiWay:
    async def test_calls_not_held_are_answered_as_json_all_the_same(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """A call with a body over the limit of held ones, and one sent in chunks: the fast path
        in the request's task answers them, as it did before quick calls."""
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        text = "x" * (MAX_BODY + 1000)
        big = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "rich__echo", "arguments": {"text": text}},
            }
        ).encode()
        chunked = _echo(8)
        host, port = http.url.removeprefix("http://").split(":")
        common = "".join(f"{name}: {value}\r\n" for name, value in session.headers.items())
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            answers = _Answers(sock)
            sock.sendall(_requests(http.url, session.headers, [big]))
            first = answers.next()
            head = f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ntransfer-encoding: chunked\r\n{common}\r\n"
            sock.sendall(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunked), chunked))
            second = answers.next()
            assert not answers.left  # nothing but the two answers
        assert first["id"] == 7 and first["result"]["content"][0]["text"] == text
        assert second["id"] == 8 and second["result"]["content"][0]["text"] == "8"

    async def test_calls_sent_ahead_are_answered_in_order(self, http_gateway: Callable[..., Daemon]) -> None:
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        host, port = http.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(_requests(http.url, session.headers, [_echo(n) for n in range(1, 6)]))
            answers = _Answers(sock)
            assert [answers.next()["id"] for _ in range(5)] == [1, 2, 3, 4, 5]
            assert not answers.left  # each answered once


class TestTaken:
    async def test_a_quick_call_starts_no_task_where_the_asgi_way_starts_one_a_call(
        self, short_tmp: Path
    ) -> None:
        """What tells a quick call from the ASGI way (they answer alike): 12 plain calls on one
        connection start no task in the daemon; the same calls with chunked bodies, which the
        ASGI way serves, start at least one each."""
        async with in_process_daemon(short_tmp, {"rich": RICH}, HttpLimits()) as (_, url):
            base = url.removesuffix("/mcp")
            session = await _session(SimpleNamespace(url=base, headers={}))  # type: ignore[arg-type]
            calls = range(1, 13)  # fewer than a connection may send ahead (16)
            quick = await _tasks_started(base, session.headers, [_echo(n) for n in calls], chunked=False)
            asgi = await _tasks_started(base, session.headers, [_echo(n) for n in calls], chunked=True)
        assert quick <= 2 and asgi >= len(calls), (quick, asgi)


async def _tasks_started(base: str, headers: dict[str, str], bodies: list[bytes], *, chunked: bool) -> int:
    """Tasks the event loop started while *bodies* were POSTed on one connection and answered."""
    host, port = base.removeprefix("http://").split(":")
    common = "".join(f"{name}: {value}\r\n" for name, value in headers.items())

    def exchange() -> list[object]:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            answers = _Answers(sock)
            if chunked:
                head = (
                    f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ntransfer-encoding: chunked\r\n{common}\r\n"
                )
                for body in bodies:
                    sock.sendall(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            else:
                sock.sendall(_requests(base, headers, bodies))
            return [answers.next()["id"] for _ in bodies]

    loop = asyncio.get_running_loop()
    started = 0

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        nonlocal started
        started += 1
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(counting)
    try:
        ids = await anyio.to_thread.run_sync(exchange)
    finally:
        loop.set_task_factory(None)
    assert ids == list(range(1, len(bodies) + 1))
    return started


class TestBackPressure:
    async def test_a_client_that_does_not_read_gets_no_answers_ahead(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """A client sends calls of 50 KB answers and reads none: once the socket takes no more,
        the daemon serves no further request (its answer waits, as the ASGI way's send does),
        so neither the calls served nor the daemon's memory keep growing."""
        http = http_gateway({"rich": RICH})
        session = await _session(http)
        call = {"name": "rich__echo", "arguments": {"text": "x" * 50_000}}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}).encode()
        request = _requests(http.url, session.headers, [body])
        host, port = http.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.connect((host, int(port)))
        sock.settimeout(0.5)

        def flood() -> None:  # until the daemon stops reading (a send blocks) or 4 s went
            deadline = time.monotonic() + 4
            with contextlib.suppress(OSError):
                while time.monotonic() < deadline:
                    sock.sendall(request)

        calls = lambda: next(e["calls"] for e in http.request("health")["extensions"] if e["name"] == "rich")  # noqa: E731
        before = calls()
        flooding = threading.Thread(target=flood)
        flooding.start()
        flooding.join()
        # A send that waited 0.5 s may only mean a loaded daemon, with requests read and not yet
        # served: the count settles first (unchanged for 1 s, within 20 s), then must stay.
        served, settled, deadline = calls() - before, time.monotonic(), time.monotonic() + 20
        while time.monotonic() - settled < 1 and time.monotonic() < deadline:
            if (now := calls() - before) != served:
                served, settled = now, time.monotonic()
        assert served < 400, served  # socket buffers hold some dozens; unbounded it was thousands
        deadline = time.monotonic() + 1  # and no more are served while it still does not read
        while time.monotonic() < deadline:
            assert calls() - before == served
        sock.close()


class _Answers:
    """The answers on a socket, one by one: each a JSON body of known length (answers sent ahead
    may arrive together, in one read)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self._data = sock, b""

    def next(self) -> dict[str, object]:
        while b"\r\n\r\n" not in self._data:
            self._read()
        head, _, self._data = self._data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-type: application/json" in head, head
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(self._data) < length:
            self._read()
        body, self._data = self._data[:length], self._data[length:]
        return json.loads(body)

    @property
    def left(self) -> bytes:
        return self._data

    def _read(self) -> None:
        data = self._sock.recv(65536)
        assert data, "the connection ended"
        self._data += data
