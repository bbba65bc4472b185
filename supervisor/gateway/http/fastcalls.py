"""The fast path over HTTP: a plain ``tools/call`` of a known session answered as JSON, without the SDK.

On ``mcp.sock`` plain tool calls skip the SDK (:mod:`..fastpath`); over HTTP its transport,
models and SSE cost more still (about 5 ms of daemon CPU a call). :class:`FastPath` takes a POST
to ``/mcp`` (or ``/mcp/NAME``) whose body is one plain ``tools/call`` (the same test as on
``mcp.sock``: no ``_meta``, no progress token) of a handshake-era session that has listed tools
(:meth:`~..server.Gateway.note_http_session`), from a client that accepts
``application/json``; it routes it in the session's view, calls the child as plain JSON and
answers with one JSON body, as the specification allows. Anything else goes on to the SDK,
which stays the reference for behaviour.

What the SDK's path gives a call, this one keeps: the session's per-client instance, its
questions (on the session's own connection, its GET stream), the session held busy while the
call runs (:meth:`~.sessions.Sessions.serving`), and cancellation: by the client's
``notifications/cancelled`` (POSTed later, matched by session and request id) or by its
connection closing (heard through the connection's ``watch_lost``, without a task per call).
"""

from __future__ import annotations

import anyio
import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from supervisor.gateway import fastpath
from supervisor.gateway.fastpath import MARK, RequestId, answer_call
from supervisor.gateway.http.bodies import replay
from supervisor.gateway.http.connections import CONNECTION
from supervisor.gateway.http.sessions import Sessions
from supervisor.gateway.server import Gateway
from supervisor.gateway.view.profiles import SCOPE_KEY, Chosen

__all__ = ("FastPath",)

log = structlog.get_logger(__name__)

_CANCELLED = b'"notifications/cancelled"'
_JSON = [(b"content-type", b"application/json")]


class FastPath:
    """ASGI middleware in front of the SDK's app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, gateway: Gateway, sessions: Sessions) -> None:
        self.app = app
        self._gateway = gateway
        self._sessions = sessions
        # Fast calls running, by (session id, request id): what a later cancel names. At most one
        # per request being served (bounded by the listener's connections).
        self._running: dict[tuple[str, RequestId], anyio.CancelScope] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", ())) if scope["type"] == "http" else {}
        session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if not session_id or scope["method"] != "POST" or scope.get("path") != "/mcp":
            await self.app(scope, receive, send)
            return
        first = await receive()  # the whole body (.bodies read it first)
        body = first.get("body", b"") if first["type"] == "http.request" else b""
        replayed = replay(first, receive)
        takes_json = b"application/json" in headers.get(b"accept", b"")
        if MARK in body and takes_json and await self._serve(scope, body, session_id, send):
            return
        cancelled = fastpath.cancelled_id(body) if _CANCELLED in body else None
        if cancelled is not None and (running := self._running.get((session_id, cancelled))) is not None:
            running.cancel()  # and on to the SDK, which answers the notification (202)
        await self.app(scope, replayed, send)

    async def _serve(self, scope: Scope, body: bytes, session_id: str, send: Send) -> bool:
        """Answer *body* here if the fast path can; False to let the SDK's path serve it."""
        session = self._gateway.http_sessions.get(session_id)
        call = fastpath.parse(body)
        if session is None or session.closed or call is None or call.progress_token is not None:
            return False
        if not self._sessions.live(session_id):
            return False  # expired or ended: the SDK answers 404, the client opens a new one
        profile = scope.get(SCOPE_KEY)
        route = self._gateway.router.route_tool(call.name, Chosen(profile) if profile else None, session)
        if route is None:
            return False  # hidden, unknown, a meta-tool, an instance refused: the SDK's path says why
        key = (session_id, call.id)
        if key in self._running:
            return False  # a duplicate id in flight: the SDK's path answers as it does
        connection = scope.get(CONNECTION)
        if connection is None or connection.transport.is_closing():
            return False  # not our listener's, or the client has gone: the SDK's path notices
        answer: bytes | None = None
        with anyio.CancelScope() as cancelled, self._sessions.serving(session_id):
            self._running[key] = cancelled
            connection.watch_lost(cancelled.cancel)  # the client going cancels the call
            try:
                answer = await answer_call(call, *route, session, self._gateway.spool_prefix)
            finally:
                connection.watch_lost(None)
                self._running.pop(key, None)
        if answer is None:  # cancelled by the client, or it went: a cancelled request gets no answer
            await _respond(send, 202, b"")
            return True
        headers = [*_JSON, (b"mcp-session-id", session_id.encode("latin-1"))]
        await _respond(send, 200, answer, headers)
        return True


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    # A length, not chunks: two writes per answer instead of three, and the client parses less.
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [*(headers or []), length]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
