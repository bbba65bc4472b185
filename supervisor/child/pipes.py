"""A child's three pipes: stdout split into messages (spooling media as it streams), stdin fed
from one outbox, stderr kept as lines; and its exit, noticed at once.

Linear in the bytes read (a long line is not rescanned per chunk), bounded (a line over
``max_message_bytes`` ends the connection, stderr lines are cut at :data:`STDERR_LINE_CAP`), and
each pump is one task of the connection's task group (:func:`supervisor.child.connection.connect`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import pydantic_core
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from supervisor.child.rawcalls import MARK, RawCalls
from supervisor.process.children import ChildProcess
from supervisor.upstream.spool import ExtensionSpool
from supervisor.upstream.wire import InboundRequests, Watched

__all__ = (
    "EXIT_FLUSH_GRACE",
    "STDERR_LINE_CAP",
    "LineSplitter",
    "StdoutPump",
    "pump_stderr",
    "pump_stdin",
    "watch_exit",
)

log = structlog.get_logger(__name__)

STDERR_LINE_CAP = 8 << 10  # longer stderr lines are truncated, not buffered
EXIT_FLUSH_GRACE = 0.25  # after an exit, wait this long for bytes still in the pipe (not for spooling)


class LineSplitter:
    """Cuts a byte stream into lines in linear time, holding at most one partial line.

    A partial line is kept as 4 MiB segments plus a tail, and joined once, into ``bytes``,
    when its newline comes. A big message so costs two copies at the peak (the segments and
    the joined line), and the segments are big enough to live in their own mappings, which
    go back to the system when freed whatever the chunk sizes were. ``bytes``, unlike a
    ``bytearray``, is parsed without another copy.
    """

    SEGMENT = 4 << 20

    def __init__(self) -> None:
        self._segments: list[bytes] = []
        self._tail = bytearray()
        self.pending = 0  # bytes of the partial line

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            if self.pending:
                lines.append(b"".join((*self._segments, self._tail, chunk[start:newline])))
                self.discard()
            else:
                lines.append(chunk[start:newline])
            start = newline + 1
        if start < len(chunk):
            self._tail += memoryview(chunk)[start:]
            self.pending += len(chunk) - start
            if len(self._tail) >= self.SEGMENT:
                self._segments.append(bytes(self._tail))
                self._tail = bytearray()
        return lines

    def discard(self) -> None:
        self._segments, self._tail, self.pending = [], bytearray(), 0

    def take_partial(self) -> bytes:
        """Hand out the partial line (an over-long one, or what remains at EOF) and forget it."""
        partial = b"".join((*self._segments, self._tail))
        self.discard()
        return partial


Aside = Callable[["SessionMessage | Exception"], bool]


class StdoutPump:
    """Delivers the child's stdout lines as messages; once the session is gone or broken, drains.

    *aside* is offered each message first, in order, and returns True for one it took itself
    (a malformed line, a ``list_changed``): those cost a call, not a task of the session's
    each, so a child flooding them delays its own answers by the pipe's worth, not by seconds.
    """

    def __init__(
        self,
        child: ChildProcess,
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        max_message_bytes: int,
        end: Callable[[str | None], None],
        spool: ExtensionSpool | None,
        inbound: InboundRequests,
        raw: RawCalls,
        watched: Watched,
        aside: Aside,
    ) -> None:
        self.child, self.sink, self.max_message_bytes, self.end = child, sink, max_message_bytes, end
        self.aside = aside
        self.spool = spool
        self.inbound = inbound
        self.raw = raw
        self.watched = watched
        self.eof = anyio.Event()
        self.settled = anyio.Event()  # after stop_delivering(): what was read is delivered
        self.waiting = False  # parked in read(): everything read so far has been handled
        self._closing = False
        self._delivering = True  # False once the session is gone or the child broke the framing
        self._splitter = LineSplitter()

    def caught_up(self) -> bool:
        """All bytes the child wrote are delivered (or discarded): nothing more is on its way."""
        return self.eof.is_set() or (self.waiting and self.child.stdout.drained())

    def stop_delivering(self) -> None:
        """Deliver what was already read (however long spooling it takes), then discard the rest."""
        self._closing = True
        if self.waiting or self.eof.is_set():  # nothing in hand
            self.settled.set()

    async def run(self) -> None:
        splitter = self._splitter
        final_read = False
        self.child.stdout.take_at_once = self._take_at_once
        try:
            while True:
                if self._closing and not self.settled.is_set():
                    # Once more for what is buffered on our side of the pipe, then no more.
                    if not self._delivering or final_read or not self.child.stdout.buffered:
                        self._delivering = False
                        self.settled.set()
                    final_read = True
                self.waiting = True
                chunk = await self.child.stdout.read()
                self.waiting = False
                if not chunk:
                    break
                if not self._delivering:
                    continue
                lines = splitter.feed(chunk)
                del chunk
                limit = self.max_message_bytes
                if splitter.pending > limit or any(len(line) > limit for line in lines):
                    self._delivering = False
                    lines.clear()
                    splitter.discard()
                    log.error("extension.message_too_large", limit=limit)
                    self.end(f"it sent a message over the {limit}-byte limit")
                    continue
                self._delivering = await self._deliver(lines)
        finally:
            self.child.stdout.take_at_once = None
            self.waiting = False
            self.eof.set()
            self.settled.set()
        if self._delivering and not self._closing:  # EOF: an exit explains itself; give its event a moment
            with anyio.move_on_after(EXIT_FLUSH_GRACE):
                await self.child.exited.wait()
            self.end(None if self.child.exited.is_set() else "it closed its stdout")

    def _take_at_once(self, chunk: bytes) -> bool:
        """Route a chunk of whole lines that all answer raw calls (or report their progress) in
        the pipe's callback, sparing a wake-up of :meth:`run` per call; False, with nothing
        done, for any other chunk (run() then reads it as usual). Only while run() waits with
        nothing in hand, so the order of lines is kept."""
        if not (self.waiting and self._delivering) or self._closing or self._splitter.pending:
            return False
        if not chunk.endswith(b"\n") or len(chunk) > self.max_message_bytes:
            return False
        messages = []
        for line in chunk[:-1].split(b"\n"):
            if MARK not in line or (self.spool is not None and self.spool.needs_look(len(line))):
                return False
            message = _parse_plain(line)
            if not self.raw.claims(message):
                return False
            messages.append(message)
        for message in messages:
            try:
                self._route(message)
            except Exception:  # a bug of ours: never let it out into the loop, which would close the pipe
                log.exception("extension.route_crashed")
        return True

    async def _deliver(self, lines: list[bytes]) -> bool:
        lines.reverse()
        while lines:
            line = lines.pop()
            if not line or line.isspace():
                continue
            if self.spool is not None and self.spool.needs_look(len(line)):
                box = [line]  # the worker thread gets the only reference: the line is freed once parsed
                del line
                parsed = await anyio.to_thread.run_sync(_parse_and_spool, box, self.spool)
                message = parsed if isinstance(parsed, Exception) else self._route(parsed)
            elif MARK in line:  # perhaps a raw call's answer or progress: parse once, plainly
                parsed = _parse_plain(line)
                if isinstance(parsed, Exception):
                    self.raw.unreadable(line)  # its call, if it names one, fails now instead of timing out
                    message = parsed
                else:
                    message = self._route(parsed)
            else:
                message = _parse(line)
                if self.watched.ids:
                    self.watched.see(message)
            if message is None:  # a raw call's: delivered
                continue
            if not self.inbound.admit(message) or self.aside(message):
                continue
            try:
                await self.sink.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return False
        return True

    def _route(self, message: Any) -> SessionMessage | Exception | None:
        """A parsed line to its raw call (None), or validated for the session."""
        if self.watched.ids:
            self.watched.see(message)
        if self.raw.route(message):
            return None
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False))
        except ValueError as exc:
            return exc


def _parse_and_spool(box: list[bytes], spool: ExtensionSpool) -> Any:
    """Parse a large line into plain JSON and move its oversized media to the spool."""
    message = _parse_plain(box.pop())
    if not isinstance(message, Exception):
        spool.rewrite(message)
    return message


def _parse_plain(line: bytes) -> Any:
    """Plain JSON (NaN and infinities allowed, as the session's parser allows them), or the
    exception that says why not."""
    try:
        return pydantic_core.from_json(line)
    except ValueError as exc:
        return exc


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        return exc


async def pump_stdin(
    child: ChildProcess,
    source: MemoryObjectReceiveStream[bytes],
    end: Callable[[str | None], None],
    stall_after: float,
) -> None:
    """Write each encoded message; a child that reads none of one within *stall_after* s is stuck."""
    try:
        async with source:
            async for data in source:
                child.stdin.write(data)
                del data
                with anyio.move_on_after(stall_after) as waited:
                    await child.stdin.drain()
                if waited.cancelled_caught:
                    log.error("extension.stdin_stalled", seconds=stall_after)
                    end(f"it did not read its stdin for {stall_after:g}s")
                    return
    except (OSError, RuntimeError, anyio.BrokenResourceError):  # BrokenPipe, connection lost
        end("the child closed its stdin")


async def pump_stderr(child: ChildProcess, on_line: Callable[[str], None]) -> None:
    splitter = LineSplitter()
    while chunk := await child.stderr.read():
        lines = splitter.feed(chunk)
        if splitter.pending > STDERR_LINE_CAP:  # a line with no end in sight: emit what we have
            lines.append(splitter.take_partial())
        for line in lines:
            on_line(_decode(line[:STDERR_LINE_CAP]))
    if splitter.pending:
        on_line(_decode(splitter.take_partial()[:STDERR_LINE_CAP]))


async def watch_exit(child: ChildProcess, stdout: StdoutPump, end: Callable[[str | None], None]) -> None:
    await child.exited.wait()
    # Deliver what the child wrote before it died, then end the session, without waiting for
    # an EOF that a grandchild holding the pipe would delay forever. The grace is for bytes
    # still in the pipe; lines already read are delivered however long spooling them takes.
    with anyio.move_on_after(EXIT_FLUSH_GRACE):
        while not stdout.caught_up():  # noqa: ASYNC110 - a pipe's emptiness fires no event
            await anyio.sleep(0.001)
    stdout.stop_delivering()
    await stdout.settled.wait()
    end(None)


def _decode(line: bytes | bytearray) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")
