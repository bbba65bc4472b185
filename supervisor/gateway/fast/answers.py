"""The answer line to a plain call, whichever front-end took it: its result with its links
rewritten, or its failure as the SDK's path answers it. Pure.

A 2026-07-28 client's result goes through its version's *shape*; over HTTP such an answer's
error takes the status the SDK gives its code (:func:`modern_status`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mcp_types as types
import pydantic_core
import structlog
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

from supervisor.errors import CallFailed, ExtensionUnavailable
from supervisor.gateway.fast.parse import RequestId
from supervisor.gateway.links import expose_json
from supervisor.gateway.toolerrors import is_tool_error, raw_tool_error
from supervisor.upstream.raw import encode

__all__ = ("Outcome", "Shape", "answer_line", "internal_error", "modern_status")

log = structlog.get_logger(__name__)

Shape = Callable[[dict[str, Any]], dict[str, Any]]  # a result as the client's era has it
Outcome = dict[str, Any] | ExtensionUnavailable | CallFailed  # what a call to an extension ends with


def answer_line(
    request_id: RequestId,
    extension: str,
    outcome: Outcome,
    spool_prefix: str,
    shape: Shape | None = None,
) -> bytes:
    """The answer to request *request_id*: the result of a call to *extension*, its links
    rewritten, or its failure as the SDK's path answers it. A result goes through *shape*
    (a 2026-07-28 client's); one it refuses (``ValueError``) is an internal error, as the
    SDK answers a result its schema refuses."""
    if isinstance(outcome, ExtensionUnavailable | CallFailed):
        if not is_tool_error(outcome):
            return _error(request_id, outcome.code, str(outcome), outcome.data)
        outcome = raw_tool_error(str(outcome))
    else:
        content = outcome.get("content")
        if isinstance(content, list):
            outcome["content"] = expose_json(extension, content, spool_prefix)
    if shape is not None:
        try:
            outcome = shape(outcome)
        except ValueError:
            log.warning("gateway.invalid_result", extension=extension)
            return _error(request_id, types.INTERNAL_ERROR, "Handler returned an invalid result")
    return _response(request_id, outcome)


def internal_error(request_id: RequestId) -> bytes:
    """The answer to a call that a bug of ours failed."""
    return _error(request_id, types.INTERNAL_ERROR, "internal error in mcp-supervisor")


def modern_status(answer: bytes, request_id: RequestId) -> int:
    """The HTTP status the SDK's modern path gives *answer*: an error's, by its code."""
    if not answer.startswith(b'{"jsonrpc":"2.0","id":' + encode(request_id).rstrip() + b',"error":'):
        return 200
    code = pydantic_core.from_json(answer)["error"]["code"]
    return ERROR_CODE_HTTP_STATUS.get(code, 200)


def _response(request_id: RequestId, result: dict[str, Any]) -> bytes:
    response = {"jsonrpc": "2.0", "id": request_id, "result": result}
    try:
        return encode(response)
    except ValueError:  # NaN or an infinity from the child: null, as the SDK's path writes them
        return encode(_finite(response))


def _finite(value: Any) -> Any:
    """*value* with NaN and infinities as None. Deep as the parser let the value be (~200)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _error(request_id: RequestId, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    try:
        return encode({"jsonrpc": "2.0", "id": request_id, "error": error})
    except (ValueError, RecursionError):
        return encode({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
