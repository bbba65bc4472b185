"""The socket to ``connect`` after a handoff: what it must know to resume the client elsewhere.

Once a client's stdio is handed over, the socket carries only the daemon's short lines
(:mod:`supervisor.gateway.hello`): the client lines that set its session up and their answers,
the ids too long for the journal, and the bye when the client ended. They are rare: one
``send`` each, at once, before the line they describe goes on (so that a daemon dying right
after still told connect); a socket that does not take one at once gets it from
:meth:`Backchannel.run`, with at most :data:`MAX_BACKLOG` bytes waiting.

connect sends nothing after the handoff: the socket's end means connect is gone, and so is
the client's session.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from supervisor.gateway.handoff.journal import Journal
from supervisor.gateway.hello import BYE, HELD_LONG, RELEASED_LONG
from supervisor.streams import Stream

__all__ = ("MAX_BACKLOG", "Backchannel", "Tracking")

MAX_BACKLOG = 4 << 20  # bytes waiting for connect to read; past it, the session ends
_BYE_TIMEOUT = 1.0


class Backchannel:
    """*stream*, the socket to connect; *end* ends the session (connect gone, or not reading)."""

    def __init__(self, stream: Stream, end: Callable[[], None], send_timeout: float) -> None:
        self._stream, self._end, self._send_timeout = stream, end, send_timeout
        self._backlog: collections.deque[bytes] = collections.deque()
        self._backlog_bytes = 0
        self._more = anyio.Event()

    def post(self, tag: bytes, payload: bytes = b"") -> None:
        """Send one line to connect: now, or as soon as the socket takes it."""
        line = tag + payload + b"\n"
        if not self._backlog:
            try:
                sent = self._stream.send_now(line)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._end()
                return
            if sent == len(line):
                return
            line = line[sent:]
        if self._backlog_bytes + len(line) > MAX_BACKLOG:
            self._end()  # connect is not reading
            return
        self._backlog.append(line)
        self._backlog_bytes += len(line)
        self._more.set()

    async def run(self) -> None:
        """Until cancelled: send what waits, and end the session when connect is gone."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch)
            while True:
                await self._more.wait()
                self._more = anyio.Event()
                if not await self._flush():
                    self._end()
                    return

    async def bye(self) -> None:
        """The client ended: after what waits, tell connect to exit."""
        self.post(BYE)
        with anyio.move_on_after(_BYE_TIMEOUT):
            await self._flush()

    async def _flush(self) -> bool:
        with anyio.move_on_after(self._send_timeout):
            try:
                while self._backlog:
                    await self._stream.send(self._backlog[0])
                    self._backlog_bytes -= len(self._backlog.popleft())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return False
            return True
        return False

    async def _watch(self) -> None:
        try:
            while await self._stream.receive(4096):
                pass  # connect sends nothing after the handoff: dropped
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        self._end()


class Tracking:
    """The requests in flight of a handed-off client, where connect finds them if the daemon dies:
    in the journal's slots, or (an id too long for one, or no slot free) on the back channel."""

    def __init__(self, journal: Journal, backchannel: Backchannel) -> None:
        self._journal, self._backchannel = journal, backchannel

    def hold(self, request_id: str | int) -> object:
        slot = self._journal.hold(request_id)
        if slot is not None:
            return slot
        encoded = json.dumps(request_id).encode()
        self._backchannel.post(HELD_LONG, encoded)
        return _Long(encoded)

    def release(self, token: object) -> None:
        if isinstance(token, int):
            self._journal.release(token)
        elif isinstance(token, _Long):
            self._backchannel.post(RELEASED_LONG, token.encoded)


@dataclass(frozen=True, slots=True)
class _Long:
    encoded: bytes
