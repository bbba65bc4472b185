"""The lines a stdio connection writes of its own: errors for what it cannot take, the last word.

They answer no request the SDK serves (:data:`OURS`), or end the connection (:data:`LAST`).
"""

from __future__ import annotations

import json

import mcp_types as types
from mcp.shared.message import ServerMessageMetadata, SessionMessage

__all__ = ("LAST", "OURS", "error_reply", "invalid_reply")

LAST = ServerMessageMetadata()  # an error after which the connection ends
OURS = ServerMessageMetadata()  # marks the errors of ours: they answer no request of the SDK's


def error_reply(request_id: str | int | None, code: int, message: str) -> SessionMessage:
    """An error of ours, for request *request_id* (None: for no request)."""
    reply = types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message)
    )
    return SessionMessage(reply, metadata=OURS)


def invalid_reply(line: bytes) -> SessionMessage:
    """-32700 for a line that is not JSON, -32600 (with its id, if any) for one that is not JSON-RPC."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return error_reply(None, types.PARSE_ERROR, "Parse error: the line is not JSON")
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    return error_reply(request_id, types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message")
