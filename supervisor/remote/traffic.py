"""What a remote run hears of its traffic, and what of it ends the run.

:class:`Watch` sees each HTTP response before the transports act on it (a 5xx, or a 404 for an
established session, ends the run first, so the request it answered fails as cut by that end)
and keeps the last failure of the network, to say why a broken transport ended the run.
:class:`Sending` is the session's write stream (the ids a task sends, the spool's schemas).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2
import mcp_types as types
from mcp.shared.message import SessionMessage

from supervisor.errors import first_line
from supervisor.upstream.spool import ExtensionSpool
from supervisor.upstream.wire import SENDING, InboundRequests

__all__ = ("STREAM_CUT", "Sending", "Watch", "cut_off", "failure", "tool_result")

STREAM_CUT = "SSE stream ended without a response"  # an answer's stream broke off (the server left)


class Watch:
    """The run's view of its HTTP traffic (:class:`supervisor.remote.http.Watch`; see the module)."""

    def __init__(self, end: Callable[[str], None]) -> None:
        self._end = end  # ends the run, with why
        self.last_failure: str | None = None
        self.session_id: str | None = None  # what the session's requests carry (streamable HTTP)

    def answered(self, request: httpx2.Request, status: int) -> None:
        if status >= 500:
            self._end(f"the server answered HTTP {status}")
        elif status == 404 and "mcp-session-id" in request.headers:
            self._end("the server no longer knows the session (404): a new run initializes again")
        elif status < 300 and (session_id := request.headers.get("mcp-session-id")) is not None:
            self.session_id = session_id

    def failed(self, error: httpx2.TransportError) -> None:
        self.last_failure = failure(error)


class Sending:
    """The session's write stream: tells :data:`SENDING` the id of each request, as the child's
    outbox does, so that a server's question finds the call it came with; and the spool, whose
    rewrite of an answer's structured output must keep it valid for the tool's schema."""

    def __init__(self, inner: Any, spool: ExtensionSpool | None, inbound: InboundRequests) -> None:
        self._inner, self._spool, self._inbound = inner, spool, inbound

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            if self._spool is not None:
                self._spool.sent(message.id, message.method, message.params)
            if (sending := SENDING.get()) is not None:
                sending(message.id)
        try:
            await self._inner.send(item)
        finally:
            if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                self._inbound.settle(message.id)  # one of its requests answered

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Sending:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._inner.aclose()


def tool_result(answer: types.JSONRPCResponse) -> bool:
    result = answer.result
    return isinstance(result, dict) and (
        isinstance(result.get("content"), list) or "structuredContent" in result
    )


def cut_off(error: types.ErrorData) -> bool:
    """Whether the transport made *error* up for an answer whose stream broke off: the server
    went away (a server that cannot answer says so), and the run with it."""
    return error.code == types.CONNECTION_CLOSED and error.message == STREAM_CUT


def failure(exc: BaseException) -> str:
    """One line on why the transport failed, from the innermost error of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect: {first_line(exc, typed=False)}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"the server answered {exc.response.status_code} {exc.response.reason_phrase}"
    return first_line(exc, typed=False)
