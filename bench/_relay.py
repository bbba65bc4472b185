"""Bare byte relays: the least a process on the call path can cost, for ``bench/gateway.py``.

Each relay forwards bytes the moment they arrive, in asyncio protocol callbacks, and does
nothing else: no parsing, no ids, no bounds, no flow control. A path through them is the floor
under any design that puts the same processes between a client and its server.

    python bench/_relay.py hop CMD...          stdio <-> a spawned CMD's stdio (one extra process)
    python bench/_relay.py serve SOCK CMD...   a unix socket; each connection gets its own CMD
    python bench/_relay.py pump SOCK           stdio <-> SOCK (with ``serve``: two extra processes)
"""

from __future__ import annotations

import asyncio
import os
import sys
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
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
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


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "hop":
        asyncio.run(hop(rest))
    elif mode == "serve":
        asyncio.run(serve(rest[0], rest[1:]))
    else:
        asyncio.run(pump(rest[0]))
