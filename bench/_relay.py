"""Bare byte relays: the least a process on the call path can cost, for ``bench/gateway.py``.

Each relay forwards bytes the moment they arrive, in asyncio protocol callbacks, and does
nothing else: no parsing, no ids, no bounds, no flow control. A path through them is the floor
under any design that puts the same processes between a client and its server.

The stdio and unix-socket relays run on asyncio's own loop, as the floors of issue 19's goals
were measured; ``RELAY_LOOP=uvloop`` runs them on uvloop, the daemon's loop, where a relay
costs less than half as much. The HTTP relay always runs on uvloop.

    python bench/_relay.py hop CMD...          stdio <-> a spawned CMD's stdio (one extra process)
    python bench/_relay.py serve SOCK CMD...   a unix socket; each connection gets its own CMD
    python bench/_relay.py pump SOCK           stdio <-> SOCK (with ``serve``: two extra processes)
    python bench/_relay.py http PORT CMD...    streamable HTTP on 127.0.0.1:PORT (0: any, printed), a
                                               CMD per MCP session (2026-07-28: per connection)

The HTTP relay does the least an HTTP gateway must: it parses each request (httptools, as the
daemon's listener does) and each message's id, to answer a POST with its own response; one
write per answer (JSON, never SSE), no GET stream, no checks, no bounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import uuid
from collections.abc import Callable


class _Forward(asyncio.Protocol):
    """Everything received goes to *write*; *lost* is called when the source closes."""

    def __init__(self, write: Callable[[bytes], object], lost: Callable[[], None]) -> None:
        self._write, self._lost = write, lost

    def data_received(self, data: bytes) -> None:
        self._write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()


async def _spawn(
    command: list[str], out: Callable[[bytes], object], lost: Callable[[], None]
) -> asyncio.WriteTransport:
    """*command* running, its stdout forwarded to *out*; returns its stdin."""
    loop = asyncio.get_running_loop()
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    await asyncio.create_subprocess_exec(
        *command, stdin=stdin_r, stdout=stdout_w, stderr=asyncio.subprocess.DEVNULL
    )
    os.close(stdin_r)
    os.close(stdout_w)
    stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(stdin_w, "wb", 0))
    await loop.connect_read_pipe(lambda: _Forward(out, lost), os.fdopen(stdout_r, "rb", 0))
    return stdin


async def _stdio(write: Callable[[bytes], object], lost: Callable[[], None]) -> asyncio.WriteTransport:
    """This process's stdin forwarded to *write*; returns its stdout."""
    loop = asyncio.get_running_loop()
    stdout, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", 0))
    await loop.connect_read_pipe(lambda: _Forward(write, lost), os.fdopen(0, "rb", 0))
    return stdout


async def hop(command: list[str]) -> None:
    done = asyncio.Event()
    stdout: list[asyncio.WriteTransport] = []
    child_stdin = await _spawn(command, lambda data: stdout[0].write(data), done.set)
    stdout.append(await _stdio(child_stdin.write, child_stdin.close))
    await done.wait()


async def serve(path: str, command: list[str]) -> None:
    loop = asyncio.get_running_loop()

    class Client(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's
            self.early: list[bytes] = []  # what arrives before the child's stdin exists
            self.child: asyncio.WriteTransport | None = None
            self.starting = loop.create_task(self._start())

        async def _start(self) -> None:
            self.child = await _spawn(command, self.transport.write, self.transport.close)
            for data in self.early:
                self.child.write(data)

        def data_received(self, data: bytes) -> None:
            if self.child is None:
                self.early.append(data)
            else:
                self.child.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.child is not None:
                self.child.close()

    server = await loop.create_unix_server(Client, path)
    async with server:
        await server.serve_forever()


async def pump(path: str) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    stdout: list[asyncio.WriteTransport] = []
    sock, _ = await loop.create_unix_connection(
        lambda: _Forward(lambda data: stdout[0].write(data), done.set), path
    )
    stdout.append(await _stdio(sock.write, done.set))
    await done.wait()


class _Session:
    """One MCP session of the HTTP relay: its child, and the POSTs waiting for an answer, by id."""

    def __init__(self) -> None:
        self.child: asyncio.WriteTransport | None = None
        self.starting: asyncio.Task[None] | None = None
        self.early: list[bytes] = []  # lines sent before the child's stdin exists
        self.waiting: dict[object, tuple[asyncio.Transport, bytes]] = {}  # id -> (client, extra headers)
        self._partial = b""

    def send(self, line: bytes) -> None:
        if self.child is None:
            self.early.append(line)
        else:
            self.child.write(line)

    def from_child(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "method" in message:
                continue  # a notification or a request of the child's: no GET stream to put it on
            waiting = self.waiting.pop(message.get("id"), None)
            if waiting is not None:
                _answer(waiting[0], b"200 OK", line, waiting[1])


def _answer(transport: asyncio.Transport, status: bytes, body: bytes, extra: bytes = b"") -> None:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
    transport.write(head % (status, len(body), extra) + body)


async def http(port: int, command: list[str]) -> None:
    import httptools

    loop = asyncio.get_running_loop()
    sessions: dict[bytes, _Session] = {}

    async def start(session: _Session) -> None:
        session.child = await _spawn(command, session.from_child, lambda: None)
        for line in session.early:
            session.child.write(line)

    class Client(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's
            self.parser = httptools.HttpRequestParser(self)
            self.session_id, self.body = b"", b""
            self.own: _Session | None = None  # a 2026-07-28 client's (no session): this connection's

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.own is not None and self.own.child is not None:
                self.own.child.close()

        def on_message_begin(self) -> None:
            self.session_id, self.body = b"", b""

        def on_header(self, name: bytes, value: bytes) -> None:
            if name.lower() == b"mcp-session-id":
                self.session_id = value

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            method = self.parser.get_method()
            if method == b"DELETE":
                session = sessions.pop(self.session_id, None)
                if session is not None and session.child is not None:
                    session.child.close()
                _answer(self.transport, b"200 OK", b"")
            elif method != b"POST":
                _answer(self.transport, b"405 Method Not Allowed", b"")
            else:
                self._post()

        def _post(self) -> None:
            message = json.loads(self.body)
            extra = b""
            if message.get("method") == "initialize":
                self.session_id = uuid.uuid4().hex.encode()
                sessions[self.session_id] = session = _Session()
                session.starting = loop.create_task(start(session))
                extra = b"mcp-session-id: %s\r\n" % self.session_id
            if self.session_id:
                session = sessions[self.session_id]
            else:
                if self.own is None:
                    self.own = _Session()
                    self.own.starting = loop.create_task(start(self.own))
                session = self.own
            if "id" in message and "method" in message:
                session.waiting[message["id"]] = (self.transport, extra)
            else:
                _answer(self.transport, b"202 Accepted", b"")
            session.send(self.body + b"\n")

    server = await loop.create_server(Client, "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)  # the port, for a caller that asked for any (0)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    mode, rest = sys.argv[1], sys.argv[2:]
    run = uvloop.run if os.environ.get("RELAY_LOOP") == "uvloop" else asyncio.run
    if mode == "hop":
        run(hop(rest))
    elif mode == "serve":
        run(serve(rest[0], rest[1:]))
    elif mode == "http":
        uvloop.run(http(int(rest[0]), rest[1:]))  # the daemon's loop, as its HTTP listener runs on it
    else:
        run(pump(rest[0]))
