"""Which lines are plain tool calls: a ``tools/call`` the fast path may serve, and a cancel. Pure.

A call is plain when it is well formed and asks nothing the gateway would have to understand
beyond its name and arguments: a handshake-era one has no ``_meta`` but a progress token
(:func:`parse`), a 2026-07-28 one declares its version and capabilities and passes the SDK's
checks for that version (:func:`parse_modern`). Anything else is left to the SDK's path, which
says what is wrong with it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import pydantic_core
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = ("MARK", "FastCall", "ModernCall", "RequestId", "cancelled_id", "is_id", "parse", "parse_modern")

RequestId = str | int

MARK = b'"tools/call"'  # in every line the fast path may take
_CANCELLED = b'"notifications/cancelled"'
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_PARAMS_KEYS = frozenset({"name", "arguments", "_meta"})
_MODERN_META_KEYS = frozenset(
    {types.PROTOCOL_VERSION_META_KEY, types.CLIENT_INFO_META_KEY, types.CLIENT_CAPABILITIES_META_KEY}
)


@dataclass(frozen=True, slots=True)
class FastCall:
    id: RequestId
    name: str  # as exposed
    arguments: dict[str, Any] | None
    progress_token: RequestId | None


def is_id(value: Any) -> bool:
    """Whether *value* may be a JSON-RPC request id here (a string or an integer, not a bool)."""
    return isinstance(value, str | int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class ModernCall:
    """A plain ``tools/call`` of a 2026-07-28 client: the call, and what its ``_meta`` declared."""

    call: FastCall
    version: str
    capabilities: dict[str, Any]


def parse(line: bytes) -> FastCall | None:
    """*line* as a plain handshake-era ``tools/call``, or None when the SDK's path must serve it. Pure."""
    parts = _plain_call(line)
    if parts is None:
        return None
    request_id, name, arguments, meta = parts
    token = None
    if meta is not None:
        if meta.keys() - {"progressToken"}:
            return None  # a 2026-07-28 request, or _meta we would have to understand
        token = meta.get("progressToken")
        if token is not None and not is_id(token):
            return None
    return FastCall(request_id, name, arguments, token)


def parse_modern(body: bytes) -> ModernCall | None:
    """*body* as a plain 2026-07-28 ``tools/call``: its ``_meta`` names a modern version and
    declares the client's capabilities (and maybe its info), nothing else (no progress token,
    no log level: those want a stream), and the request passes the SDK's validation for that
    version. None when the SDK's path must serve it (and say what is wrong). Pure."""
    parts = _plain_call(body)
    if parts is None or parts[3] is None or parts[3].keys() - _MODERN_META_KEYS:
        return None
    request_id, name, arguments, meta = parts
    version = meta.get(types.PROTOCOL_VERSION_META_KEY)
    capabilities = meta.get(types.CLIENT_CAPABILITIES_META_KEY)
    if version not in MODERN_PROTOCOL_VERSIONS or not isinstance(capabilities, dict):
        return None
    encoded = pydantic_core.to_json(meta)  # the verdict on a small one is kept (a big one's would hold it)
    valid = (_valid_meta if len(encoded) <= 4096 else _valid_meta.__wrapped__)(version, encoded)
    return ModernCall(FastCall(request_id, name, arguments, None), version, capabilities) if valid else None


@functools.lru_cache(maxsize=64)
def _valid_meta(version: str, meta: bytes) -> bool:
    """Whether a ``tools/call`` with this ``_meta`` (JSON) passes the SDK's checks for *version*:
    its name and arguments cannot fail them, and a client sends the same ``_meta`` every call."""
    params = {"name": "", "_meta": pydantic_core.from_json(meta)}
    try:
        methods.validate_client_request("tools/call", version, params)
    except (ValueError, KeyError):  # pydantic's ValidationError is a ValueError
        return False
    return True


def _plain_call(line: bytes) -> tuple[RequestId, str, dict[str, Any] | None, dict[str, Any] | None] | None:
    """(id, name, arguments, _meta) of a well-formed ``tools/call`` with nothing more, or None. Pure."""
    if MARK not in line:
        return None
    try:
        message = pydantic_core.from_json(line, allow_inf_nan=False)
    except ValueError:
        return None  # the SDK's path says what is wrong with it
    if (
        not isinstance(message, dict)
        or message.keys() - _REQUEST_KEYS
        or message.get("jsonrpc") != "2.0"
        or message.get("method") != "tools/call"
        or not is_id(request_id := message.get("id"))
        or not isinstance(params := message.get("params"), dict)
        or params.keys() - _PARAMS_KEYS
        or not isinstance(name := params.get("name"), str)
        or not isinstance(arguments := params.get("arguments"), dict | None)
        or not isinstance(meta := params.get("_meta"), dict | None)
    ):
        return None
    return request_id, name, arguments, meta


def cancelled_id(line: bytes) -> RequestId | None:
    """The request a ``notifications/cancelled`` line cancels, if *line* is one. Pure."""
    if _CANCELLED not in line:
        return None
    try:
        message = pydantic_core.from_json(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "notifications/cancelled":
        return None
    params = message.get("params")
    request_id = params.get("requestId") if isinstance(params, dict) else None
    return request_id if is_id(request_id) else None
