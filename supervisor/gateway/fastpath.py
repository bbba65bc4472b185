"""The fast path: a plain ``tools/call`` from a handshake-era client, served without the SDK.

Most of what a gateway does is pass tool calls through. On ``mcp.sock`` such a call is
recognised from its line, resolved by name, sent to the child as plain JSON
(:mod:`supervisor.child.rawcalls`) and answered with the child's result, its links rewritten as
:mod:`.links` rewrites them; the SDK never builds a model of it. Everything else
(another method, a ``_meta`` beyond a progress token, an unknown or hidden tool, a client not
yet past its handshake) takes the SDK's path, which is the reference for behaviour: the same
waits, timeouts, errors, cancellation and bookkeeping (:meth:`Extension.call_tool_raw`).

What differs, by design: the child's result is not validated against the tool's
``outputSchema`` in the daemon (the client checks it), and extra members pass through.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp_types as types
import pydantic_core
import structlog
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from supervisor.child.rawcalls import encode
from supervisor.errors import CallFailed, ExtensionUnavailable
from supervisor.gateway.asks.callers import FastCaller
from supervisor.gateway.links import expose_json
from supervisor.gateway.progress import LatestProgress
from supervisor.gateway.toolerrors import is_tool_error, raw_tool_error

if TYPE_CHECKING:
    from supervisor.extension.asking import Caller
    from supervisor.extension.calls import InlineCall
    from supervisor.extension.served import Served
    from supervisor.gateway.router import Router
    from supervisor.gateway.session import Session

__all__ = (
    "MARK",
    "FastCall",
    "FastCalls",
    "ModernCall",
    "RequestId",
    "Shape",
    "answer_call",
    "answer_line",
    "cancelled_id",
    "internal_error",
    "is_id",
    "parse",
    "parse_modern",
)

log = structlog.get_logger(__name__)

RequestId = str | int
Send = Callable[[bytes], Awaitable[bool]]  # a line for the client, whole; whether it went
Done = Callable[[bool], None]  # a fast call is settled: whether its client has its answer (or gave up)

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


class FastCalls:
    """The fast calls of one client (*session*): routed by *router*, spool links as
    *spool_prefix* begins them, answered through *send*.

    With *send_now* (a sender that never waits: it sends a line at once or in a task, then
    calls its second argument), a call without a progress token is served inline, by callbacks
    (:meth:`Extension.call_tool_inline`), when its extension runs; any other one in a task of
    the connection's task group. A call's *done* runs once its answer is out.
    """

    def __init__(
        self,
        router: Router,
        spool_prefix: str,
        send: Send,
        session: Session,
        send_now: Callable[[bytes, Callable[[bool], None]], None] | None = None,
    ) -> None:
        self._router = router
        self._spool_prefix = spool_prefix
        self._send = send
        self._send_now = send_now
        self._session = session
        self._caller = FastCaller(session)
        self._running: dict[RequestId, set[anyio.CancelScope]] = {}
        self._inline: dict[RequestId, dict[InlineCall, Done]] = {}  # and their done()

    def route(self, call: FastCall, request: Any = None) -> tuple[Served, str] | None:
        """The extension and original tool name for *call* in the client's view (its requests'
        context, *request*), if the fast path can serve it."""
        return self._router.route_tool(call.name, request, self._session)

    def cancel(self, request_id: RequestId) -> None:
        for scope in self._running.get(request_id, ()):
            scope.cancel()
        for inline in list(self._inline.get(request_id, ())):
            self._cancel_inline(request_id, inline, answered=True)  # the client gave it up

    def close(self) -> None:
        """The client is gone: its inline calls are cancelled (its tasks end with its task group)."""
        for request_id, calls in list(self._inline.items()):
            for inline in list(calls):
                self._cancel_inline(request_id, inline, answered=False)

    def start(
        self,
        tg: anyio.abc.TaskGroup,
        call: FastCall,
        ext: Served,
        tool: str,
        done: Done,
    ) -> None:
        """Answer *call*, then call *done*: with True once the answer is out or the client
        cancelled the call (a cancelled request gets no answer), with False when the connection
        ended first. Cancellable from now on."""
        inline = self._send_now is not None and call.progress_token is None
        if inline and self._start_inline(call, ext, tool, done):
            return
        scope = anyio.CancelScope()
        self._running.setdefault(call.id, set()).add(scope)
        tg.start_soon(self._serve, call, ext, tool, scope, done)

    def _start_inline(self, call: FastCall, ext: Served, tool: str, done: Done) -> bool:
        send_now = self._send_now
        assert send_now is not None
        inline: InlineCall | None = None

        def answered(outcome: dict[str, Any] | CallFailed) -> None:
            assert inline is not None  # the child cannot answer before it is sent
            try:
                line = answer_line(call.id, ext.name, outcome, self._spool_prefix)
            except Exception:  # a bug of ours: this call fails, the connection goes on
                log.exception("gateway.fast_call_crashed", extension=ext.name, tool=tool)
                line = internal_error(call.id)
            send_now(line, functools.partial(self._settled, call.id, inline))

        inline = ext.call_tool_inline(tool, call.arguments, answered, caller=self._caller)
        if inline is None:
            return False
        self._inline.setdefault(call.id, {})[inline] = done
        return True

    def _cancel_inline(self, request_id: RequestId, inline: InlineCall, *, answered: bool) -> None:
        inline.cancel()
        self._settled(request_id, inline, answered)

    def _settled(self, request_id: RequestId, inline: InlineCall, answered: bool) -> None:
        calls = self._inline.get(request_id, {})
        done = calls.pop(inline, None)
        if not calls:
            self._inline.pop(request_id, None)
        if done is not None:
            done(answered)

    async def _serve(
        self,
        call: FastCall,
        ext: Served,
        tool: str,
        scope: anyio.CancelScope,
        done: Done,
    ) -> None:
        answer: bytes | None = None
        try:
            with scope:
                answer = await answer_call(call, ext, tool, self._session, self._spool_prefix, self._send)
        finally:
            scopes = self._running[call.id]
            scopes.discard(scope)
            if not scopes:
                del self._running[call.id]
        if answer is None or await self._send(answer):  # None: the client cancelled it
            done(True)  # else the connection is ending, and done() is not for it


Shape = Callable[[dict[str, Any]], dict[str, Any]]  # a result as the client's era has it


async def answer_call(
    call: FastCall,
    ext: Served,
    tool: str,
    session: Session,
    spool_prefix: str,
    send: Send | None = None,
    *,
    caller: Caller | None = None,
    shape: Shape | None = None,
) -> bytes:
    """The answer line to *call* (tool *tool* of *ext*, for *session*): its result, its links
    rewritten, or its error as the SDK's path answers it. Progress goes through *send*, when the
    listener has a channel for it. The child's questions go to *caller* (by default the
    session's SDK connection). Never raises but for cancellation: a bug of ours fails this
    call only. *shape*: see :func:`answer_line`.
    """
    relay = _progress_relay(call.progress_token, send) if call.progress_token is not None and send else None
    try:
        result = await ext.call_tool_raw(
            tool, call.arguments, progress=relay, caller=caller or FastCaller(session)
        )
    except (ExtensionUnavailable, CallFailed) as exc:
        return answer_line(call.id, ext.name, exc, spool_prefix, shape)
    except Exception:  # a bug of ours: this call fails, the connection goes on
        log.exception("gateway.fast_call_crashed", extension=ext.name, tool=tool)
        return internal_error(call.id)
    return answer_line(call.id, ext.name, result, spool_prefix, shape)


def answer_line(
    request_id: RequestId,
    extension: str,
    outcome: dict[str, Any] | ExtensionUnavailable | CallFailed,
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


def _progress_relay(token: RequestId, send: Send) -> LatestProgress:
    """Progress to the client under its own token, as the SDK path relays it."""

    async def notify(progress: float, total: float | None, message: str | None) -> None:
        given = {"progressToken": token, "progress": progress, "total": total, "message": message}
        params = {key: value for key, value in given.items() if value is not None}
        await send(encode({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}))

    return LatestProgress(notify)


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


def internal_error(request_id: RequestId) -> bytes:  # the answer to a call that a bug of ours failed
    return _error(request_id, types.INTERNAL_ERROR, "internal error in mcp-supervisor")


def _error(request_id: RequestId, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    try:
        return encode({"jsonrpc": "2.0", "id": request_id, "error": error})
    except (ValueError, RecursionError):
        return encode({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
