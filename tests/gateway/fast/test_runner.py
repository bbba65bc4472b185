"""The one runner of plain calls (:mod:`supervisor.gateway.fast.runner`): the calls of every
front-end are one table, which each cancel and each client's going empties of theirs alone."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx2
import pytest

from supervisor.gateway.unix import MAX_IN_FLIGHT
from tests.gateway.fast.test_fastpath import _call, _raw_client
from tests.gateway.http.test_fastcalls import WAIT, Raw
from tests.gateway.http.test_fastcalls import _call as _http_call
from tests.harness import RICH, Daemon, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _running(daemon: Daemon) -> int:
    return daemon.request("health")["gateway"]["fast_calls"]


class TestOneTable:
    async def test_both_listeners_calls_leave_it_as_their_clients_cancel_or_go(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """Three calls of an mcp.sock client and two of an HTTP session wait in the child; a
        cancel of each frees its call alone, and each client's going frees its own."""
        http = http_gateway({"rich": RICH})
        host, port = http.url.removeprefix("http://").split(":")
        posts: list[socket.socket] = []
        try:
            async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
                session = Raw(client, http.url + "/mcp")
                await session.open()
                for request_id in (7, 8):  # a connection each: one request in flight per connection
                    body = _http_call(request_id, "rich__wait", seconds=60)
                    head = f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
                    head += "".join(f"{k}: {v}\r\n" for k, v in session.headers.items()) + "\r\n"
                    posts.append(socket.create_connection((host, int(port)), timeout=WAIT))
                    posts[-1].sendall(head.encode() + body)
                async with _raw_client(http, list_tools=True) as raw:
                    for request_id in (1, 2, 3):
                        await raw.send(_call(request_id, name="rich__wait", arguments={"seconds": 60}))
                    await eventually(lambda: http.status()["rich"]["in_flight"] == 5, within=WAIT)
                    assert _running(http) == 5

                    params = {"requestId": 1, "reason": "test"}
                    await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
                    await eventually(lambda: _running(http) == 4, within=WAIT)
                    assert await session.cancel(7) == 202
                    assert posts[0].recv(4096).startswith(b"HTTP/1.1 202")  # no answer but 202
                    await eventually(lambda: _running(http) == 3, within=WAIT)

                    answer = await raw.call("rich__echo", text="meanwhile")  # served beside them
                    assert answer["result"]["content"][0]["text"] == "meanwhile"
                await eventually(lambda: _running(http) == 1, within=WAIT)  # the mcp.sock client went
        finally:
            for sock in posts:
                sock.close()
        await eventually(lambda: _running(http) == 0, within=WAIT)  # the HTTP one too
        await eventually(lambda: http.status()["rich"]["in_flight"] == 0, within=WAIT)

    async def test_it_holds_no_more_than_a_client_has_in_flight(self, gateway: Callable[..., Daemon]) -> None:
        """A client sending calls past its slots is not read until one is answered: the table
        stops at its slots, and every call is answered in the end."""
        daemon = gateway({"rich": RICH})
        ids = range(100, 100 + 2 * MAX_IN_FLIGHT)
        async with _raw_client(daemon, list_tools=True) as raw:
            for request_id in ids:  # the socket's buffer holds them all: nothing blocks here
                await raw.send(_call(request_id, name="rich__wait", arguments={"seconds": 8}))
            await eventually(lambda: _running(daemon) == MAX_IN_FLIGHT, within=WAIT)
            assert daemon.status()["rich"]["in_flight"] == MAX_IN_FLIGHT  # the rest were not read
            answered = {(await raw.reply(None, any_id=True))["id"] for _ in ids}
            assert answered == set(ids)
        assert daemon.request("health")["gateway"] == {"fast_calls": 0}
