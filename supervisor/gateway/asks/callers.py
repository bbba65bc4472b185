"""A child's sampling, elicitation and roots requests, to the gateway client whose call it serves.

Which call a request serves is decided in :mod:`supervisor.extension.asking`; here are the callers: how a
gateway client is asked, whichever path its call took.

- A call on the SDK's path (:class:`SessionCaller`) asks on the request's own channel: on
  ``mcp.sock`` the connection's stream, on streamable HTTP the call's response stream.
- A call on the fast path (:mod:`.fastpath`) has no SDK request; its listener connection is
  linked (:class:`ClientLink`) to the SDK connection of the same client when that client lists
  tools (the fast path opens only after that), and asks on it (:class:`LinkedCaller`).

Either way the request goes out under an id of the SDK's own (never the child's: ids that cross
a hop are mapped) and the answer is validated before it goes back to the child. Per client
connection at most :data:`MAX_ASKS` requests wait at once (more are refused at once), and its
disconnect fails those waiting at once. 2026-07-28 clients cannot be sent requests: their
``tools/call``, ``prompts/get`` and ``resources/read`` get input-required results instead
(:mod:`.inputrequired`); during any other request the child gets an error saying so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.connection import Connection
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from supervisor.extension.asking import NOT_ANSWERABLE

__all__ = (
    "MAX_ASKS",
    "ClientLink",
    "LinkedCaller",
    "SessionCaller",
    "bind",
    "capability_refusal",
    "client_of",
    "current_link",
    "known_client",
    "note",
    "result_type",
)

MAX_ASKS = 16  # requests from extensions waiting for one client connection at once
_STATE_KEY = "mcp-supervisor.asks"  # in the SDK connection's per-connection state
_CAPABILITY = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
ResultT = TypeVar("ResultT", bound=BaseModel)


class _Closing:
    """Something that ends once, calling back whoever asked to hear of it (sync callbacks)."""

    def __init__(self) -> None:
        self.closed = False
        self._on_close: list[Callable[[], None]] = []

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call *callback* (sync) when it closes; at once if it has."""
        if self.closed:
            callback()
        else:
            self._on_close.append(callback)

    def close(self) -> None:
        self.closed = True
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()


class _Client(_Closing):
    """One client connection's asks in flight: at most :data:`MAX_ASKS`, failed at once when it goes.

    Its close callbacks stop its per-client instances.
    """

    def __init__(self, *, lasting: bool = True) -> None:
        super().__init__()
        self.waiting: set[anyio.CancelScope] = set()
        self.lasting = lasting  # False: the connection serves one request (2026-07-28 over HTTP)

    def close(self) -> None:
        for scope in self.waiting:
            scope.cancel()
        super().close()

    async def run(self, send: Callable[[], Awaitable[ResultT]]) -> ResultT:
        if self.closed:
            raise MCPError(types.CONNECTION_CLOSED, "the calling client has disconnected")
        if len(self.waiting) >= MAX_ASKS:
            raise MCPError(NOT_ANSWERABLE, f"the calling client has {MAX_ASKS} requests waiting already")
        scope = anyio.CancelScope()
        self.waiting.add(scope)
        try:
            with scope:
                return await send()
        except ValidationError as exc:
            raise MCPError(
                types.INTERNAL_ERROR, f"the calling client's answer is invalid: {exc.errors()[:1]}"
            ) from None
        finally:
            self.waiting.discard(scope)
        raise MCPError(types.CONNECTION_CLOSED, "the calling client disconnected before it answered")


def client_of(connection: Connection) -> _Client:
    """The object that stands for *connection*'s client (created on first use, closed with it).

    A 2026-07-28 request has an SDK connection of its own: on mcp.sock its client is the listener
    connection's (closed with that), so its per-client instance lives as long as the client.
    """
    client = connection.state.get(_STATE_KEY)
    if client is None:
        link = _LINK.get()
        if connection.protocol_version in MODERN_PROTOCOL_VERSIONS and link is not None:
            client = connection.state[_STATE_KEY] = link.client()
        else:
            client = connection.state[_STATE_KEY] = _Client(lasting=connection.has_standalone_channel)
            connection.exit_stack.callback(client.close)
    return client


