"""``connect``'s view of the bytes it passes: lines framed within a cap, and a cheap look at each.

A line is parsed whole only when it is small (``PARSE_WHOLE``, a few microseconds) or is one of
the few messages whose content is remembered (:data:`REMEMBERED_METHODS`); a bigger one is read
from its first ``HEAD`` bytes (the Python SDK writes ``jsonrpc, id, method|result`` first) and
its last member (the TypeScript SDK writes ``id`` last), and parsed whole only when both leave
the answer open and the line is in memory anyway. A 60 KiB answer thus costs a few microseconds,
not a parse. Pure: unit-tested without sockets.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = (
    "HEAD",
    "PARSE_WHOLE",
    "REMEMBERED_METHODS",
    "TAIL",
    "Kind",
    "LineBuffer",
    "Oversize",
    "Peek",
    "RequestId",
    "error_line",
    "is_id",
    "peek",
)

HEAD = 4096  # bytes of a big line that are looked at
PARSE_WHOLE = HEAD  # lines up to this size are json.loads'd outright
TAIL = 256
# Messages SessionMemory keeps (or reads params of): always parsed whole, whatever their size.
REMEMBERED_METHODS = frozenset(
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


def is_id(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _classify(message: Any) -> Peek:
    if not isinstance(message, dict):
        return _UNKNOWN
    method = message.get("method")
    request_id = message.get("id")
    if isinstance(method, str):
        if "id" not in message:
            return Peek(Kind.NOTIFICATION, None, method, message)
        return Peek(Kind.REQUEST, request_id, method, message) if is_id(request_id) else _UNKNOWN
    if "result" in message or "error" in message:
        return Peek(Kind.RESPONSE, request_id if is_id(request_id) else None, None, message)
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
        return Peek(Kind.REQUEST, request_id, method) if is_id(request_id) else _UNKNOWN
    if method is None and compound in ("result", "error"):
        return Peek(Kind.RESPONSE, request_id if is_id(request_id) else None)
    return _UNKNOWN  # e.g. a method but no id in sight: a notification, or an id further in


def peek(line: bytes | bytearray, tail: bytes | None = None) -> Peek:
    """Classify one JSON-RPC line (without its newline), reading as little of it as it can.

    With *tail*, *line* is only the head of a line that is not in memory: it is never parsed
    whole, and the answer may be ``UNKNOWN`` where the whole line would have told.
    """
    try:
        if tail is None and len(line) <= PARSE_WHOLE:
            return _classify(json.loads(line))
        result = _peek_parts(bytes(line[:HEAD]), tail if tail is not None else bytes(line[-TAIL:]))
        if tail is None and (result.kind is Kind.UNKNOWN or result.method in REMEMBERED_METHODS):
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

    @property
    def empty(self) -> bool:
        """No part of a line is held."""
        return not self._partial and self._over is None

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
            self._over = (head, (tail + data)[-TAIL:], size + len(data))
        elif len(self._partial) + len(data) > self.cap:
            partial = self._partial
            head = bytes(partial[:HEAD]) + data[: max(0, HEAD - len(partial))]
            tail = (bytes(partial[-TAIL:]) + data[-TAIL:])[-TAIL:]
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
