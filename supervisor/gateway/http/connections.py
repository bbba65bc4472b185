"""HTTP connections, bounded: how many, and how long a request or an unread answer may take.

uvicorn holds a connection for as long as its client keeps it open: one that sent half a
request line and stalled was held for good, and a thousand of them took every fd the daemon
had, its control socket's included. :class:`BoundedProtocol` is uvicorn's httptools protocol with
what a listener on a shared host needs, all decided in the protocol's callbacks (no task per
connection):

- at most ``max_connections``; at the cap the connection idle longest that serves no request
  (still waiting for its headers, or kept alive between requests) is closed to make room, and
  only when every one is serving a request does a newcomer get 503;
- a request's headers must be in within ``header_timeout`` of its first byte (or of the
  connection, for its first request), its body within ``body_timeout`` of its headers; past
  either the client gets 408 and the connection ends;
- an answer the client leaves unread for ``send_timeout`` (the socket's buffer stays full)
  ends the connection, so a client that stops reading holds no stream open;
- ``TCP_NODELAY``: without it a keep-alive client waits out Nagle's 40 ms on every answer;
- requests a client sends ahead of their answers (pipelining) wait their turn, at most
  :data:`MAX_AHEAD` of them parsed and :data:`MAX_HELD` bytes more unparsed; past
  :data:`MAX_AHEAD` the rest is dropped and the connection closes after the answers owed, in order.

Each request's ASGI scope carries its connection under :data:`CONNECTION`, so that a request
served outside the SDK (:mod:`.fastcalls`) can hear of its client going through
:meth:`BoundedProtocol.watch_lost`, without a task waiting on ``receive()``. A request that may
be a plain tool call (:class:`Quick` wants it) is served once its body is whole, and then in these
callbacks if it is one (:mod:`.quick`), answered by :meth:`BoundedProtocol.answer`; any other
goes to its ASGI task.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from supervisor.gateway.http.limits import HttpLimits
from supervisor.logs import Throttled

__all__ = ("CONNECTION", "MAX_AHEAD", "MAX_HELD", "BoundedProtocol", "Connections", "Quick", "Screen")

CONNECTION = "supervisor.connection"  # the scope key of a request's BoundedProtocol
MAX_AHEAD = 16  # requests that may wait their turn; past it the rest is dropped, closed after the 16
MAX_HELD = 64 << 10  # bytes received (unparsed) while requests wait, past which reading waits too
LINGER = 1.0  # seconds a refused connection's bytes are read and dropped after its 403

log = structlog.get_logger(__name__)


def _raw_response(status: str, text: str) -> bytes:
    error = {"code": -32000, "message": text}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}, separators=(",", ":")).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return (head + f"retry-after: 1\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


_BUSY = _raw_response("503 Service Unavailable", "too many connections, each serving a request")
_TOO_SLOW = _raw_response("408 Request Timeout", "the request did not arrive in time")


class Quick(Protocol):
    """Who serves a request in the connection's callbacks (:class:`.quick.QuickCalls`)."""

    def wants(self, scope: Any) -> bool: ...  # whether to hold the request until its body is whole

    def serve(self, connection: BoundedProtocol, cycle: RequestResponseCycle) -> bool: ...  # taken?


Screen = Callable[[socket.socket], "str | None"]  # why the peer of an accepted socket may not call


class Connections:
    """The connections of one listener: counted, and the idlest found when one must go. *screen*
    says why an accepted socket's peer may not call: 403 before anything it sent is read."""

    def __init__(self, limits: HttpLimits, screen: Screen | None = None) -> None:
        self.limits = limits
        self.screen = screen
        self.open: dict[BoundedProtocol, None] = {}
        self.refused = Throttled(log, "gateway.http_connection_refused")
        self.screened = Throttled(log, "gateway.http_caller_refused")
        self.ended = Throttled(log, "gateway.http_connection_ended", level="info")

    def __len__(self) -> int:
        return len(self.open)

    def admit(self, newcomer: BoundedProtocol) -> bool:
        """Count *newcomer* in, closing the idlest connection at the cap; False when none is idle."""
        if len(self.open) >= self.limits.max_connections:
            idle = [c for c in self.open if c.idle]
            if not idle:
                self.refused("cap", limit=self.limits.max_connections)
                return False
            idlest = min(idle, key=lambda c: c.active_at)
            self.ended("evicted", reason="made room for a new connection (it was the idlest)")
            idlest.end()
        self.open[newcomer] = None
        return True


