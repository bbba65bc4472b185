"""A child's sampling, elicitation and roots requests, to the gateway client whose call it serves.

Which call a request serves is decided in :mod:`supervisor.extension.asking`; here are the
callers: how a gateway client is asked, whichever path its call took.

- A call on the SDK's path (:class:`SessionCaller`) asks on the request's own channel: on
  ``mcp.sock`` the connection's stream, on streamable HTTP the call's response stream.
- A call on the fast path (:mod:`..fast`) has no SDK request; it asks on the SDK connection
  of its client's :class:`~..session.Session` (known once the client made a handshake-era
  request; the fast path opens only after it listed tools) (:class:`FastCaller`).

Either way the request goes out under an id of the SDK's own (never the child's: ids that cross
a hop are mapped) and the answer is validated before it goes back to the child. The client's
Session bounds the questions waiting for it and fails them when it goes
(:meth:`~..session.Session.ask`). 2026-07-28 clients cannot be sent requests: their
``tools/call``, ``prompts/get`` and ``resources/read`` get input-required results instead
(:mod:`.inputrequired`); during any other request the child gets an error saying so.
"""

from __future__ import annotations

from typing import Any, TypeVar

import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.connection import Connection
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from supervisor.extension.asking import NOT_ANSWERABLE
from supervisor.gateway.session import Session, connection_of, session_of

__all__ = (
    "ASKING_CAPABILITIES",
    "FastCaller",
    "SessionCaller",
    "UnaskableCaller",
    "capability_refusal",
    "opens_urls",
    "result_type",
)

_CAPABILITY = {  # the capability each question needs
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
ASKING_CAPABILITIES = frozenset(_CAPABILITY.values())  # a client declaring none cannot be asked
ResultT = TypeVar("ResultT", bound=BaseModel)


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


def opens_urls(connection: Connection | None) -> bool:
    """Whether a handshake-era client declared URL-mode elicitation (MCP 2025-11-25). Pure."""
    if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return False
    elicitation = connection.client_capabilities.elicitation if connection.client_capabilities else None
    return elicitation is not None and elicitation.url is not None


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
        self._connection = connection_of(ctx)
        self._session = session_of(ctx)

    @property
    def client(self) -> Session:
        return self._session

    def opens_urls(self) -> bool:
        return opens_urls(self._connection)

    def refusal(self, method: str) -> str | None:
        refusal = _refusal(self._connection, method)
        if refusal is None and not self._ctx.session.can_send_request:
            return "the calling client's transport cannot take requests from the server for this call"
        return refusal

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        metadata = ServerMessageMetadata(related_request_id=self._ctx.request_id)
        session, answer_type = self._ctx.session, result_type(request)
        return await self._session.ask(lambda: session.send_request(request, answer_type, metadata=metadata))  # type: ignore[return-value]


class FastCaller:
    """The client of a fast call, asked on its Session's SDK connection (on mcp.sock: its stream)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def client(self) -> Session:
        return self._session

    def opens_urls(self) -> bool:
        return opens_urls(self._session.connection)

    def refusal(self, method: str) -> str | None:
        if self._session.connection is None:  # cannot happen: the fast path opens once it is noted
            return "the calling client is not known to the gateway"
        return _refusal(self._session.connection, method)

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        connection = self._session.connection
        assert connection is not None
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        answer_type = result_type(request)

        async def send() -> BaseModel:
            answer = await connection.outbound.send_raw_request(data["method"], data.get("params"))
            return answer_type.model_validate(answer, by_name=False)

        return await self._session.ask(send)  # type: ignore[return-value]


class UnaskableCaller(FastCaller):
    """The client of a 2026-07-28 fast call (over HTTP), which declared none of sampling,
    elicitation and roots: each question of the child is refused as the SDK's path refuses it
    for such a client (it never becomes an input-required result)."""

    def opens_urls(self) -> bool:
        return False

    def refusal(self, method: str) -> str | None:
        return capability_refusal(None, method)

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        raise MCPError(NOT_ANSWERABLE, self.refusal(request.method) or "not answerable")
