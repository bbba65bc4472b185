"""What every upstream's session shares on the wire: the ids a task sends, the requests we
stopped waiting for, the server's requests we answer at once, and the check that a request
can be sent at all.

:data:`SENDING` tells whoever asks the id of each request the current task sends;
:class:`Watched` hears of late answers and progress for requests we stopped waiting for;
:func:`check_encodable` refuses, before anything is sent, what strict JSON cannot carry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import mcp_types as types
import structlog
from mcp import MCPError
from mcp.shared.message import SessionMessage

from supervisor.errors import first_line

__all__ = ("SENDING", "InboundRequests", "Watched", "check_encodable")

log = structlog.get_logger(__name__)

# Told the id of each request the current task sends to an upstream (the session's or a raw one).
SENDING: ContextVar[Callable[[types.RequestId], None] | None] = ContextVar(
    "mcp_supervisor_sending", default=None
)


class Watched:
    """Ids of our requests upstream whose late answer or progress someone wants to hear of.

    The stdout pump shows it every message (:meth:`see`) while it watches any; each watcher is
    told ``True`` when the child answers its request, ``False`` for each progress of it. Sync;
    its owner (:mod:`supervisor.extension.asking`) bounds how many ids it watches.
    """

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: dict[types.RequestId, Callable[[bool], None]] = {}

    def see(self, message: Any) -> None:
        """A message from the child: parsed JSON (a dict) or a ``SessionMessage``."""
        inner = getattr(message, "message", None)
        if inner is not None:
            if isinstance(inner, types.JSONRPCResponse | types.JSONRPCError):
                self._tell(inner.id, True)
            elif isinstance(inner, types.JSONRPCNotification) and inner.method == "notifications/progress":
                self._tell((inner.params or {}).get("progressToken"), False)
        elif isinstance(message, dict):
            if "method" not in message:
                self._tell(message.get("id"), True)
            elif message.get("method") == "notifications/progress":
                params = message.get("params")
                self._tell(params.get("progressToken") if isinstance(params, dict) else None, False)

    def _tell(self, request_id: Any, answered: bool) -> None:
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            watcher = self.ids.get(request_id)
            if watcher is not None:
                watcher(answered)


class InboundRequests:
    """The server's requests (a child's, a remote's) the session is still answering: at most
    *limit* at once.

    The session answers each in a task of its own, and a server that floods requests (pings),
    while not reading our answers or asking what a client takes minutes to answer, would
    otherwise grow the daemon by one task per request. Dropped requests get no answer (a
    child's: answering needs the stdin the flood is clogging).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dropped = 0
        self._ids: set[types.RequestId] = set()

    def admit(self, message: SessionMessage | Exception) -> bool:
        inner = message.message if isinstance(message, SessionMessage) else None
        if isinstance(inner, types.JSONRPCRequest):
            if inner.id in self._ids or len(self._ids) >= self.limit:  # a repeated id is refused too
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("extension.requests_dropped", dropped=self.dropped, limit=self.limit)
                return False
            self._ids.add(inner.id)
        elif isinstance(inner, types.JSONRPCNotification) and inner.method == "notifications/cancelled":
            request_id = (inner.params or {}).get("requestId")
            if isinstance(request_id, str | int):
                self.settle(request_id)  # its handler is cancelled and writes nothing
        return True

    def settle(self, request_id: types.RequestId) -> None:
        self._ids.discard(request_id)


def check_encodable(value: Any) -> None:
    """Raise ``MCPError(INVALID_PARAMS)`` unless *value* can be sent as strict JSON in UTF-8.

    Refused: lone surrogates, NaN and infinities (``NaN`` is not JSON, though a lenient
    encoder writes it), nesting deeper than Python's recursion limit.
    """
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode()
    except (ValueError, TypeError, RecursionError) as exc:
        reason = first_line(exc)
        raise MCPError(
            code=types.INVALID_PARAMS, message=f"the request cannot be encoded as JSON ({reason})"
        ) from None
