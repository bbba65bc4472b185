"""How a failed tool call answers its client, on every path (SDK, fast path, task calls). Pure."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from supervisor.errors import CallFailed, ExtensionUnavailable, LoginNeeded

__all__ = ("is_tool_error", "raw_tool_error")

# Ours, and a model can act on them (retry, start the extension): a tool result with isError.
# The child's own JSON-RPC errors pass through as such, whatever their code.
_AS_TOOL_ERROR = (None, types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT)


def is_tool_error(exc: ExtensionUnavailable | CallFailed) -> bool:
    """Whether *exc* answers as a tool error (``isError``) rather than a JSON-RPC error (a login
    the client is asked to open is the protocol's own error)."""
    if isinstance(exc, LoginNeeded):
        return False
    return isinstance(exc, ExtensionUnavailable) or (not exc.from_child and exc.code in _AS_TOOL_ERROR)


def raw_tool_error(text: str) -> dict[str, Any]:
    """A ``CallToolResult`` with ``isError``, as plain JSON."""
    return {"content": [{"type": "text", "text": text}], "isError": True}