class _ReadAhead(FlowControl):
    """uvicorn's flow control, except that reading stays paused while *may_read()* says no.

    uvicorn resumes reading for every body read and after every answer, and the fast path does
    for each call (to hear its client go); each resume let one more read (up to 256 KiB) in, and
    a client that pipelined requests without pause grew the daemon by 1.3 GB in 15 s.
    :class:`BoundedProtocol` says no once it holds :data:`MAX_HELD` bytes sent ahead, or drops.
    """

    def __init__(self, transport: asyncio.Transport, may_read: Callable[[], bool]) -> None:
        super().__init__(transport)
        self._may_read = may_read

    def resume_reading(self) -> None:
        if self._may_read():
            super().resume_reading()


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol within :class:`Connections`' bounds (see the module's docstring)."""

    def __init__(
        self, *args: Any, connections: Connections, quick: Quick | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._bounded = connections
        self._quick = quick
        self._deferred: tuple[RequestResponseCycle, Any] | None = None  # held until its body is whole
        self._unsent: tuple[Any, ...] | None = None  # a quick answer waiting for the client to read
        self._limits = connections.limits
        self._admitted = False
        self._receiving: str | None = None  # "headers" or "body" of the request arriving, if any
        self._served: RequestResponseCycle | None = None  # uvicorn's self.cycle is the newest, maybe waiting
        self._held = bytearray()  # bytes received while requests wait their turn, not parsed yet
        self._dropping = False  # over MAX_AHEAD: what else comes is dropped, the connection ends
        self._refused: int | None = None  # refused by the screen: the bytes it sent since, dropped
        self._timer: asyncio.TimerHandle | None = None  # the deadline of the request arriving now
        self._unread: asyncio.TimerHandle | None = None  # while the client does not take our answer
        self._phase: str | None = None  # what _timer waits for: "headers" or "body"
        self.active_at = time.monotonic()  # its last byte in, or its last answer out
        self._on_lost: Callable[[], None] | None = None  # what the request being served does if it goes

    @property
    def idle(self) -> bool:
        """No request of it is being served: waiting for one, or for the rest of its headers."""
        return self.cycle is None or self.cycle.response_complete

    def end(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # ---- asyncio's callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if not self._bounded.admit(self):
            transport.write(_BUSY)
            transport.close()
            return
        self._admitted = True
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self.flow = _ReadAhead(transport, lambda: len(self._held) <= MAX_HELD and not self._dropping)
        screen = self._bounded.screen
        refusal = screen(sock) if screen is not None and sock is not None else None
        if refusal is not None:
            self._refuse(refusal)
            return
        self._watch()

    def _refuse(self, refusal: str) -> None:
        """403 and our side closed; what the client still sends is dropped (closing with it unread
        would reset the connection, the answer lost) for LINGER seconds, at most MAX_HELD bytes."""
        self._bounded.screened("peer", reason=refusal)
        self._refused = 0
        self.transport.write(_raw_response("403 Forbidden", f"refused: {refusal}"))
        self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER, self.end)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._bounded.open.pop(self, None)
        self._deferred = self._unsent = None
        self._cancel_timer()
        if self._unread is not None:
            self._unread.cancel()
        super().connection_lost(exc)  # tells self.cycle only: the newest
        for cycle in (self._served, *(waiting for waiting, _ in self.pipeline)):
            if cycle is not None and cycle is not self.cycle:
                cycle.disconnected = cycle.disconnected or not cycle.response_complete
                cycle.message_event.set()
        for cycle in (self._served, self.cycle):
            if cycle is not None:
                cycle.scope.pop(CONNECTION, None)  # type: ignore[misc]  # no cycle through the scope
        self._held = bytearray()
        if self._on_lost is not None:
            lost, self._on_lost = self._on_lost, None
            lost()

    def data_received(self, data: bytes) -> None:
        self.active_at = time.monotonic()
        if self._refused is not None:
            self._refused += len(data)
            if self._refused > MAX_HELD:
                self.end()
            return
        if self._dropping:
            return
        if self.pipeline or self._held:  # requests wait their turn: what follows waits unparsed
            self._held += data
            if len(self._held) > MAX_HELD:
                self.flow.pause_reading()
            return
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        self.active_at = time.monotonic()
        super().on_response_complete()  # may start a request that waited
        if self._held and not self.pipeline and not self.transport.is_closing():
            held, self._held = bytes(self._held), bytearray()
            self.data_received(held)
            self.flow.resume_reading()
        self._watch()

    def watch_lost(self, callback: Callable[[], None] | None) -> None:
        """Call *callback* if the connection is lost while the request being served runs (None: no
        more). Reading resumes: a body over uvicorn's 64 KiB high-water mark paused it, and a
        paused connection would not see its client close until something read again (unless
        requests sent ahead wait their turn: :class:`_ReadAhead`)."""
        self._on_lost = callback
        if callback is not None:
            self.flow.resume_reading()

    def shutdown(self) -> None:
        """The listener stops: a request not yet whole will never be served; drop it now, not after
        uvicorn's graceful wait (which then cancels its task with an error in the log)."""
        if self._receiving == "body" and not self.pipeline and not self.idle:
            self.end()
            return
        super().shutdown()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._unread is None:
            self._unread = self.loop.call_later(self._limits.send_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._unread is not None:
            self._unread.cancel()
            self._unread = None
        if self._unsent is not None:
            unsent, self._unsent = self._unsent, None
            self.answer(*unsent)

    # ---- the parser's callbacks, within data_received -----------------------------------

    def on_message_begin(self) -> None:
        if len(self.pipeline) >= MAX_AHEAD and not self._dropping:
            self._dropping = True  # the rest of this read is parsed into nothing, and no more is read
            self.cycle.keep_alive = False  # the last request taken: the connection ends with its answer
            self.flow.pause_reading()
            reason = "too many requests sent ahead of their answers"
            self._bounded.ended("ahead", reason=reason, limit=MAX_AHEAD)
        if self._dropping:
            return
        self._receiving = "headers"
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if not self._dropping:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._dropping:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._dropping:
            return
        self._receiving = "body"
        super().on_headers_complete()
        if self.cycle is not None:  # the request's task has not run yet
            self.cycle.scope[CONNECTION] = self  # type: ignore[literal-required]
        if self._on_lost is not None:  # a request sent ahead paused reading: its client's end must be heard
            self.flow.resume_reading()

    def on_body(self, body: bytes) -> None:
        if not self._dropping:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._dropping:
            return
        self._receiving = None
        super().on_message_complete()
        deferred = self._deferred
        if deferred is not None and not deferred[0].more_body:
            self._deferred = None
            self._serve(*deferred)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._served = cycle
        if self._quick is not None and self._quick.wants(cycle.scope):
            if cycle.more_body:  # served once whole: see on_message_complete
                self._deferred = (cycle, app)
                return
            self._serve(cycle, app)
            return
        super()._start_asgi_task(cycle, app)

    def _serve(self, cycle: RequestResponseCycle, app: Any) -> None:
        assert self._quick is not None
        try:
            if self._quick.serve(self, cycle):
                return
        except Exception:  # a bug of ours: the request goes the ASGI way, the connection goes on
            log.exception("gateway.http_quick_crashed")
        super()._start_asgi_task(cycle, app)

    def answer(
        self, cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        """Answer *cycle*, a request served in these callbacks (:mod:`.quick`), as uvicorn's
        ``send`` and its ASGI task's end would: in one write, unless its client has gone; and
        once the client reads again, if it does not now (so that no next request is served)."""
        if cycle.disconnected or cycle.response_started:
            cycle.on_response = lambda: None
            return
        if self.flow.write_paused:  # as send's drain: the answer (one at most) and what follows wait
            self._unsent = (cycle, status, headers, body)
            return
        on_response, cycle.on_response = cycle.on_response, lambda: None  # once, as run_asgi leaves it
        content = [STATUS_LINE[status]]
        for name, value in (*cycle.default_headers, *headers, (b"content-length", b"%d" % len(body))):
            content += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        self.transport.write(b"".join(content))
        cycle.response_started = cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        on_response()

    # ---- deadlines -----------------------------------------------------------------------

    def _watch(self) -> None:
        """Arm the deadline for what the connection waits for now: headers, a body, or nothing.

        Not while requests sent ahead wait their turn: then it is this side that is not reading.
        """
        if self._receiving == "body" and not self.pipeline:
            phase, timeout = "body", self._limits.body_timeout
        elif self.idle and (self._receiving == "headers" or not self._kept_alive()):
            phase, timeout = "headers", self._limits.header_timeout
        else:  # the request is whole, or the connection is waiting between requests (keep-alive)
            self._cancel_timer()
            return
        if self._phase != phase:
            self._cancel_timer()
            self._phase = phase
            self._timer = self.loop.call_later(timeout, self._too_slow)

    def _kept_alive(self) -> bool:
        """Between two requests, before any byte of the next: uvicorn's keep-alive timer runs."""
        return self.timeout_keep_alive_task is not None

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _too_slow(self) -> None:
        what = self._phase or "headers"
        self._timer, self._phase = None, None
        if self.transport.is_closing():
            return
        self._bounded.ended(what, reason=f"request {what} not received in time")
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TOO_SLOW)
        self.transport.close()

    def _not_reading(self) -> None:
        self._unread = None
        self._bounded.ended(
            "unread", reason="the client left an answer unread", timeout=self._limits.send_timeout
        )
        self.transport.abort()
