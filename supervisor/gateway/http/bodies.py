"""Request bodies under one budget, and requests in flight per session, before the MCP app sees them.

The SDK's app reads a request's body whole before it parses it, up to 64 MiB each, and
nothing bounded how many it read at once: ten clients that sent 60 MiB and stalled held 600
MiB for as long as they stayed. :class:`Bodies` reads every body itself first, within
``max_body`` and within one ``receiving_budget`` for all bodies being received at once, then
hands it to the app whole. A body that does not fit gets 503 at once; but a body that has been
arriving for longer than ``stall_grace`` (a client that stalled) is dropped to make room first,
oldest first, so a stalled client never locks out the ones that send their requests at once.
Its deadline is the connection's (:mod:`.connections`).

A session (``Mcp-Session-Id``) may have ``max_in_flight`` requests being served at once, as an
``mcp.sock`` connection may; more get 429.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from supervisor.gateway.http.limits import HttpLimits
from supervisor.logs import Throttled

__all__ = ("Bodies", "replay")

log = structlog.get_logger(__name__)

_SESSION_HEADER = b"mcp-session-id"
_MAX_SESSION_KEY = 128  # characters of a session header kept as a key (real ones are 32)


class _Receiving:
    """One body being received: its share of the budget, and how to drop it."""

    __slots__ = ("dropped", "reserved", "scope", "started")

    def __init__(self, reserved: int) -> None:
        self.reserved = reserved
        self.started = time.monotonic()
        self.scope = anyio.CancelScope()
        self.dropped = False


class Bodies:
    """ASGI middleware: bodies read under a budget and handed on whole; in-flight requests per session."""

    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.app = app
        self._limits = limits
        self._receiving: dict[_Receiving, None] = {}  # oldest first
        self._reserved = 0
        self._in_flight: dict[str, int] = {}  # session -> requests being served
        self.refused = Throttled(log, "gateway.http_request_refused")

    @property
    def max_body(self) -> int:
        return self._limits.max_body

    @property
    def receiving(self) -> int:
        """Bytes reserved by the bodies being received now."""
        return self._reserved

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        session = headers.get(_SESSION_HEADER, b"").decode("latin-1")
        if not self.take_slot(session):
            self.refused("in_flight", reason="too many requests in flight", limit=self._limits.max_in_flight)
            await _answer(send, 429, f"at most {self._limits.max_in_flight} requests of a session at once")
            return
        try:
            if _has_body(scope["method"], headers):
                body = await self._read(headers, receive, send)
                if body is None:
                    return  # answered already, or the client is gone
                receive = replay({"type": "http.request", "body": body, "more_body": False}, receive)
            await self.app(scope, receive, send)
        finally:
            self.give_slot(session)

    def take_slot(self, session_id: str) -> bool:
        """One of the ``max_in_flight`` requests of session *session_id* (none for no session);
        False at the cap. Give it back with :meth:`give_slot`."""
        session = session_id[:_MAX_SESSION_KEY]
        if not session:
            return True
        if self._in_flight.get(session, 0) >= self._limits.max_in_flight:
            return False
        self._in_flight[session] = self._in_flight.get(session, 0) + 1
        return True

    def in_flight(self, session_id: str) -> int:
        """Requests of session *session_id* being served now (its open event stream among them)."""
        return self._in_flight.get(session_id[:_MAX_SESSION_KEY], 0)

    def give_slot(self, session_id: str) -> None:
        session = session_id[:_MAX_SESSION_KEY]
        if session:
            left = self._in_flight.pop(session) - 1
            if left:
                self._in_flight[session] = left

    async def _read(self, headers: dict[bytes, bytes], receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once the client got its error (or left)."""
        limit = self._limits.max_body
        try:
            declared = int(headers[b"content-length"]) if b"content-length" in headers else None
        except ValueError:
            declared = None  # the HTTP parser refuses such a request before it gets here
        if declared is not None and declared > limit:
            self.refused("too_large", reason="body over the limit", limit=limit)
            await _answer(send, 413, f"request body over {limit} bytes")
            return None
        receiving = self._reserve(declared or 0)
        if receiving is None:
            self.refused("budget", reason="bodies being received are at their budget")
            await _answer(send, 503, "too many request bodies being received at once; retry")
            return None
        chunks: list[bytes] = []
        received = 0
        try:
            with receiving.scope:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    received += len(chunk)
                    if received > limit:
                        self.refused("too_large", reason="body over the limit", limit=limit)
                        await _answer(send, 413, f"request body over {limit} bytes")
                        return None
                    if received > receiving.reserved and not self._grow(receiving, received):
                        break
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
            self.refused("budget", reason="a body was dropped: bodies being received are at their budget")
            await _answer(send, 503, "too many request bodies being received at once; retry")
            return None
        finally:
            self._release(receiving)

    # ---- the budget ----------------------------------------------------------------------

    def _reserve(self, size: int) -> _Receiving | None:
        if not self._make_room(size, None):
            return None
        receiving = _Receiving(size)
        self._receiving[receiving] = None
        self._reserved += size
        return receiving

    def _grow(self, receiving: _Receiving, size: int) -> bool:
        """A body without a length grew to *size*; False (it is dropped) if that does not fit."""
        if not self._make_room(size - receiving.reserved, receiving):
            return False
        self._reserved += size - receiving.reserved
        receiving.reserved = size
        return True

    def _make_room(self, size: int, asking: _Receiving | None) -> bool:
        """Whether *size* more bytes fit, after dropping bodies stalled past ``stall_grace`` if needed."""
        budget, now = self._limits.receiving_budget, time.monotonic()
        if size > budget:
            return False
        for other in list(self._receiving):  # oldest first
            if self._reserved + size <= budget:
                break
            if other is not asking and now - other.started >= self._limits.stall_grace:
                self._drop(other)
        return self._reserved + size <= budget

    def _drop(self, receiving: _Receiving) -> None:
        receiving.dropped = True
        receiving.scope.cancel()
        self._release(receiving)

    def _release(self, receiving: _Receiving) -> None:
        if receiving in self._receiving:
            del self._receiving[receiving]
            self._reserved -= receiving.reserved


def _has_body(method: str, headers: dict[bytes, bytes]) -> bool:
    return (
        method in ("POST", "PUT", "PATCH") or b"content-length" in headers or b"transfer-encoding" in headers
    )


def replay(first: Message, receive: Receive) -> Receive:
    """*receive* for the app: *first* (the whole body, read already), then whatever the client
    does next (a disconnect, when it comes)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return first
        return await receive()

    return replayed


async def _answer(send: Send, status: int, message: str) -> None:
    body = _error_body(message)
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    if status in (429, 503):
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _error_body(message: str) -> bytes:
    error: dict[str, Any] = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
    return json.dumps(error).encode()
