"""What ``connect`` remembers of a client's session, to resume it on a new connection to the daemon.

``connect`` passes bytes through untouched; all it needs to know to resume a client's session
on a new connection is which requests are in flight and the few messages that set the session
up (:class:`SessionMemory`), and what the client still has to be told (:class:`Downstream`).
Pure: unit-tested without sockets; the lines themselves are read by :mod:`.lines`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.cli.connect.lines import HEAD, TAIL, Kind, Peek, RequestId, is_id, peek

__all__ = ("MAX_IN_FLIGHT", "MAX_REMEMBERED", "Downstream", "SessionMemory")

MAX_IN_FLIGHT = 10_000  # client requests tracked for a restart; more are forwarded untracked
MAX_REMEMBERED = 1 << 20  # a set-up message bigger than this is not kept for replay
_MAX_SUBSCRIPTIONS = 1000  # resources/subscribe URIs kept for replay
_MAX_LISTENS = 64  # 2026-07-28 subscriptions/listen streams kept for replay


@dataclass(slots=True)
class _Remembered:
    initialize: dict[str, Any] | None = None  # the client's first initialize, once answered
    initialized: bytes | None = None  # its first notifications/initialized line
    log_level: dict[str, Any] | None = None  # its last logging/setLevel
    subscriptions: dict[str, dict[str, Any]] | None = None  # resources/subscribe by URI


class SessionMemory:
    """What connect knows of the client's session: set-up messages and the requests in flight.

    Fed with every client line actually sent to the daemon (:meth:`sent`) and every response
    coming back (:meth:`answered`). At a break, :meth:`broken` names the requests to fail and
    :meth:`replay` gives what re-creates the session on the next connection.
    """

    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.max_in_flight = max_in_flight
        self.in_flight: dict[RequestId, str] = {}  # id -> method
        self.listens: dict[RequestId, bytes] = {}  # 2026-07-28 listen streams: replayed under their own id
        self.untracked = 0  # requests forwarded while in_flight was full
        self.remembered = _Remembered()
        self._initialize: tuple[RequestId, dict[str, Any]] | None = None  # sent, not answered yet

    def sent(self, line: bytes | bytearray, seen: Peek) -> None:
        """Note a client line that was forwarded to the daemon."""
        if seen.kind is Kind.REQUEST:
            self._request(line, seen)
        elif seen.kind is Kind.NOTIFICATION:
            self._notification(line, seen)

    def _request(self, line: bytes | bytearray, seen: Peek) -> None:
        assert seen.id is not None
        if len(self.in_flight) >= self.max_in_flight and seen.id not in self.in_flight:
            self.untracked += 1
            return
        self.in_flight[seen.id] = seen.method or ""
        message, memory = seen.message, self.remembered
        small = message is not None and len(line) <= MAX_REMEMBERED
        if seen.method == "initialize" and small and memory.initialize is None and self._initialize is None:
            self._initialize = (seen.id, message)  # type: ignore[assignment]
        elif seen.method == "subscriptions/listen" and small and len(self.listens) < _MAX_LISTENS:
            self.listens[seen.id] = bytes(line)
        elif seen.method == "logging/setLevel" and small:
            memory.log_level = message
        elif seen.method in ("resources/subscribe", "resources/unsubscribe") and small:
            self._subscription(seen.method, message)  # type: ignore[arg-type]

    def _subscription(self, method: str, message: dict[str, Any]) -> None:
        params = message.get("params")
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str):
            return
        subscriptions = self.remembered.subscriptions or {}
        if method == "resources/unsubscribe":
            subscriptions.pop(uri, None)
        elif uri in subscriptions or len(subscriptions) < _MAX_SUBSCRIPTIONS:
            subscriptions[uri] = message
        self.remembered.subscriptions = subscriptions or None

    def _notification(self, line: bytes | bytearray, seen: Peek) -> None:
        if seen.method == "notifications/initialized" and self.remembered.initialized is None:
            self.remembered.initialized = bytes(line)
        elif seen.method == "notifications/cancelled" and seen.message is not None:
            params = seen.message.get("params")
            cancelled = params.get("requestId") if isinstance(params, dict) else None
            if is_id(cancelled):  # the client stopped waiting: no answer may ever come
                self.in_flight.pop(cancelled, None)
                self.listens.pop(cancelled, None)

    def answered(self, request_id: RequestId | None) -> None:
        """Note a response from the daemon."""
        if request_id is None or self.in_flight.pop(request_id, None) is None:
            return
        self.listens.pop(request_id, None)
        if self._initialize is not None and self._initialize[0] == request_id:
            self.remembered.initialize, self._initialize = self._initialize[1], None

    def broken(self) -> list[RequestId]:
        """The connection is gone: forget and return the requests to fail (listens are kept)."""
        failed = [request_id for request_id in self.in_flight if request_id not in self.listens]
        self.in_flight = {request_id: "subscriptions/listen" for request_id in self.listens}
        self._initialize = None  # its answer never came: the client gets an error and may retry
        return failed

    def replay(self, new_id: Callable[[], RequestId]) -> tuple[dict[str, Any] | None, list[bytes]]:
        """The initialize to resend (under an id from *new_id()*) and the lines to send after it.

        The lines: notifications/initialized, the log level and resource subscriptions (under
        fresh ids, their answers to be dropped) and the 2026-07-28 listen streams (under their
        own ids: the client is still waiting on them).
        """
        memory = self.remembered
        initialize = None if memory.initialize is None else {**memory.initialize, "id": new_id()}
        lines = [memory.initialized] if memory.initialized is not None else []
        setters = [memory.log_level] if memory.log_level is not None else []
        setters += list((memory.subscriptions or {}).values())
        lines += [json.dumps({**message, "id": new_id()}).encode() for message in setters]
        lines += list(self.listens.values())
        return initialize, lines


class Downstream:
    """Daemon lines on their way to the client: each is passed on whole once complete.

    *keep* decides per line whether it goes to the client (connect drops the answers to its own
    replayed requests); *done* is told of every completed line. A line longer than
    *stream_after* is streamed through as it arrives instead of held, so a huge answer costs no
    memory here; it is judged by its head. Not bounded otherwise: the daemon bounds its lines.
    """

    def __init__(
        self, keep: Callable[[Peek], bool], done: Callable[[Peek], None], stream_after: int = 1 << 20
    ) -> None:
        self.keep, self.done, self.stream_after = keep, done, stream_after
        self._partial = bytearray()
        self._streaming: Peek | None = None  # the head's peek while a long line streams through
        self._keeping = True
        self._head = self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of *chunk* to write to the client now."""
        out: list[bytes] = []
        pos = 0
        if self._streaming is not None or self._partial:
            first = chunk.find(b"\n")
            out.append(self._continue(chunk if first < 0 else chunk[: first + 1], complete=first >= 0))
            if first < 0:
                return out[0]
            pos = first + 1
        last = chunk.rfind(b"\n")
        if last >= pos:
            lines = chunk[pos:last].split(b"\n")
            kept = [self._line(line) for line in lines]
            if all(kept):  # the usual case: pass the block on as it came
                out.append(chunk[pos : last + 1])
            else:
                out.extend(line + b"\n" for line, keep in zip(lines, kept, strict=True) if keep)
            pos = last + 1
        if pos < len(chunk):
            out.append(self._continue(chunk[pos:], complete=False))
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def idle(self) -> bool:
        """No line is partly passed on or held."""
        return not self._partial and self._streaming is None

    def cut(self) -> bytes:
        """The connection broke: what ends a line left half-written (its rest never comes)."""
        cut = self._streaming is not None and self._keeping
        self._partial, self._streaming, self._keeping = bytearray(), None, True
        return b"\n" if cut else b""

    def _line(self, line: bytes | bytearray) -> bool:
        seen = peek(line)
        keep = self.keep(seen)
        self.done(seen)
        return keep

    def _continue(self, piece: bytes, *, complete: bool) -> bytes:
        if self._streaming is not None:
            self._tail = (self._tail + piece)[-TAIL - 1 :]
            keeping = self._keeping
            if complete:
                seen = self._streaming
                if seen.id is None:
                    seen = peek(self._head, tail=self._tail.rstrip(b"\n"))
                self.done(seen)
                self._streaming, self._keeping = None, True
            return piece if keeping else b""
        self._partial += piece
        if complete:
            line, self._partial = self._partial, bytearray()
            return bytes(line) if self._line(line[:-1]) else b""
        if len(self._partial) <= self.stream_after:
            return b""
        self._head = bytes(self._partial[:HEAD])
        self._tail = bytes(self._partial[-TAIL:])
        self._streaming = peek(self._head, tail=b"")
        self._keeping = self.keep(self._streaming)
        data, self._partial = self._partial, bytearray()
        return bytes(data) if self._keeping else b""
