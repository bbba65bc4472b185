"""Whole lines to one client of the stdio framing, from tasks and from callbacks alike.

A line goes out whole or not at all: whoever is mid-line holds :attr:`Outbound.lock` (the
writer task, a fast call's task, or, from a callback, which no task owns, hence a semaphore and
not a lock, the task finishing its line). Usually the socket takes a line at once and no lock
is taken. A client that leaves a line untaken for the timeout is *stuck*; one whose socket
broke is *gone*: either ends its connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.abc

__all__ = ("LineStream", "Outbound")


class LineStream(Protocol):
    """A client's output: a socket, or a handed-over client's own stdout."""

    def send_now(self, data: bytes | memoryview) -> int: ...

    async def send(self, item: bytes | memoryview) -> None: ...


class Outbound:
    """The lines to one client over *stream* (replaced by a handoff); *gone* and *stuck* end its
    connection; :attr:`tasks` (the connection's task group) finishes what a callback began."""

    def __init__(
        self,
        stream: LineStream,
        timeout: float,
        *,
        gone: Callable[[], None],
        stuck: Callable[[], None],
        ending: Callable[[], bool],
    ) -> None:
        self.stream = stream
        self.lock = anyio.Semaphore(1, fast_acquire=True)
        self.tasks: anyio.abc.TaskGroup | None = None
        self._timeout = timeout
        self._gone, self._stuck, self._ending = gone, stuck, ending

    async def transmit(self, data: bytes) -> bool:
        """Send *data* whole; False, with the connection ended, if the client is gone or not reading."""
        sent = 0
        try:
            if self.lock.value:  # nobody is mid-line: usually all of it goes at once, no lock
                sent = self.stream.send_now(data)
                if sent == len(data):
                    return True
                if sent:  # the rest before any other line: the lock is free and nothing ran since
                    self.lock.acquire_nowait()
                    try:
                        return await self._send_rest(data, sent)
                    finally:
                        self.lock.release()
            async with self.lock:
                return await self._send_rest(data, sent)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._gone()
            return False

    def transmit_soon(self, data: bytes, sent_out: Callable[[bool], None]) -> None:
        """:meth:`transmit` from a callback: at once when the socket takes the line, else in a
        task; then *sent_out*, told whether the line went out whole (not when the connection
        ends first). Until then the request's slot stays held, so a client that reads slowly
        stops being read, as on the awaited path."""
        if self.tasks is None or self._ending():
            sent_out(False)  # the connection is ending
            return
        if self.lock.value:
            try:
                sent = self.stream.send_now(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._gone()
                sent_out(False)
                return
            if sent == len(data):
                sent_out(True)
                return
            if sent:  # the rest before any other line
                self.lock.acquire_nowait()
                self.tasks.start_soon(self._finish_line, data, sent, sent_out)
                return
        self.tasks.start_soon(self._transmit_then, data, sent_out)

    async def _transmit_then(self, data: bytes, sent_out: Callable[[bool], None]) -> None:
        went = False
        try:
            went = await self.transmit(data)
        finally:
            sent_out(went)

    async def _finish_line(self, data: bytes, sent: int, sent_out: Callable[[bool], None]) -> None:
        went = False
        try:
            went = await self._send_rest(data, sent)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._gone()
        finally:
            self.lock.release()
            sent_out(went)

    async def _send_rest(self, data: bytes, sent: int) -> bool:
        """What :meth:`transmit` could not send at once, the lock held."""
        # Whole or not at all: a cancelled caller must not leave half a line on the socket.
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout) as timer:
            await self.stream.send(memoryview(data)[sent:])
        if timer.cancelled_caught:
            self._stuck()
            return False
        return True
