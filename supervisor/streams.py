"""Streams read only when asked: a socket, or a pair of fds (a handed-off client's stdio).

anyio's transport-based stream (``SocketStream.from_socket``) never pauses the transport it
wraps, so asyncio kept reading a client that pipelined without reading its replies: 1.9 GB
in 30 s. Here a byte leaves the kernel only when a receive asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import anyio
import anyio.abc
import anyio.lowlevel

__all__ = ("FdStream", "Stream")


class FdStream(anyio.abc.ByteStream):
    """A stream read and written only when asked: no buffer the caller does not see.

    A byte leaves the kernel only when :meth:`receive` asks for it, and a cancelled receive or
    send leaves nothing behind (the raw UNIXSocketStream's ``add_reader(future.set_result)``
    logs InvalidStateError then). A subclass says how its fds are read (:meth:`_recv`),
    written (:meth:`_send`) and closed: a socket (:class:`Stream`), or a client's own stdin and
    stdout (the gateway's handoff).

    Resource handling: one task may receive while another sends, but never two at once of the
    same kind; the owner closes it once no receive or send is pending.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd, self._write_fd = read_fd, write_fd
        self._closed = False
        # Readiness is watched from the first receive that has to wait until nobody waits when
        # it fires: a request-answer client then costs no epoll registration per receive (the
        # loop's sock_recv adds and removes one each time). Bytes are read only for a receive.
        self._watching: asyncio.AbstractEventLoop | None = None
        self._receiving: tuple[asyncio.Future[bytes], int] | None = None  # a waiting receive, its max
        self._kept: bytes | None = None  # read for a receive cancelled before it took them: the next's
        self._writable: asyncio.Future[None] | None = None  # a send waiting for room

    def _recv(self, max_bytes: int) -> bytes:
        """Read at most *max_bytes* now (``BlockingIOError`` if none are there)."""
        raise NotImplementedError

    def _send(self, data: bytes | memoryview) -> int:
        """Write what the fd takes now (``BlockingIOError`` if none)."""
        raise NotImplementedError

    def _close_fds(self) -> None:
        raise NotImplementedError

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._kept is not None:
            data, self._kept = self._kept, None
        else:
            try:
                data = self._recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                data = await self._receive_when_readable(max_bytes)
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            else:  # it did not wait: yield all the same, or a client that never pauses holds the loop
                await anyio.lowlevel.cancel_shielded_checkpoint()  # shielded: the bytes are ours now
        if not data:
            raise anyio.EndOfStream
        return data

    async def _receive_when_readable(self, max_bytes: int) -> bytes:
        loop = asyncio.get_running_loop()
        if self._watching is None:
            loop.add_reader(self._read_fd, self._on_readable)
            self._watching = loop
        future = loop.create_future()
        self._receiving = future, max_bytes
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._kept = future.result()
            raise
        except OSError as exc:
            raise anyio.BrokenResourceError from exc
        finally:
            self._receiving = None

    def _on_readable(self) -> None:
        if self._receiving is None:  # nobody receives: stop watching, or it fires every loop round
            self._unwatch()
            return
        future, max_bytes = self._receiving
        if future.done():
            return
        # Read here, as the loop's sock_recv does: readiness seen before the last receive took
        # the bytes wakes nobody then (a wake-up, a task step and a recv each call otherwise).
        try:
            data = self._recv(max_bytes)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            future.set_exception(exc)
        else:
            future.set_result(data)

    def _unwatch(self) -> None:
        if self._watching is not None:
            self._watching.remove_reader(self._read_fd)
            self._watching = None

    async def send(self, item: bytes | memoryview) -> None:
        await anyio.lowlevel.checkpoint()
        view = memoryview(item)
        while view:
            view = view[self.send_now(view) :]
            if view:
                await self._room()

    async def _room(self) -> None:
        loop = asyncio.get_running_loop()
        self._writable = future = loop.create_future()
        loop.add_writer(self._write_fd, _wake, future)
        try:
            await future
        finally:
            if self._writable is future:  # else aclose stopped watching already
                self._writable = None
                loop.remove_writer(self._write_fd)

    def send_now(self, data: bytes | memoryview) -> int:
        """Send what the fd takes at once, without waiting; how many bytes that was.

        Error handling: ``BrokenResourceError`` if the peer is gone, ``ClosedResourceError``
        once closed.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self._send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._unwatch()  # before the fd is closed (and maybe reused)
            if self._receiving is not None and not self._receiving[0].done():
                self._receiving[0].set_exception(anyio.ClosedResourceError())  # for that receive
            if self._writable is not None:
                asyncio.get_running_loop().remove_writer(self._write_fd)
                if not self._writable.done():
                    self._writable.set_exception(anyio.ClosedResourceError())
                self._writable = None
            self._close_fds()
        await anyio.lowlevel.checkpoint()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Stream(FdStream, anyio.abc.SocketStream):
    """A connected socket as an :class:`FdStream`."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        super().__init__(sock.fileno(), sock.fileno())

    @property
    def _raw_socket(self) -> socket.socket:
        return self._sock

    def _recv(self, max_bytes: int) -> bytes:
        return self._sock.recv(max_bytes)

    def _send(self, data: bytes | memoryview) -> int:
        return self._sock.send(data)

    def _close_fds(self) -> None:
        self._sock.close()

    async def receive_with_fds(self, max_bytes: int, max_fds: int) -> tuple[bytes, list[int]]:
        """The next bytes (empty at the end), and the fds (SCM_RIGHTS) that came with them, at
        most *max_fds* (the kernel closes the others); the caller owns those fds."""
        if self._closed:
            raise anyio.ClosedResourceError
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, max_bytes, max_fds)
            except (BlockingIOError, InterruptedError):
                self._unwatch()  # anyio's wait replaces our reader: the next receive watches again
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            for fd in fds:  # recv_fds (3.11) drops its flags: no MSG_CMSG_CLOEXEC
                os.set_inheritable(fd, False)
            return data, fds

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
