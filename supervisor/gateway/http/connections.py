"""HTTP connections, bounded: how many, and how long a request or an unread answer may take.

uvicorn holds a connection for as long as its client keeps it open: one that sent half a
request line and stalled was held for good, and a thousand of them took every fd the daemon
had, its control socket's included. :class:`BoundedProtocol` is uvicorn's h11 protocol with
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
- requests a client sends ahead of their answers (pipelining) are read as they are served, at
  most :data:`MAX_AHEAD` bytes plus one read ahead.

Each request's ASGI scope carries its connection under :data:`CONNECTION`, so that a request
served outside the SDK (:mod:`.fastcalls`) can hear of its client going through
:meth:`BoundedProtocol.watch_lost`, without a task waiting on ``receive()``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import h11
import structlog
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from supervisor.gateway.http.limits import HttpLimits
from supervisor.logs import Throttled

__all__ = ("CONNECTION", "MAX_AHEAD", "BoundedProtocol", "Connections")

CONNECTION = "supervisor.connection"  # the scope key of a request's BoundedProtocol
MAX_AHEAD = 64 << 10  # bytes of requests received ahead of their turn past which reading waits

log = structlog.get_logger(__name__)


def _raw_response(status: str, text: str) -> bytes:
    body = f'{{"jsonrpc":"2.0","id":null,"error":{{"code":-32000,"message":"{text}"}}}}'.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"retry-after: 1\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_BUSY = _raw_response("503 Service Unavailable", "too many connections, each serving a request")
_TOO_SLOW = _raw_response("408 Request Timeout", "the request did not arrive in time")


class Connections:
    """The connections of one listener: counted, and the idlest found when one must go."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.open: dict[BoundedProtocol, None] = {}
        self.refused = Throttled(log, "gateway.http_connection_refused")
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
    """uvicorn's flow control, except that reading stays paused while the client has more than
    :data:`MAX_AHEAD` bytes of requests waiting their turn in h11's buffer.

    uvicorn resumes reading for every body read and after every answer, and h11 takes in one
    more read (up to 256 KiB) each time before pausing again: a client that pipelined requests
    without pause filled the daemon's memory, 1.3 GB in 15 s. Requests already in are served
    in turn; reading resumes once they are below the bound.
    """

    def __init__(self, transport: asyncio.Transport, conn: h11.Connection) -> None:
        super().__init__(transport)
        self._conn = conn

    def resume_reading(self) -> None:
        if len(self._conn.trailing_data[0]) <= MAX_AHEAD:
            super().resume_reading()


class BoundedProtocol(H11Protocol):
    """uvicorn's h11 protocol within :class:`Connections`' bounds (see the module's docstring)."""

    def __init__(self, *args: Any, connections: Connections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bounded = connections
        self._limits = connections.limits
        self._admitted = False
        self._timer: asyncio.TimerHandle | None = None  # the deadline of the request arriving now
        self._unread: asyncio.TimerHandle | None = None  # while the client does not take our answer
        self._phase: object = None  # what _timer waits for: h11.IDLE (headers) or h11.SEND_BODY
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
        if not self._bounded.admit(self):
            transport.write(_BUSY)
            transport.close()
            return
        self._admitted = True
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self.flow = _ReadAhead(transport, self.conn)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._bounded.open.pop(self, None)
        self._cancel_timer()
        if self._unread is not None:
            self._unread.cancel()
        super().connection_lost(exc)
        if self.cycle is not None:
            self.cycle.scope.pop(CONNECTION, None)  # type: ignore[misc]  # no cycle through the scope
        if self._on_lost is not None:
            lost, self._on_lost = self._on_lost, None
            lost()

    def data_received(self, data: bytes) -> None:
        self.active_at = time.monotonic()
        super().data_received(data)
        self._expose()
        self._watch()

    def on_response_complete(self) -> None:
        self.active_at = time.monotonic()
        super().on_response_complete()  # may start a pipelined request
        self._expose()
        self._watch()

    def watch_lost(self, callback: Callable[[], None] | None) -> None:
        """Call *callback* if the connection is lost while the request being served runs (None: no
        more). Reading resumes: a body over uvicorn's 64 KiB high-water mark paused it, and a
        paused connection would not see its client close until something read again (within
        :class:`_ReadAhead`'s bound)."""
        self._on_lost = callback
        if callback is not None:
            self.flow.resume_reading()

    def _expose(self) -> None:
        """Put this connection in the scope of the request just parsed (its task has not run yet)."""
        if self.cycle is not None:
            self.cycle.scope[CONNECTION] = self  # type: ignore[literal-required]

    def shutdown(self) -> None:
        """The listener stops: a request not yet whole will never be served; drop it now, not after
        uvicorn's graceful wait (which then cancels its task with an error in the log)."""
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.idle:
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

    # ---- deadlines -----------------------------------------------------------------------

    def _watch(self) -> None:
        """Arm the deadline for what the connection waits for now: headers, a body, or nothing."""
        state = self.conn.their_state
        if state is h11.IDLE and self.idle and not self._kept_alive():
            phase, timeout = h11.IDLE, self._limits.header_timeout
        elif state is h11.SEND_BODY:
            phase, timeout = h11.SEND_BODY, self._limits.body_timeout
        else:  # the request is whole, or the connection is waiting between requests (keep-alive)
            self._cancel_timer()
            return
        if self._phase is not phase:
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
        what = "headers" if self._phase is h11.IDLE else "body"
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
