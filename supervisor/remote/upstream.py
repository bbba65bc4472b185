"""A remote MCP server as an :class:`~supervisor.extension.upstream.Upstream`: one run's client
session over streamable HTTP or HTTP+SSE, opened by :func:`supervisor.remote.connection.connect`.

What a run is beside the session: its URL, the transport it speaks now, the last ping's round
trip, whether it waits for a login, why it ended; ``type: auto``'s fallback within the
handshake; plain-JSON calls over streamable HTTP (:mod:`supervisor.remote.rawcalls`) once the
handshake is done. An end fails every request in flight with ``CONNECTION_CLOSED``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import structlog
from mcp import MCPError
from mcp.shared.dispatcher import ProgressFnT
from pydantic import TypeAdapter

from supervisor.errors import first_line
from supervisor.remote.rawcalls import RemoteCalls
from supervisor.upstream.listing import Listing
from supervisor.upstream.session import SessionUpstream
from supervisor.upstream.wire import check_encodable

__all__ = ("RemoteConnection",)

log = structlog.get_logger(__name__)

_ANY_RESULT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])
_NOT_STREAMABLE = (types.METHOD_NOT_FOUND, types.INTERNAL_ERROR, types.INVALID_REQUEST)  # 404, 405, 400


class RemoteConnection(SessionUpstream):
    """One run's session with a remote server: its URL, the transport it speaks, why it ended.

    Over streamable HTTP it has :attr:`raw` calls once its handshake is done
    (:mod:`supervisor.remote.rawcalls`: the gateway's plain tool calls, beside the session).
    """

    raw: RemoteCalls | None = None

    def __init__(self, url: str, transport: str) -> None:
        super().__init__()
        self.url = url
        self.transport = transport  # "http" or "sse": what it speaks now
        self._run = secrets.token_hex(8)
        self.round_trip: float | None = None  # seconds, of the last ping
        self._closers: list[Callable[[], None]] = []  # the current session's read stream
        self._fallback: Callable[[], Awaitable[None]] | None = None  # to the next transport (auto)
        self._raw_calls: Callable[[], RemoteCalls | None] | None = None  # the open transport's, if any
        self.needs_login: str | None = None  # why the server wants a person to log in, if it does

    def login_required(self, why: str) -> None:
        """The server refused the run's credentials (or has none): the run ends, waiting for a login."""
        self.needs_login = why
        self.end(why)

    @property
    def run(self) -> str:
        return self._run

    async def ping(self) -> None:
        """One ping; its round trip is kept (``status`` shows it). Errors as the session's."""
        started = time.monotonic()
        await super().ping()
        self.round_trip = time.monotonic() - started

    def described(self) -> dict[str, Any]:
        """What ``status`` shows of the connection: transport, protocol, last ping's round trip."""
        rtt = None if self.round_trip is None else round(self.round_trip * 1000, 1)
        return {"transport": self.transport, "protocol": self.protocol, "rtt_ms": rtt}

    def end(self, failure: str | None = None) -> None:
        if not self.ended.is_set():
            super().end(failure)
            if self.raw is not None:
                self.raw.close()
            for close in self._closers:  # requests in flight fail with CONNECTION_CLOSED now
                close()

    async def handshake(self, on_step: Callable[[str], None] | None = None) -> Listing:
        """As :meth:`SessionUpstream.handshake`; with ``type: auto``, over HTTP+SSE when the
        server refuses streamable HTTP's ``initialize``."""
        fallback: Callable[[], Awaitable[None]] | None = None
        try:
            listing = await super().handshake(on_step)
        except MCPError as exc:
            fallback, self._fallback = self._fallback, None
            if fallback is None or exc.error.code not in _NOT_STREAMABLE or self.ready:
                raise
            log.info("extension.transport_fallback", refused=first_line(exc, typed=False))
        if fallback is not None:
            await fallback()
            if self.ended.is_set():
                raise MCPError(code=types.CONNECTION_CLOSED, message=self.failure or "the connection ended")
            listing = await super().handshake(on_step)
        if self._raw_calls is not None and not self.ended.is_set():
            self.raw = self._raw_calls()
        return listing

    async def call_tool_raw(
        self, name: str, arguments: dict[str, Any] | None, *, progress: ProgressFnT
    ) -> dict[str, Any]:
        """One tool call as plain JSON: the server's result object, checked for shape only.

        Error handling: as :meth:`call_tool`; ``ValueError`` for an answer that is no tool result.
        """
        params = {"name": name} if arguments is None else {"name": name, "arguments": arguments}
        result = await self.request_raw("tools/call", params, progress=progress)
        if not isinstance(result.get("content", []), list):
            raise ValueError("not a tool result")
        return result

    async def request_raw(
        self, method: str, params: dict[str, Any], *, progress: ProgressFnT
    ) -> dict[str, Any]:
        """Any request as plain JSON; its result object, unvalidated. Errors as :meth:`call_tool`."""
        check_encodable(params)
        request = types.Request[dict[str, Any], str](method=method, params=params)
        return await self._session.send_request(request, _ANY_RESULT, progress_callback=progress)