def known_client(connection: Connection) -> object | None:
    """:func:`client_of` *connection* if it was ever needed (a call, an instance), else None. Sync."""
    return connection.state.get(_STATE_KEY)


def _refusal(connection: Connection, method: str) -> str | None:
    if connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return (
            "the calling client speaks the 2026-07-28 protocol, which has no requests from server to "
            "client; only its tools/call, prompts/get and resources/read can return input-required results"
        )
    return capability_refusal(connection.client_capabilities, method)


def capability_refusal(capabilities: types.ClientCapabilities | None, method: str) -> str | None:
    """Why a client that declared *capabilities* cannot be asked *method*, or None. Pure."""
    capability = _CAPABILITY.get(method)
    if capability is None or capabilities is None or getattr(capabilities, capability, None) is None:
        return f"the calling client did not declare the {capability or method} capability"
    return None


def result_type(request: types.ServerRequest) -> type[BaseModel]:
    """The model a client's answer to *request* must validate as."""
    if isinstance(request, types.CreateMessageRequest):
        params = request.params
        tools = params.tools is not None or params.tool_choice is not None
        return types.CreateMessageResultWithTools if tools else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    if isinstance(request, types.ListRootsRequest):
        return types.ListRootsResult
    return types.EmptyResult


class SessionCaller:
    """The client of a call on the SDK's path, asked on that request's own channel."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self._ctx = ctx
        self._connection: Connection = ctx.session._connection  # the SDK has no public accessor (2.3)

    @property
    def client(self) -> object:
        return client_of(self._connection)

    def refusal(self, method: str) -> str | None:
        refusal = _refusal(self._connection, method)
        if refusal is None and not self._ctx.session.can_send_request:
            return "the calling client's transport cannot take requests from the server for this call"
        return refusal

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        metadata = ServerMessageMetadata(related_request_id=self._ctx.request_id)
        session, answer_type = self._ctx.session, result_type(request)
        return await client_of(self._connection).run(
            lambda: session.send_request(request, answer_type, metadata=metadata)
        )  # type: ignore[return-value]


class ClientLink(_Closing):
    """A listener connection's tie to the SDK connection of the same client (for its fast calls).

    It also stands for that connection itself: the calls its 2026-07-28 client left waiting for
    input end when it closes (:meth:`on_close`).
    """

    def __init__(self, *, lasting: bool = True) -> None:
        super().__init__()
        self.connection: Connection | None = None
        self.lasting = lasting  # False: it stands for one request (a 2026-07-28 call over HTTP)
        self._client: _Client | None = None

    def client(self) -> _Client:
        """The client of this connection's 2026-07-28 requests (see :func:`client_of`)."""
        if self._client is None:
            self._client = _Client(lasting=self.lasting)
            self.on_close(self._client.close)
        return self._client


_LINK: ContextVar[ClientLink | None] = ContextVar("mcp_supervisor_client_link", default=None)


def bind(link: ClientLink) -> None:
    """Make *link* the one :func:`note` fills in the current task and the tasks it starts."""
    _LINK.set(link)


def current_link() -> ClientLink | None:
    """The link of the mcp.sock connection the current request came through; None elsewhere (HTTP)."""
    return _LINK.get()


def note(ctx: ServerRequestContext[Any]) -> None:
    """Record *ctx*'s SDK connection on the listener's link, if the request came through one."""
    link = _LINK.get()
    if link is not None and link.connection is None:
        link.connection = ctx.session._connection


class LinkedCaller:
    """The client of a fast call, asked on its SDK connection's channel (on mcp.sock: its stream)."""

    def __init__(self, link: ClientLink) -> None:
        self._link = link

    @property
    def client(self) -> object:
        return client_of(self._link.connection) if self._link.connection is not None else self

    def refusal(self, method: str) -> str | None:
        if self._link.connection is None:  # cannot happen: the fast path opens after a listing
            return "the calling client is not known to the gateway"
        return _refusal(self._link.connection, method)

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        connection = self._link.connection
        assert connection is not None
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        answer_type = result_type(request)

        async def send() -> BaseModel:
            answer = await connection.outbound.send_raw_request(data["method"], data.get("params"))
            return answer_type.model_validate(answer, by_name=False)

        return await client_of(connection).run(send)  # type: ignore[return-value]
