"""The pure half of ``connect``: line framing, a cheap look at each line, and the session memory.

``connect`` passes bytes through untouched; all it needs to know to resume a client's session
on a new connection is which requests are in flight and the few messages that set the session
up. This module works that out without I/O, so it is unit-tested without sockets.

A line is parsed whole only when it is small (``PARSE_WHOLE``, a few microseconds) or is one of
the few messages whose content is remembered; a bigger one is read from its first ``HEAD``
bytes (the Python SDK writes ``jsonrpc, id, method|result`` first) and its last member (the
TypeScript SDK writes ``id`` last), and parsed whole only when both leave the answer open and
the line is in memory anyway. A 60 KiB answer thus costs a few microseconds, not a parse.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = (
    "HEAD",
    "MAX_IN_FLIGHT",
    "PARSE_WHOLE",
    "Downstream",
    "Kind",
    "LineBuffer",
    "Oversize",
    "Peek",
    "SessionMemory",
    "error_line",
    "peek",
)

HEAD = 4096  # bytes of a big line that are looked at
PARSE_WHOLE = HEAD  # lines up to this size are json.loads'd outright
MAX_IN_FLIGHT = 10_000  # client requests tracked for a restart; more are forwarded untracked
MAX_REMEMBERED = 1 << 20  # a set-up message bigger than this is not kept for replay
_MAX_SUBSCRIPTIONS = 1000  # resources/subscribe URIs kept for replay
_MAX_LISTENS = 64  # 2026-07-28 subscriptions/listen streams kept for replay
_TAIL = 256
# Messages SessionMemory keeps (or reads params of): always parsed whole, whatever their size.
_REMEMBERED_METHODS = frozenset(
    {
        "initialize",
        "logging/setLevel",
        "notifications/cancelled",
        "resources/subscribe",
        "resources/unsubscribe",
        "subscriptions/listen",
    }
)

RequestId = int | str


class Kind(enum.Enum):
    REQUEST = enum.auto()
    NOTIFICATION = enum.auto()
    RESPONSE = enum.auto()
    UNKNOWN = enum.auto()  # not JSON-RPC, or its head and tail do not tell


@dataclass(frozen=True, slots=True)
class Peek:
    """What one line is. ``message`` is the parsed line when it was small enough to parse whole."""

    kind: Kind
    id: RequestId | None = None
    method: str | None = None
    message: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Oversize:
    """A line longer than the cap, discarded as it arrived: its first and last bytes and its size."""

    head: bytes
    tail: bytes
    size: int


_UNKNOWN = Peek(Kind.UNKNOWN)
_OPEN = re.compile(rb"\s*\{")
_KEY = re.compile(rb'\s*"([^"\\]*)"\s*:\s*')
_SCALAR = re.compile(rb'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null')
_AFTER = re.compile(rb"\s*([,}])")
# In valid JSON, `"id": 5}` right before the end is a member of the top-level object: an escaped
# quote inside a string would be preceded by a backslash, not by `,` or `{`.
_TAIL_ID = re.compile(rb'[{,]\s*"id"\s*:\s*(-?\d+|"[^"\\]*")\s*}\s*$')


def _is_id(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _classify(message: Any) -> Peek:
    if not isinstance(message, dict):
        return _UNKNOWN
    method = message.get("method")
    request_id = message.get("id")
    if isinstance(method, str):
        if "id" not in message:
            return Peek(Kind.NOTIFICATION, None, method, message)
        return Peek(Kind.REQUEST, request_id, method, message) if _is_id(request_id) else _UNKNOWN
    if "result" in message or "error" in message:
        return Peek(Kind.RESPONSE, request_id if _is_id(request_id) else None, None, message)
    return _UNKNOWN


def _scan_head(head: bytes) -> tuple[dict[str, Any], str | None, bool]:
    """Top-level scalar members from the start of an object, up to its first compound value.

    Returns the scalars found, the key of the compound value that stopped the scan (None when
    the head was cut off or unreadable), and whether the object ended within *head*.
    """
    found: dict[str, Any] = {}
    match = _OPEN.match(head)
    if match is None:
        return found, None, False
    pos = match.end()
    while True:
        key = _KEY.match(head, pos)
        if key is None:  # `{}`, or a key with escapes: nothing more to learn here
            return found, None, not found and head[pos:].lstrip()[:1] == b"}"
        pos = key.end()
        value = _SCALAR.match(head, pos)
        after = _AFTER.match(head, value.end()) if value is not None else None
        if value is None or after is None:  # a compound value, or the head ends inside this one
            compound = head[pos : pos + 1] in (b"{", b"[")
            return found, key.group(1).decode("utf-8", "replace") if compound else None, False
        found[key.group(1).decode("utf-8", "replace")] = json.loads(value.group())
        pos = after.end()
        if after.group(1) == b"}":
            return found, None, True


def _peek_parts(head: bytes, tail: bytes) -> Peek:
    found, compound, ended = _scan_head(head)
    if ended:
        return _classify(found)
    method = found.get("method")
    request_id = found.get("id")
    if "id" not in found and (match := _TAIL_ID.search(tail)) is not None:
        request_id = json.loads(match.group(1))
        found["id"] = request_id
    if isinstance(method, str) and "id" in found:
        return Peek(Kind.REQUEST, request_id, method) if _is_id(request_id) else _UNKNOWN
    if method is None and compound in ("result", "error"):
        return Peek(Kind.RESPONSE, request_id if _is_id(request_id) else None)
    return _UNKNOWN  # e.g. a method but no id in sight: a notification, or an id further in


def peek(line: bytes | bytearray, tail: bytes | None = None) -> Peek:
    """Classify one JSON-RPC line (without its newline), reading as little of it as it can.

    With *tail*, *line* is only the head of a line that is not in memory: it is never parsed
    whole, and the answer may be ``UNKNOWN`` where the whole line would have told.
    """
    try:
        if tail is None and len(line) <= PARSE_WHOLE:
            return _classify(json.loads(line))
        result = _peek_parts(bytes(line[:HEAD]), tail if tail is not None else bytes(line[-_TAIL:]))
        if tail is None and (result.kind is Kind.UNKNOWN or result.method in _REMEMBERED_METHODS):
            return _classify(json.loads(line))  # an unusual member order, or a message to keep
        return result
    except (ValueError, RecursionError):
        return _UNKNOWN


def error_line(request_id: RequestId, code: int, message: str) -> bytes:
    """A JSON-RPC error response line, newline included."""
    reply = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


class LineBuffer:
    """Splits a byte stream into lines (without their newline), holding at most *cap* bytes.

    A line longer than *cap* is discarded as it arrives and comes out as an :class:`Oversize`
    with its first ``HEAD`` and last bytes, so the caller can still answer it.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._partial = bytearray()
        self._over: tuple[bytes, bytes, int] | None = None  # head, tail, size of a line being discarded

    def feed(self, chunk: bytes) -> list[bytes | bytearray | Oversize]:
        """The lines *chunk* completes, in order."""
        lines: list[bytes | bytearray | Oversize] = []
        first = chunk.find(b"\n")
        if first < 0:
            self._add(chunk)
            return lines
        if self._partial or self._over is not None:
            self._add(chunk[:first])
            lines.append(self._take())
            start = first + 1
        else:
            start = 0
        last = chunk.rfind(b"\n")
        if last >= start:
            lines.extend(chunk[start:last].split(b"\n"))
        self._add(chunk[last + 1 :])
        return lines

    def _add(self, data: bytes) -> None:
        if not data:
            return
        if self._over is not None:
            head, tail, size = self._over
            self._over = (head, (tail + data)[-_TAIL:], size + len(data))
        elif len(self._partial) + len(data) > self.cap:
            partial = self._partial
            head = bytes(partial[:HEAD]) + data[: max(0, HEAD - len(partial))]
            tail = (bytes(partial[-_TAIL:]) + data[-_TAIL:])[-_TAIL:]
            self._over = (head, tail, len(partial) + len(data))
            self._partial = bytearray()  # give the memory back now, not at the newline
        else:
            self._partial += data

    def _take(self) -> bytearray | Oversize:
        if self._over is not None:
            over, self._over = Oversize(*self._over), None
            return over
        line, self._partial = self._partial, bytearray()
        return line


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
            if _is_id(cancelled):  # the client stopped waiting: no answer may ever come
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
            self._tail = (self._tail + piece)[-_TAIL - 1 :]
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
        self._tail = bytes(self._partial[-_TAIL:])
        self._streaming = peek(self._head, tail=b"")
        self._keeping = self.keep(self._streaming)
        data, self._partial = self._partial, bytearray()
        return bytes(data) if self._keeping else b""
