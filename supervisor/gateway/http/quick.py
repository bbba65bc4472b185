"""Plain tool calls over HTTP answered in the connection's callbacks: no ASGI task, no middleware.

The fast path (:mod:`.fastcalls`) skips the SDK but still runs in the request's ASGI task,
behind the Guard, the profile paths and the body budget: a task, its cancel scopes and its
wake-ups cost about as much as the rest of the call. :class:`QuickCalls` takes a request before
all of that when callbacks alone can answer it:

- at its headers, it wants a POST to ``/mcp`` or ``/mcp/NAME`` with a body of known length, at
  most :data:`MAX_BODY`, that the Guard admits (:meth:`.Guard.admits`): such a request is held
  until its body is whole (:mod:`.connections`), under the connection's body deadline (outside
  the body budget: uvicorn reads as much of any body before its task runs);
- with its body, it takes a call the fast path takes (:meth:`.FastPath.take`,
  :meth:`.FastPath.take_modern`) in the profile its path names (:meth:`.ProfilePaths.profile`),
  with a slot of its session's requests in flight (:meth:`.Bodies.take_slot`), that the gateway's
  runner serves in callbacks (:meth:`.Runner.start` without a task group: its extension takes
  the call at once).

Anything else, refusals included, goes the ASGI way as it would have, so each decision stays
where it is made. What the fast path gives a call, this one keeps: its session held busy
(:meth:`.Sessions.hold`), cancellation by ``notifications/cancelled`` (the runner's table of
running calls) or by its client going (:meth:`.BoundedProtocol.watch_lost`), the child's
questions to its client, and the same answer, written in one go (:meth:`.BoundedProtocol.answer`).
"""

from __future__ import annotations

import structlog
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from supervisor.gateway.fast.answers import modern_status
from supervisor.gateway.fast.parse import MARK
from supervisor.gateway.fast.runner import Running, Taken
from supervisor.gateway.http.bodies import Bodies
from supervisor.gateway.http.connections import BoundedProtocol
from supervisor.gateway.http.fastcalls import FastPath, media_types_taken
from supervisor.gateway.http.guard import Guard, ProfilePaths
from supervisor.gateway.http.sessions import Sessions

__all__ = ("MAX_BODY", "QuickCalls")

log = structlog.get_logger(__name__)

MAX_BODY = 64 << 10  # a body held until whole: uvicorn's own high-water mark, past which it pauses
_JSON = (b"content-type", b"application/json")
_NOT_SIMPLE = frozenset({b"transfer-encoding", b"expect"})  # chunks, or a 100 Continue to send first


class QuickCalls:
    """The listener's quick calls (see the module's docstring); one per listener."""

    def __init__(
        self, fast: FastPath, guard: Guard, paths: ProfilePaths, bodies: Bodies, sessions: Sessions
    ) -> None:
        self._guard, self._paths = guard, paths
        self.fast, self.bodies, self.sessions = fast, bodies, sessions  # what each call uses too
        self._max_body = min(MAX_BODY, bodies.max_body)  # a longer one is the budget's to refuse

    def wants(self, scope: Scope) -> bool:
        if scope["method"] != "POST" or not scope["path"].startswith("/mcp"):
            return False
        length = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name in _NOT_SIMPLE:
                return False
        return length.isdigit() and int(length) <= self._max_body and self._guard.admits(scope)

    def serve(self, connection: BoundedProtocol, cycle: RequestResponseCycle) -> bool:
        """Whether the request of *cycle* (its body whole) was taken; if so it is answered later."""
        scope, body = cycle.scope, bytes(cycle.body)
        if MARK not in body or not media_types_taken(scope):
            return False
        try:
            profile = self._paths.profile(scope["path"])
        except LookupError:
            return False
        if scope["path"] != "/mcp" and profile is None:
            return False
        headers = dict(scope["headers"])
        session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if session_id:
            taken = self.fast.take(scope, body, session_id, profile)
        elif headers.get(b"mcp-method") == b"tools/call":
            taken = self.fast.take_modern(scope, headers, body, profile)
        else:
            return False
        if taken is None:
            return False
        if not self.bodies.take_slot(session_id):  # the ASGI way answers 429
            _release(taken)
            return False
        if not _Call(self, connection, cycle, taken, session_id).start():
            self.bodies.give_slot(session_id)
            _release(taken)
            return False
        return True


class _Call:
    """One quick call, from its start to its answer (or its end without one)."""

    __slots__ = ("_connection", "_cycle", "_gone", "_owner", "_release", "_running", "_session_id", "_taken")

    def __init__(
        self,
        owner: QuickCalls,
        connection: BoundedProtocol,
        cycle: RequestResponseCycle,
        taken: Taken,
        session_id: str,
    ) -> None:
        self._owner, self._connection, self._cycle, self._taken = owner, connection, cycle, taken
        self._session_id = session_id
        self._gone = False
        self._running: Running | None = None
        self._release = _nothing

    def start(self) -> bool:
        """Send the call; False when only the awaited path can (nothing was sent)."""
        running = self._owner.fast.runner.start(self._taken, self._delivered)
        if running is None:
            return False
        if running.ended:
            return True  # answered at once: nothing left to hold
        self._running = running
        if self._taken.session.lasting:  # a handshake-era session's: busy while the call runs
            self._release = self._owner.sessions.hold(self._session_id)
        self._connection.watch_lost(self._lost)
        return True

    def _lost(self) -> None:
        self._gone = True
        assert self._running is not None
        self._running.cancel()

    def _delivered(self, answer: bytes | None) -> None:
        """Its answer; None: the client cancelled it (202, as on the fast path) or went (nothing)."""
        taken = self._taken
        self._connection.watch_lost(None)
        self._release()
        self._owner.bodies.give_slot(self._session_id)
        _release(taken)
        if answer is None:
            if not self._gone:
                self._connection.answer(self._cycle, 202, [], b"")
            return
        modern = not taken.session.lasting
        status = modern_status(answer, taken.call.id) if modern else 200
        headers = [_JSON]
        if not modern and status == 200:
            headers.append((b"mcp-session-id", self._session_id.encode("latin-1")))
        self._connection.answer(self._cycle, status, headers, answer)


def _release(taken: Taken) -> None:
    if not taken.session.lasting:
        taken.session.close()  # a 2026-07-28 call's session is this request's alone


def _nothing() -> None:
    pass
