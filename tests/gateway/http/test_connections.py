"""HTTP connections against a real daemon: what one connection may make the daemon hold.

The listener's other bounds (connections, deadlines, bodies, sessions) are in test_limits.py on
an in-process listener; this needs a daemon with an extension, for the fast path.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
from collections.abc import Callable

import anyio
import httpx2
import pytest

from tests.gateway.http.test_fastcalls import Raw
from tests.harness import RICH, Daemon

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ECHO = b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"rich__echo","arguments":{}}}'


def _pipeline(url: str, headers: dict[str, str], body: bytes, seconds: float) -> int:
    """Send *body* again and again on one connection without waiting for the answers (reading them
    all the while) for *seconds*; how many were answered."""
    host, port = url.removeprefix("http://").split(":")
    head = f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    requests = (head.encode() + body) * 1000
    answered = 0
    with socket.create_connection((host, int(port))) as sock:

        def read() -> None:
            nonlocal answered
            with contextlib.suppress(OSError):
                while chunk := sock.recv(1 << 16):
                    answered += chunk.count(b"HTTP/1.1 200")

        def send() -> None:
            with contextlib.suppress(OSError):
                while True:
                    sock.sendall(requests)  # blocks while the daemon does not read: it is not a fault

        threads = [threading.Thread(target=work, daemon=True) for work in (read, send)]
        for thread in threads:
            thread.start()
        threads[0].join(seconds)  # the reader ends only if the daemon closes the connection
        sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(10)
    return answered


class TestPipelining:
    @pytest.mark.parametrize(
        "body",
        [ECHO, b'{"jsonrpc":"2.0","id":9,"method":"tools/list"}'],
        ids=["fast path", "sdk path"],
    )
    async def test_requests_sent_ahead_of_their_answers_are_read_as_they_are_served(
        self,
        http_gateway: Callable[..., Daemon],
        body: bytes,
    ) -> None:
        """A client pipelining requests on one connection, reading the answers: the daemon reads it
        as it serves it. Before, uvicorn resumed reading for every body read and every answer, and
        h11 took one more 256 KiB read each time: 1.3 GB in 15 s (and 45 answers a second)."""
        http = http_gateway({"rich": RICH})
        async with httpx2.AsyncClient(timeout=10) as client:
            session = Raw(client, http.url + "/mcp")
            await session.open()
        before = peak = http.rss()
        async with anyio.create_task_group() as tg:
            answered: list[int] = []

            async def flood() -> None:
                flood = functools.partial(_pipeline, http.url, session.headers, body, 4.0)
                answered.append(await anyio.to_thread.run_sync(flood))

            tg.start_soon(flood)
            while not answered:
                peak = max(peak, http.rss())
                await anyio.sleep(0.1)  # sampling the daemon's memory while the flood lasts
        assert answered[0] > 100
        assert peak - before < 64 << 20, f"the daemon grew {(peak - before) >> 20} MiB"
        assert http.status()["rich"]["state"] == "running"
