"""connect's event loop: a few non-blocking fds on ``selectors``, without asyncio.

connect moves bytes between three fds and otherwise only waits, with a deadline, for one thing
at a time. asyncio would cost it nearly half its memory (its import pulls in ``ssl`` and
OpenSSL) and most of its start-up, for nothing it needs. Here :class:`Loop` runs the ready
fds' callbacks until a condition holds or a deadline passes, and :class:`Channel` is one fd:
what it reads goes to a callback as it comes, what is written to it that the fd does not take
at once is buffered and written as it drains, with a high-water mark to tell the writer to
wait. Regular files (stdin from a file, stdout to one) cannot be polled: they are always
ready, and served in turn with the others.

Resource handling: a channel owns its fd and closes it once (``close`` after its buffer is
written, ``abort`` at once); its ``on_lost`` runs once, from the loop, never from inside the
call that closed it, as asyncio's ``connection_lost`` does.
"""

from __future__ import annotations

import errno
import fcntl
import os
import selectors
import stat
import time
from collections import deque
from collections.abc import Callable

__all__ = ("READ_SIZE", "Channel", "Loop")

READ_SIZE = 1 << 18  # bytes per read, as asyncio's transports read
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})


def _write_only_pipe(fd: int) -> bool:
    """A pipe open for writing only turns readable when its reader goes; a terminal, a socket or
    a FIFO open read-write turns readable with input too, so only this one is watched."""
    write_only = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
    return write_only and stat.S_ISFIFO(os.fstat(fd).st_mode)


