"""One request line in, one reply line out: JSON-RPC 2.0 framing of the control methods.

Pure of I/O: :func:`handle` parses a line, runs it on the :data:`~supervisor.control.methods.METHODS`
table and encodes the reply. Error handling: whatever the line holds and whatever a handler
raises becomes a JSON-RPC error reply for that one request; nothing escapes but cancellation.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from supervisor.control.codes import (
    CALL_FAILED,
    CONFIG_INVALID,
    EXTENSION_UNAVAILABLE,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SUPERVISOR_ERROR,
    UNKNOWN_EXTENSION,
)
from supervisor.control.methods import METHODS, Backend, Notify
from supervisor.errors import (
    CallFailed,
    ConfigError,
    ExtensionUnavailable,
    SupervisorError,
    UnknownExtension,
    first_line,
)

__all__ = ("encode_error", "encode_notification", "handle")

log = structlog.get_logger("supervisor.control.server")  # the control socket's events, whoever frames them


class _RpcError(Exception):
    """A JSON-RPC error to send back; ``request_id`` is None when the id could not be read."""

    def __init__(self, code: int, message: str, data: Any = None, *, request_id: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data, self.request_id = code, message, data, request_id


@dataclass(frozen=True, slots=True)
class _Request:
    id: Any
    method: str
    params: Any
    notification: bool


def _parse_request(line: bytes) -> _Request:
    """Decode one line into a request, or raise the error to reply with."""
    try:
        message = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise _RpcError(PARSE_ERROR, "parse error: the request is not valid UTF-8") from None
    except RecursionError:
        raise _RpcError(PARSE_ERROR, "parse error: the request is nested too deeply") from None
    except ValueError as exc:
        raise _RpcError(PARSE_ERROR, f"parse error: {exc}") from None
    if isinstance(message, list):
        raise _RpcError(INVALID_REQUEST, "batch requests are not supported")
    if not isinstance(message, dict):
        raise _RpcError(INVALID_REQUEST, "a request must be a JSON object")
    request_id = message.get("id")
    if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, int | str)):
        raise _RpcError(INVALID_REQUEST, "the id must be a string, an integer or null")
    if message.get("jsonrpc") != "2.0":
        raise _RpcError(INVALID_REQUEST, 'jsonrpc must be "2.0"', request_id=request_id)
    method = message.get("method")
    if not isinstance(method, str):
        raise _RpcError(INVALID_REQUEST, "method must be a string", request_id=request_id)
    return _Request(request_id, method, message.get("params", {}), notification="id" not in message)


def _application_error(exc: SupervisorError) -> _RpcError:
    if isinstance(exc, UnknownExtension):
        return _RpcError(UNKNOWN_EXTENSION, str(exc))
    if isinstance(exc, ExtensionUnavailable):
        return _RpcError(EXTENSION_UNAVAILABLE, str(exc), {"state": exc.state, "retryable": exc.retryable})
    if isinstance(exc, CallFailed):
        return _RpcError(CALL_FAILED, str(exc), {"code": exc.code} if exc.code is not None else None)
    if isinstance(exc, ConfigError):
        return _RpcError(
            CONFIG_INVALID, "the config is not valid; nothing was changed", {"errors": list(exc.errors)}
        )
    return _RpcError(SUPERVISOR_ERROR, str(exc))


_PARAM_PROBLEMS = {"extra_forbidden": "unexpected parameter", "missing": "required parameter is missing"}


def _describe_invalid_params(method: str, exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        what = _PARAM_PROBLEMS.get(error["type"]) or error["msg"][:1].lower() + error["msg"][1:]
        problems.append(f"{'.'.join(str(part) for part in error['loc'])}: {what}")
    return _shorten(f"invalid params for {method!r}: " + "; ".join(problems), 1000)


def _shorten(text: str, limit: int = 100) -> str:
    """*text* cut to *limit* characters: a client's 1 MiB method name must not fill replies and logs."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"


def encode_error(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    """One JSON-RPC error reply line."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _encode({"jsonrpc": "2.0", "id": request_id, "error": error})


def encode_notification(method: str, params: dict[str, Any]) -> bytes:
    """One JSON-RPC notification line (no id): sent before the reply it belongs to."""
    return _encode({"jsonrpc": "2.0", "method": method, "params": params})


async def _ignore(method: str, params: dict[str, Any]) -> None:
    pass


async def _dispatch(backend: Backend, request: _Request, notify: Notify) -> bytes:
    """Run one request and return its encoded reply; every failure is an :class:`_RpcError`."""
    method = METHODS.get(request.method)
    if method is None:
        raise _RpcError(METHOD_NOT_FOUND, f"unknown method {_shorten(request.method)!r}")
    if not isinstance(request.params, dict):
        raise _RpcError(INVALID_PARAMS, "params must be a JSON object")
    try:
        params = method.params.model_validate(request.params)
    except ValidationError as exc:
        raise _RpcError(INVALID_PARAMS, _describe_invalid_params(request.method, exc)) from None
    try:
        if method.streams:
            result = await method.handler(backend, params, notify)
        else:
            result = await method.handler(backend, params)
        return _encode({"jsonrpc": "2.0", "id": request.id, "result": result})
    except SupervisorError as exc:
        raise _application_error(exc) from None
    except Exception as exc:
        log.exception("control.handler_crashed", method=_shorten(request.method))
        raise _RpcError(INTERNAL_ERROR, f"internal error: {first_line(exc)}") from None


async def handle(backend: Backend, line: bytes, notify: Notify = _ignore) -> bytes | None:
    """The encoded reply to one request *line* (newline excluded), or None for a notification.

    *notify* sends a notification to the requesting client before the reply (``call`` with
    ``progress``); by default they are dropped.
    """
    started = time.perf_counter()
    try:
        request = _parse_request(line)
    except _RpcError as exc:
        log.warning("control.bad_request", code=exc.code, error=exc.message)
        return encode_error(exc.request_id, exc.code, exc.message, exc.data)
    try:
        reply: bytes | None = await _dispatch(backend, request, notify)
    except _RpcError as exc:
        method = _shorten(request.method)
        log.warning("control.request_failed", method=method, code=exc.code, error=exc.message)
        reply = encode_error(request.id, exc.code, exc.message, exc.data)
    duration_ms = round((time.perf_counter() - started) * 1000, 2)
    log.debug("control.request", method=_shorten(request.method), duration_ms=duration_ms)
    return None if request.notification else reply
