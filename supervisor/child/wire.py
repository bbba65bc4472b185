"""JSON-RPC messages between the daemon and a child, where a bad one must cost only itself.

:class:`Outbox` is the session's write stream: each message is encoded in the task that sends
it, so a message that cannot be encoded (a lone surrogate in a client's arguments, nesting too
deep) fails its sender only, never the stdin pump whose failure would end the connection.
What every upstream shares (the ids a task sends, late answers) is in :mod:`supervisor.upstream.wire`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import TracebackType
from typing import Any

import mcp_types as types
import structlog
from anyio.streams.memory import MemoryObjectSendStream
from mcp import MCPError
from mcp.shared.message import SessionMessage

from supervisor.errors import first_line
from supervisor.upstream.wire import SENDING, InboundRequests

__all__ = ("Outbox",)

log = structlog.get_logger(__name__)


class Outbox:
    """The session's write stream: encodes each message in the task that sends it.

    So a message that cannot be encoded fails only its sender, never the stdin pump (whose
    failure would end the connection): a request (a call whose arguments hold a lone
    surrogate, or nest too deep) raises ``INVALID_PARAMS`` to its caller; a response or a
    notification goes out with the offending characters replaced.
    """

    def __init__(
        self,
        sink: MemoryObjectSendStream[bytes],
        inbound: InboundRequests,
        on_request: Callable[[types.RequestId, str, Any], None] | None = None,
    ) -> None:
        self._sink = sink
        self._inbound = inbound
        self._on_request = on_request  # sees (id, method, params) of each request before it goes

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            if self._on_request is not None:
                self._on_request(message.id, message.method, message.params)
            if (sending := SENDING.get()) is not None:
                sending(message.id)
        try:
            if (data := _encode(message)) is not None:
                await self._sink.send(data)
        finally:
            if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                self._inbound.settle(message.id)

    async def aclose(self) -> None:
        self._sink.close()

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self._sink.close()


def _encode(message: types.JSONRPCMessage) -> bytes | None:
    """One line of JSON for the child, or None to send nothing.

    Error handling: raises MCPError(INVALID_PARAMS) for a request that cannot be encoded.
    """
    try:
        return _dump(message)
    except (ValueError, RecursionError) as exc:  # a lone surrogate, nesting too deep
        reason = first_line(exc)
    if isinstance(message, types.JSONRPCRequest):
        raise MCPError(code=types.INVALID_PARAMS, message=f"the request cannot be encoded as JSON ({reason})")
    log.warning("extension.message_repaired", kind=type(message).__name__, error=reason)
    try:
        plain = message.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode(errors="replace") + b"\n"
    except (ValueError, RecursionError):
        pass
    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):  # still answer the request
        error = types.ErrorData(code=types.INTERNAL_ERROR, message="the answer could not be encoded")
        return _dump(types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
    return None  # a notification nobody can encode: dropped


def _dump(message: types.JSONRPCMessage) -> bytes:
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
