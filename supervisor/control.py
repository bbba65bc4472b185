"""The control socket: JSON-RPC 2.0 over a unix socket, one JSON object per line.

Resource handling: :func:`serve` owns the listener, the socket file and a task group with one
task per connection; that task reads, handles and writes its requests one after another, so a
slow or hostile client only ever blocks itself. Error handling: whatever a client sends and
whatever a handler raises becomes a JSON-RPC error for that one client, never reaching the group.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream
from pydantic import ValidationError

from supervisor import sockets
from supervisor.errors import CallFailed, ConfigError, ExtensionUnavailable, SupervisorError, UnknownExtension
from supervisor.methods import METHODS, Backend, Method
from supervisor.protocol import (
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

if TYPE_CHECKING:
    pass

__all__ = (
    "CALL_FAILED",
    "CONFIG_INVALID",
    "EXTENSION_UNAVAILABLE",
    "IDLE_TIMEOUT",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_CONNECTIONS",
    "MAX_FRAME",
    "METHODS",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SUPERVISOR_ERROR",
    "UNKNOWN_EXTENSION",
    "Backend",
    "Method",
    "serve",
)

log = structlog.get_logger(__name__)

_TOO_LARGE = "request too large (over 1 MiB)"

MAX_FRAME = 1 << 20  # bytes in one request line, newline excluded
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 300.0  # seconds a connection may make no progress (no request, or a reply not read)


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
    return f"invalid params for {method!r}: " + "; ".join(problems)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"


def _encode_error(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _encode({"jsonrpc": "2.0", "id": request_id, "error": error})


async def _dispatch(backend: Backend, request: _Request) -> bytes:
    """Run one request and return its encoded reply; every failure is an :class:`_RpcError`."""
    method = METHODS.get(request.method)
    if method is None:
        raise _RpcError(METHOD_NOT_FOUND, f"unknown method {request.method!r}")
    if not isinstance(request.params, dict):
        raise _RpcError(INVALID_PARAMS, "params must be a JSON object")
    try:
        params = method.params.model_validate(request.params)
    except ValidationError as exc:
        raise _RpcError(INVALID_PARAMS, _describe_invalid_params(request.method, exc)) from None
    try:
        result = await method.handler(backend, params)
        return _encode({"jsonrpc": "2.0", "id": request.id, "result": result})
    except SupervisorError as exc:
        raise _application_error(exc) from None
    except Exception as exc:
        log.exception("control.handler_crashed", method=request.method)
        raise _RpcError(INTERNAL_ERROR, f"internal error: {_one_line(exc)}") from None


class _FrameTooLarge(Exception):
    pass


class _Server:
    """The accept loop and the per-connection conversation; one instance per serve() call."""

    def __init__(self, backend: Backend, *, max_connections: int, idle_timeout: float) -> None:
        self._backend = backend
        self._max_connections = max_connections
        self._idle_timeout = idle_timeout
        self._allowed_uids = frozenset({os.geteuid(), 0})
        self._active = 0

    async def run(self, listener: anyio.abc.SocketListener, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as connections:
            task_status.started()
            while True:
                try:
                    stream = await sockets.accept(listener)
                except anyio.BrokenResourceError as exc:
                    cause = exc.__cause__
                    if not (isinstance(cause, OSError) and cause.errno in sockets.TRANSIENT_ACCEPT_ERRORS):
                        raise
                    log.warning("control.accept_failed", error=str(cause))
                    await anyio.sleep(sockets.ACCEPT_RETRY_DELAY)
                    continue
                if stream is None:
                    continue
                if self._active >= self._max_connections:
                    log.warning("control.too_many_connections", limit=self._max_connections)
                    await self._refuse(stream, "too many connections")
                    continue
                self._active += 1
                connections.start_soon(self._connection, stream)

    async def _refuse(self, stream: anyio.abc.SocketStream, message: str) -> None:
        """Tell a fresh client why it is turned away; a small reply never fills a new socket."""
        with (
            anyio.move_on_after(1),
            contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError),
        ):
            await stream.send(_encode_error(None, SUPERVISOR_ERROR, message))
        await stream.aclose()

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        try:
            async with stream:
                await self._converse(stream)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            log.debug("control.client_gone")
        except Exception:
            log.exception("control.connection_crashed")
        finally:
            self._active -= 1

    async def _converse(self, stream: anyio.abc.SocketStream) -> None:
        pid, uid = sockets.peer_credentials(stream)
        if uid not in self._allowed_uids:
            log.warning("control.peer_refused", uid=uid, pid=pid)
            message = f"permission denied: uid {uid} may not use this socket"
            await self._send(stream, _encode_error(None, SUPERVISOR_ERROR, message))
            return
        reader = BufferedByteReceiveStream(stream)
        while True:
            try:
                line = await self._receive_line(reader)
            except _FrameTooLarge:
                log.warning("control.frame_too_large", limit=MAX_FRAME, pid=pid)
                await self._send(stream, _encode_error(None, INVALID_REQUEST, _TOO_LARGE))
                return
            if line is None:
                return
            if not line.strip():
                continue
            reply = await self._handle(line)
            if reply is not None and not await self._send(stream, reply):
                return

    async def _receive_line(self, reader: BufferedByteReceiveStream) -> bytes | None:
        """The next request line; None when the client has gone or stayed idle too long."""
        with anyio.move_on_after(self._idle_timeout):
            try:
                line = await reader.receive_until(b"\n", MAX_FRAME)
            except anyio.DelimiterNotFound:
                raise _FrameTooLarge from None
            except anyio.IncompleteRead:
                return None
            if len(line) > MAX_FRAME:  # a long line can arrive whole in one read
                raise _FrameTooLarge
            return line
        log.debug("control.connection_idle", timeout=self._idle_timeout)
        return None

    async def _send(self, stream: anyio.abc.SocketStream, payload: bytes) -> bool:
        """Write one reply; False if the client did not read it within the idle timeout."""
        with anyio.move_on_after(self._idle_timeout):
            await stream.send(payload)
            return True
        log.warning("control.client_not_reading", timeout=self._idle_timeout)
        return False

    async def _handle(self, line: bytes) -> bytes | None:
        """The encoded reply to one request line, or None for a notification."""
        started = time.perf_counter()
        try:
            request = _parse_request(line)
        except _RpcError as exc:
            log.warning("control.bad_request", code=exc.code, error=exc.message)
            return _encode_error(exc.request_id, exc.code, exc.message, exc.data)
        try:
            reply: bytes | None = await _dispatch(self._backend, request)
        except _RpcError as exc:
            log.warning("control.request_failed", method=request.method, code=exc.code, error=exc.message)
            reply = _encode_error(request.id, exc.code, exc.message, exc.data)
        duration_ms = round((time.perf_counter() - started) * 1000, 2)
        log.debug("control.request", method=request.method, duration_ms=duration_ms)
        return None if request.notification else reply


async def serve(
    backend: Backend,
    path: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    idle_timeout: float = IDLE_TIMEOUT,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control protocol on the unix socket *path* until cancelled.

    Args:
        backend: the daemon the methods act on.
        path: the socket file; its directory is created 0700 if missing, the socket is 0600.
        max_connections: clients served at once; one more is told "too many connections".
        idle_timeout: a connection that makes no progress for this many seconds is closed.
        task_status: ``started()`` once the socket accepts connections.

    Raises:
        SupervisorError: another daemon is listening on *path*, or it cannot be bound.

    Resource handling: the socket file is removed on exit unless another process replaced it.
    """
    listener = await sockets.listen(path)
    identity = sockets.identity(path)
    server = _Server(backend, max_connections=max_connections, idle_timeout=idle_timeout)
    log.info("control.listening", path=path)
    try:
        async with listener:
            await server.run(listener, task_status)
    finally:
        sockets.unlink_if_ours(path, identity)
        log.info("control.closed", path=path)
