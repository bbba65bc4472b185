"""MCP sessions over HTTP: the SDK's session manager, with the bounds of a shared listener.

The SDK turns a client away with 503 while ``max_sessions`` are open, and forgets a session
only after ``session_idle_timeout`` without a request: 256 ``initialize`` requests, made in two
seconds and never followed up, locked every other client out for ten minutes (and a session's
per-client instances live as long as it does). :class:`Sessions` instead:

- at the cap, ends the session idle longest (none of its requests being served) to admit the
  new one, as the control socket does with its idlest connection;
- at a per-client extension's ``max_instances``, ends the session idle longest among those
  holding an instance, if it has been idle ``reclaim_idle`` seconds (:meth:`end_idle`): a
  client gone without DELETE would otherwise hold a child for the whole idle timeout;
- gives a session that made no request after its ``initialize`` ``fresh_session`` seconds,
  not the full idle timeout: a client that means to use its session follows up at once
  (``notifications/initialized``);
- ends every session at once when the listener stops (:meth:`end_all`), so that open streams
  close before uvicorn's graceful wait instead of being cancelled by it.

It reads the SDK's session table (``_server_instances``, 2.3) and each transport's
``idle_scope``, whose deadline is infinite while a request is served and the time it expires
otherwise.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterator
from typing import Any

import anyio
import structlog
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from supervisor.gateway.http.limits import HttpLimits
from supervisor.logs import Throttled

__all__ = ("Sessions",)

log = structlog.get_logger(__name__)


class Sessions(StreamableHTTPSessionManager):
    """The SDK's stateful session manager, bounded by *limits* (see the module's docstring)."""

    def __init__(self, app: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(
            app,
            max_sessions=limits.max_sessions,
            session_idle_timeout=limits.session_idle,
            max_request_body_size=limits.max_body,
            **kwargs,
        )
        self._fresh = limits.fresh_session
        self._reclaim_idle = limits.reclaim_idle
        self.ended = Throttled(log, "gateway.http_session_ended", level="info")

    def __len__(self) -> int:
        return len(self._server_instances)

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        if len(self._server_instances) >= self.max_sessions:  # type: ignore[operator]
            self._end_idlest()
        return super()._admit_session(requestor)

    def _end_idlest(self) -> None:
        idlest = self._idlest(self._server_instances, before=math.inf)
        if idlest is None:
            return  # every session is being served: the SDK answers 503
        self._end(*idlest)
        self.ended("evicted", reason="made room for a new session (it was idle the longest)")

    def end_idle(self, among: Collection[str]) -> str | None:
        """End the session idle longest of *among* (ids), if none of its requests is served and
        no stream of it has been open for ``reclaim_idle`` seconds: its id, or None."""
        timeout = self.session_idle_timeout
        if timeout is None:
            return None
        # A session's idle deadline is its last request's end plus the idle timeout.
        idlest = self._idlest(among, before=anyio.current_time() - self._reclaim_idle + timeout)
        if idlest is None:
            return None
        self._end(*idlest)
        self.ended("reclaimed", reason="made room for another client's per-client instance (idle)")
        return idlest[0]

    def _idlest(
        self, among: Collection[str], before: float
    ) -> tuple[str, StreamableHTTPServerTransport] | None:
        """The session of *among* whose idle deadline comes first, if it comes before *before*
        (none of its requests served, no stream open); None if there is none."""
        idle = [
            (scope.deadline, session_id, transport)
            for session_id in among
            if (transport := self._server_instances.get(session_id)) is not None
            and (scope := transport.idle_scope) is not None
            and scope.deadline < before
        ]
        if not idle:
            return None
        _, session_id, transport = min(idle, key=lambda entry: entry[0])
        return session_id, transport

    def _end(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        """Forget *session_id* now (its id answers 404) and end its server task (and what it holds)."""
        self._server_instances.pop(session_id, None)
        self._session_owners.pop(session_id, None)
        if transport.idle_scope is not None:
            transport.idle_scope.cancel()

    async def _serve_opening_request(
        self, http_transport: StreamableHTTPServerTransport, scope: Scope, receive: Receive, send: Send
    ) -> None:
        await super()._serve_opening_request(http_transport, scope, receive, send)
        idle_scope = http_transport.idle_scope
        if idle_scope is not None and math.isfinite(idle_scope.deadline):  # nothing else in flight yet
            idle_scope.deadline = min(idle_scope.deadline, anyio.current_time() + self._fresh)

    def live(self, session_id: str) -> bool:
        """Whether *session_id* names a session that is open now (its id would not answer 404)."""
        transport = self._server_instances.get(session_id)
        return transport is not None and not transport.is_terminated

    @contextlib.contextmanager
    def serving(self, session_id: str) -> Iterator[None]:
        """A request of *session_id* served outside the SDK's transport (the fast path): it holds
        the session as one of the SDK's requests would, and its end restarts the idle countdown."""
        release = self.hold(session_id)
        try:
            yield
        finally:
            release()

    def hold(self, session_id: str) -> Callable[[], None]:
        """:meth:`serving`, sync: the session is held until the returned callable is called (once)."""
        transport = self._server_instances.get(session_id)
        scope = transport.idle_scope if transport is not None else None
        timeout = self.session_idle_timeout
        if transport is None or scope is None or timeout is None:
            return _nothing
        transport._requests_in_flight += 1  # the SDK's own count (2.3): handle_request does the same
        scope.deadline = math.inf

        def release() -> None:
            transport._requests_in_flight -= 1
            if not transport._requests_in_flight:
                scope.deadline = anyio.current_time() + timeout

        return release

    async def end_all(self) -> None:
        """End every session now, closing its streams (a shutdown)."""
        sessions = list(self._server_instances.items())
        for session_id, transport in sessions:
            self._end(session_id, transport)
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            for _, transport in sessions:
                await transport.terminate()


def _nothing() -> None:
    pass
