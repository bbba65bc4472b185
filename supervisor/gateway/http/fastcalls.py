"""The fast path over HTTP: a plain ``tools/call`` answered as JSON, without the SDK.

On ``mcp.sock`` plain tool calls skip the SDK (:mod:`..fast`); over HTTP its transport,
models and SSE cost more still (about 5 ms of daemon CPU a call). :class:`FastPath` takes a POST
to ``/mcp`` (or ``/mcp/NAME``) whose body is one plain ``tools/call`` from a client that accepts
``application/json``, routes it in the client's view, calls the child as plain JSON and
answers with one JSON body, as the specification allows; the gateway's runner
(:mod:`..fast.runner`) serves it, as it serves the other front-ends' calls. Anything else goes
on to the SDK, which stays the reference for behaviour. Two kinds of call are taken:

- of a handshake-era session that has listed tools or made a call before
  (:meth:`~..server.Gateway.note_http_session`), with no ``_meta`` but a progress token (the
  same test as on ``mcp.sock``);
- of a 2026-07-28 client (no session; the protocol version, client info and capabilities in
  ``_meta``), whose routing headers the SDK would pass as they are, and which declared none of
  sampling, elicitation and roots: its child's questions are refused as the SDK refuses them
  for such a client, where a client that may be asked gets input-required results there. The
  result is shaped as the SDK shapes it for that version (schema, ``resultType``, the
  server's stamp), and an error gets the HTTP status the SDK gives its code.

What the SDK's path gives a call, this one keeps: the session's per-client instance, its
questions (on the session's own connection, its GET stream), the session held busy while the
call runs (:meth:`~.sessions.Sessions.serving`), and cancellation: by the client's
``notifications/cancelled`` (POSTed later, matched by session and request id) or by its
connection closing (heard through the connection's ``watch_lost``, without a task per call).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import mcp_types as types
import pydantic_core
import structlog
from mcp.server.streamable_http import check_accept_headers
from mcp.shared.inbound import MCP_PARAM_HEADER_PREFIX, X_MCP_HEADER_KEY
from mcp_types import methods
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from supervisor.errors import first_line
from supervisor.gateway.asks.callers import ASKING_CAPABILITIES, UnaskableCaller
from supervisor.gateway.catalog import Catalog
from supervisor.gateway.fast import parse
from supervisor.gateway.fast.answers import Shape, modern_status
from supervisor.gateway.fast.parse import MARK
from supervisor.gateway.fast.runner import Runner, Taken
from supervisor.gateway.http.bodies import replay
from supervisor.gateway.http.connections import CONNECTION
from supervisor.gateway.http.sessions import Sessions
from supervisor.gateway.server import Gateway
from supervisor.gateway.session import Session
from supervisor.gateway.toolerrors import raw_tool_error
from supervisor.gateway.view.profiles import SCOPE_KEY, Chosen

__all__ = ("FastPath", "Taken", "media_types_taken")

log = structlog.get_logger(__name__)

_CANCELLED = b'"notifications/cancelled"'
_JSON = [(b"content-type", b"application/json")]
_ROUTING_HEADERS = frozenset({b"mcp-method", b"mcp-name", b"mcp-protocol-version"})
_PARAM_HEADER = MCP_PARAM_HEADER_PREFIX.lower().encode()
_MEDIA_HEADERS = frozenset({b"content-type", b"accept"})
_X_MCP_HEADER = f'"{X_MCP_HEADER_KEY}"'.encode()


class FastPath:
    """ASGI middleware in front of the SDK's app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, gateway: Gateway, sessions: Sessions) -> None:
        self.app = app
        self._gateway = gateway
        self._sessions = sessions
        self.runner: Runner = gateway.calls
        self._annotated: tuple[Catalog | None, frozenset[str]] = (None, frozenset())
        self._stamped: tuple[object, dict[str, Any]] = (None, {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("path") != "/mcp":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
        modern = not session_id and headers.get(b"mcp-method") == b"tools/call"
        if not session_id and not modern:
            await self.app(scope, receive, send)
            return
        first = await receive()  # the whole body (.bodies read it first)
        body = first.get("body", b"") if first["type"] == "http.request" else b""
        replayed = replay(first, receive)
        if MARK in body and media_types_taken(scope):
            if modern and await self._serve_modern(scope, headers, body, send):
                return
            if not modern and await self._serve(scope, body, session_id, send):
                return
        cancelled = parse.cancelled_id(body) if _CANCELLED in body else None
        if cancelled is not None and (session := self._gateway.http_sessions.get(session_id)) is not None:
            self.runner.cancel(session, cancelled)  # and on to the SDK, which answers the notification (202)
        await self.app(scope, replayed, send)

    def take(self, scope: Scope, body: bytes, session_id: str, profile: str | None) -> Taken | None:
        """A handshake-era call in *body* that the fast path can serve, routed in *profile*;
        None to let the SDK's path serve it (and say what is wrong). Sync."""
        session = self._gateway.http_sessions.get(session_id)
        call = parse.parse(body)
        if session is None or call is None or not self._sessions.live(session_id):
            return None  # expired or ended: the SDK answers 404, the client opens a new one
        if not _connected(scope):
            return None  # not our listener's, or the client has gone: the SDK's path notices
        return self.runner.take(call, session, Chosen(profile) if profile else None)

    async def _serve(self, scope: Scope, body: bytes, session_id: str, send: Send) -> bool:
        """Answer *body* here if the fast path can; False to let the SDK's path serve it."""
        taken = self.take(scope, body, session_id, scope.get(SCOPE_KEY))
        if taken is None:
            return False
        with self._sessions.serving(session_id):
            answer = await self.runner.run(taken, scope[CONNECTION].watch_lost)  # its client going cancels it
        if answer is None:  # cancelled by the client, or it went: a cancelled request gets no answer
            await _respond(send, 202, b"")
            return True
        headers = [*_JSON, (b"mcp-session-id", session_id.encode("latin-1"))]
        await _respond(send, 200, answer, headers)
        return True

    async def _serve_modern(self, scope: Scope, headers: dict[bytes, bytes], body: bytes, send: Send) -> bool:
        """Answer a 2026-07-28 ``tools/call`` here if the fast path can; False for the SDK's path.

        Taken only when the SDK's modern checks would pass it as is (the routing headers once
        each and matching the body, no ``Mcp-Param-*`` header to check against the arguments)
        and when the child's questions need no input-required result (the client declared none
        of sampling, elicitation and roots). No session: a Session for this request only, as
        the SDK's path gives one (a per-client extension refuses it there). Cancellation is the
        client closing its connection.
        """
        taken = self.take_modern(scope, headers, body, scope.get(SCOPE_KEY))
        if taken is None:
            return False
        try:
            answer = await self.runner.run(taken, scope[CONNECTION].watch_lost)
        finally:
            taken.session.close()
        if answer is not None:  # else the client went: nobody to answer
            await _respond(send, modern_status(answer, taken.call.id), answer, _JSON)
        return True

    def take_modern(
        self, scope: Scope, headers: dict[bytes, bytes], body: bytes, profile: str | None
    ) -> Taken | None:
        """A 2026-07-28 call in *body* that the fast path can serve (see :meth:`_serve_modern`),
        routed in *profile*, with a Session for this request only (the caller closes it); None to
        let the SDK's path serve it. Sync."""
        modern = parse.parse_modern(body)
        if (
            modern is None
            or headers.get(b"mcp-protocol-version", b"").decode("latin-1") != modern.version
            or headers.get(b"mcp-name", b"").decode("latin-1") != modern.call.name
            or modern.capabilities.keys() & ASKING_CAPABILITIES
            or not _plain_headers(scope["headers"])
            or modern.call.name in self._with_param_headers()
        ):
            return None
        if not _connected(scope):
            return None
        session = Session("http", lasting=False)
        chosen = Chosen(profile) if profile else None
        taken = self.runner.take(modern.call, session, chosen, caller=UnaskableCaller(session))
        if taken is None:
            session.close()
            return None
        return taken.shaped(self._modern_shape(modern.version, taken.ext.name, taken.tool))

    def _modern_shape(self, version: str, extension: str, tool: str) -> Shape:
        """A result of *tool* as the SDK's path gives it to a client of *version*: the version's
        schema (what it does not know is dropped), ``resultType``, the server's stamp; a result
        that is no tool result becomes the tool error the SDK's path answers for it."""

        def shape(result: dict[str, Any]) -> dict[str, Any]:
            # What the SDK's path makes of a child's result: a complete one, whatever the child
            # claimed (input-required results are the gateway's own, never a child's).
            for member in ("inputRequests", "requestState"):
                result.pop(member, None)
            result["resultType"] = "complete"
            result.setdefault("isError", False)
            try:  # what the SDK's path holds a child's tool result to (the session's model)
                types.CallToolResult.model_validate(result, by_name=False)
            except ValueError as exc:
                error = first_line(exc, typed=False)
                log.warning(
                    "extension.bad_result", extension=extension, request=f"tool {tool!r}", error=error
                )
                result = raw_tool_error(
                    f"extension {extension!r} returned an invalid result for tool {tool!r}"
                )
                result["resultType"] = "complete"
            shaped = methods.serialize_server_result("tools/call", version, result)
            meta = shaped.get("_meta")
            if meta is None or (isinstance(meta, dict) and meta.get(types.SERVER_INFO_META_KEY) is None):
                shaped["_meta"] = {**(meta or {}), types.SERVER_INFO_META_KEY: self._stamp()}
            return shaped

        return shape

    def _stamp(self) -> dict[str, Any]:
        """The server's stamp, as the SDK's path puts it in a result's ``_meta``. One copy, shared:
        an answer is encoded as soon as it is shaped, and nothing changes the stamp in it."""
        server = self._gateway.server
        if self._stamped[0] is not server:
            self._stamped = (server, server.server_info_stamp)
        return self._stamped[1]

    def _with_param_headers(self) -> frozenset[str]:
        """The exposed tools whose input schema names ``x-mcp-header`` anywhere: the SDK checks
        their ``Mcp-Param-*`` headers against the arguments, so their calls go its way. One
        catalog's worth, computed when the catalog changes."""
        catalog = self._gateway.router.catalog()
        if self._annotated[0] is not catalog:
            annotated = frozenset(
                tool.name
                for tool in catalog.tools
                if _X_MCP_HEADER in pydantic_core.to_json(tool.input_schema)
            )
            self._annotated = (catalog, annotated)
        return self._annotated[1]


def media_types_taken(scope: Scope) -> bool:
    """The SDK's transport would take this request's media types as they are: a JSON body, and
    both JSON and an event stream acceptable (it serves streams); each header once."""
    raw = scope["headers"]
    if sum(name in _MEDIA_HEADERS for name, _ in raw) != len(_MEDIA_HEADERS):
        return False  # missing, or given twice: the SDK says what it makes of that
    request = Request(scope)
    content_type = request.headers["content-type"].split(";")[0].strip()
    return content_type == "application/json" and all(check_accept_headers(request))


def _plain_headers(raw: Iterable[tuple[bytes, bytes]]) -> bool:
    """No routing header twice and no ``Mcp-Param-*`` header: nothing for the SDK's checks to refuse."""
    seen: set[bytes] = set()
    for name, _ in raw:
        name = name.lower()
        if name.startswith(_PARAM_HEADER) or (name in _ROUTING_HEADERS and name in seen):
            return False
        seen.add(name)
    return True


def _connected(scope: Scope) -> bool:
    """The request came through our listener, and its client is still there."""
    connection = scope.get(CONNECTION)
    return connection is not None and not connection.transport.is_closing()


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    # A length, not chunks: two writes per answer instead of three, and the client parses less.
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [*(headers or []), length]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