class Loop:
    """Serves its channels while a caller waits in :meth:`run_until`; single-threaded."""

    def __init__(self) -> None:
        # Every read lands here, then only what was read is copied out: os.read(fd, READ_SIZE)
        # would map, shrink and unmap 256 KiB per read (three system calls and a page fault),
        # twice per call, as glibc serves allocations that big with mmap.
        self.read_buffer = memoryview(bytearray(READ_SIZE))
        self._selector = selectors.DefaultSelector()
        self._always: dict[Channel, int] = {}  # unpollable channels and what they want
        self._soon: deque[Callable[[], None]] = deque()

    def run_until(self, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Serve the channels until *done()*; False if *timeout* seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.settle()
            if done():
                return True
            wait = None
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return False
            if self._always:
                wait = 0
            for key, events in self._selector.select(wait):
                key.data.ready(events)
            for channel, events in list(self._always.items()):
                channel.ready(events)

    def pause(self, seconds: float) -> None:
        """Serve the channels for *seconds*."""
        self.run_until(lambda: False, seconds)

    def settle(self) -> None:
        """Run the callbacks that were put off until the current one returned."""
        while self._soon:
            self._soon.popleft()()

    def soon(self, callback: Callable[[], None]) -> None:
        self._soon.append(callback)

    def can_poll(self, fd: int) -> bool:
        """Whether epoll can watch *fd*: pipes, sockets, terminals, most devices; not regular
        files or /dev/null (EPERM), which are always ready instead."""
        try:
            self._selector.register(fd, _READ)
        except PermissionError:
            return False
        self._selector.unregister(fd)
        return True

    def watch(self, channel: Channel, events: int) -> None:
        """Call ``channel.ready`` when its fd is ready for *events* (0: no longer)."""
        if not channel.pollable:
            if events:
                self._always[channel] = events
            else:
                self._always.pop(channel, None)
            return
        try:
            registered = self._selector.get_key(channel.fd).events
        except KeyError:
            registered = 0
        if events == registered:
            return
        if not events:
            self._selector.unregister(channel.fd)
        elif registered:
            self._selector.modify(channel.fd, events, channel)
        else:
            self._selector.register(channel.fd, events, channel)

    def close(self) -> None:
        self._selector.close()


class Channel:
    """One fd in the loop: reads handed to *on_data*, writes buffered past what the fd takes.

    *on_data* (None: never read) gets every chunk read; end of input closes the channel.
    *on_pressure* is told True when the unwritten bytes pass *high*, False once they are down
    to *low*. *on_lost* is told once that the channel closed: None, or the error that closed it.
    *watch_hangup*: when *fd* is a pipe only written to, notice its reader going even while idle.
    """

    def __init__(
        self,
        loop: Loop,
        fd: int,
        *,
        on_data: Callable[[bytes], None] | None = None,
        on_lost: Callable[[OSError | None], None] | None = None,
        on_pressure: Callable[[bool], None] | None = None,
        high: int = 64 << 10,
        low: int = 16 << 10,
        watch_hangup: bool = False,
    ) -> None:
        self.loop, self.fd = loop, fd
        self.on_data, self.on_lost, self.on_pressure = on_data, on_lost, on_pressure
        self.high, self.low = high, low
        self.pollable = loop.can_poll(fd)
        os.set_blocking(fd, False)
        self.reading = on_data is not None
        self.full = False
        self.closed = False
        self._hangup = watch_hangup and on_data is None and _write_only_pipe(fd)
        self._closing = False
        self._out: deque[bytes | memoryview] = deque()
        self._buffered = 0
        self._update()

    @property
    def buffered(self) -> int:
        """Bytes written to the channel that its fd has not taken yet."""
        return self._buffered

    @property
    def closing(self) -> bool:
        return self._closing or self.closed

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write *data* after everything before it; ignored once closing. What the fd does not take
        at once is kept as a view of *data*: a bytearray passed here must not change after."""
        if self.closing or not data:
            return
        if not self._out:
            try:
                written = os.write(self.fd, data)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                self._lose(exc)
                return
            if written == len(data):
                return
            data = memoryview(data)[written:]
        self._out.append(data)
        self._buffered += len(data)
        self._update()
        if not self.full and self._buffered > self.high:
            self.full = True
            if self.on_pressure is not None:
                self.on_pressure(True)

    def pause_reading(self) -> None:
        self._set_reading(False)

    def resume_reading(self) -> None:
        self._set_reading(True)

    def close(self) -> None:
        """Stop reading; close the fd once what is buffered is written."""
        if self.closing:
            return
        self._closing, self.reading = True, False
        if not self._out:
            self._lose(None)
        else:
            self._update()

    def abort(self) -> None:
        """Close the fd now; what is buffered is dropped."""
        if not self.closed:
            self._lose(None)

    def ready(self, events: int) -> None:
        """The loop's call: the fd is ready for *events*."""
        if self.closed:
            return  # closed by an earlier callback of the same round
        if events & _READ:
            if self.reading:
                self._read()
            elif self._hangup:  # a write-only pipe turns readable when its reader is gone
                self._lose(BrokenPipeError(errno.EPIPE, "the reader closed the pipe"))
                return
        if events & _WRITE and not self.closed:
            self._flush()

    def _set_reading(self, reading: bool) -> None:
        if self.on_data is not None and not self.closing and reading != self.reading:
            self.reading = reading
            self._update()

    def _read(self) -> None:
        buffer = self.loop.read_buffer
        try:
            data = bytes(buffer[: os.readv(self.fd, [buffer])])
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(None if exc.errno in _GONE else exc)
            return
        if not data:
            self._lose(None)  # end of input
            return
        assert self.on_data is not None
        self.on_data(data)

    def _flush(self) -> None:
        while self._out:
            head = self._out[0]
            try:
                written = os.write(self.fd, head)
            except BlockingIOError:
                break
            except OSError as exc:
                self._lose(exc)
                return
            self._buffered -= written
            if written < len(head):
                self._out[0] = memoryview(head)[written:]
                break
            self._out.popleft()
        if self.full and self._buffered <= self.low:
            self.full = False
            if self.on_pressure is not None:
                self.on_pressure(False)
        if self._closing and not self._out and not self.closed:
            self._lose(None)
        else:
            self._update()

    def _update(self) -> None:
        events = (_READ if self.reading or self._hangup else 0) | (_WRITE if self._out else 0)
        self.loop.watch(self, 0 if self.closed else events)

    def _lose(self, exc: OSError | None) -> None:
        self.loop.watch(self, 0)
        self.closed, self.reading = True, False
        self._out.clear()
        self._buffered = 0
        os.close(self.fd)
        if self.on_lost is not None:
            on_lost = self.on_lost
            self.loop.soon(lambda: on_lost(exc))
