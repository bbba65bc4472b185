"""The bounds of the HTTP listener, as one value: what a client may hold, and for how long."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("HttpLimits",)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Every bound of one HTTP listener. The defaults are the daemon's; tests shrink them.

    Nothing a client sends before its request is whole (headers, then body) holds a connection
    or memory for longer than ``header_timeout`` + ``body_timeout``, authenticated or not.
    """

    max_connections: int = 256  # at the cap the idlest connection not serving a request makes room
    backlog: int = 64  # connections accepted in one go, before any of them is refused
    header_timeout: float = 10.0  # a request's headers, from its first byte (or the connection's start)
    body_timeout: float = 60.0  # its body, from the end of its headers
    keep_alive: float = 15.0  # an idle connection between two requests
    send_timeout: float = 30.0  # an answer the client leaves unread this long ends the connection
    max_body: int = 64 << 20  # one request's body (tool arguments may carry images)
    receiving_budget: int = 96 << 20  # all bodies being received at once
    stall_grace: float = 1.0  # a body still arriving after this may be dropped for another at the budget
    max_in_flight: int = 64  # requests of one session being served at once
    max_sessions: int = 256  # at the cap the session idle longest is ended
    session_idle: float = 600.0  # a session with no request in flight this long is ended
    fresh_session: float = 10.0  # ... and one that made no request after its initialize, this long
    reclaim_idle: float = 60.0  # at max_instances, a session idle this long gives up its per-client instance
