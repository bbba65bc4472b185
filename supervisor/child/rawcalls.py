"""Tool calls to a child as plain JSON, beside its SDK session: the gateway's fast path.

The SDK's ``ClientSession`` costs about a millisecond of CPU per call on each side of the
daemon (models built, validated and dumped twice, a task and streams per request). A call that
only passes through needs none of that: :class:`RawCalls` writes the request line itself and
takes the answer line back as parsed JSON, before the session sees it.

Its request ids (``mcpsv-N``, strings) never clash with the session's (integers), and they double
as progress tokens, so the stdout pump can route a line to its waiter by one substring test and
one parse. Everything else the child sends goes to the session as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectSendStream
from mcp import MCPError

from supervisor.upstream.wire import SENDING

__all__ = ("MARK", "RawCalls", "Waiter", "call_params", "encode", "result", "tool_result")

PREFIX = "mcpsv-"
MARK = b'"' + PREFIX.encode()  # in every line that answers a raw call or reports its progress
_ANSWER_ID = re.compile(rb'"id"\s*:\s*"(' + PREFIX.encode() + rb'\d+)"')
CANCEL_GRACE = 1.0  # seconds to hand the child a cancel notification when a call is abandoned

Renew = Callable[[float, float | None, str | None], Awaitable[None]]


def encode(message: dict[str, Any]) -> bytes:
    """One JSON line (newline included), UTF-8, strict (no NaN).

    ``pydantic_core.to_json`` writes it in a sixth of ``json.dumps``' time, the same bytes but for
    small floats (``1e-7`` and ``0.00001``, as the SDK writes them, for ``1e-07`` and ``1e-05``:
    the same numbers); ``json`` takes over for what it would refuse, so the errors stay json's.

    Error handling: ``ValueError`` for what strict JSON in UTF-8 cannot carry (NaN, a lone
    surrogate), ``RecursionError`` for nesting deeper than Python's limit.
    """
    try:
        line = pydantic_core.to_json(message)
    except ValueError:  # too deep for it, a lone surrogate, a type JSON has not
        line = None
    if line is None or b"NaN" in line or b"Infinity" in line:  # maybe a non-finite float: json refuses it
        return _STRICT.encode(message).encode() + b"\n"
    return line + b"\n"


_STRICT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class Waiter:
    """One raw call in flight: the latest progress and the answer, as the stdout pump finds them.

    An awaiting caller waits on :attr:`changed`; a caller served by callbacks gives *notify*
    instead, called (sync, from the pump) with each change.
    """

    __slots__ = ("answer", "changed", "closed", "notify", "progress")

    def __init__(self, notify: Callable[[Waiter], None] | None = None) -> None:
        # asyncio's Event, cleared and reused: a sixth of anyio.Event's cost, twice per call. The
        # daemon runs anyio on asyncio only (the stdin writer below is asyncio's too), and a
        # cancel scope cancels a task waiting on it as on anything else.
        self.changed = asyncio.Event() if notify is None else None
        self.notify = notify
        self.progress: tuple[float, float | None, str | None] | None = None
        self.answer: dict[str, Any] | None = None
        self.closed = False

    def wake(self) -> None:
        if self.notify is not None:
            self.notify(self)
        else:
            assert self.changed is not None
            self.changed.set()


class RawCalls:
    """The raw calls in flight on one child connection.

    *sink* is the child's stdin queue, shared with the SDK session; *stdin* the pipe it feeds,
    written directly while it has nothing buffered (a line is one write, so lines never
    interleave, and the queue's pump, which alone waits on a full pipe, notices a stall).
    :meth:`route` is called by the stdout pump; :meth:`close` when the connection ends, which
    fails every call in flight with ``CONNECTION_CLOSED``, as the session does with its own.
    """

    def __init__(
        self,
        sink: MemoryObjectSendStream[bytes],
        stdin: asyncio.StreamWriter,
        on_request: Callable[[str, str, Any], None] | None = None,
    ) -> None:
        self._sink = sink
        self._stdin = stdin
        self._on_request = on_request  # sees (id, method, params) of each request before it goes
        self._ids = itertools.count(1)
        self._waiting: dict[str, Waiter] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._waiting)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None, renew: Renew) -> dict[str, Any]:
        """The child's ``result`` object for ``tools/call`` *name* (checked for shape, no more).

        *renew* is awaited with each progress the child reports. Cancelling the caller sends
        the child ``notifications/cancelled``.

        Error handling: ``MCPError`` with the child's error, ``CONNECTION_CLOSED`` when the
        connection ends first, or ``INVALID_PARAMS`` when the call cannot be encoded (nothing
        is sent then); ``ValueError`` for an answer that is not a tool result.
        """
        answer = await self.request("tools/call", call_params(name, arguments), renew)
        if not isinstance(answer.get("content", []), list):
            raise ValueError("not a tool result")
        return answer

    async def request(self, method: str, params: dict[str, Any], renew: Renew) -> dict[str, Any]:
        """The child's ``result`` object for any request (a task-augmented call, ``tasks/get``, ...).

        Its ``_meta`` gets our progress token. Errors as :meth:`call_tool`; ``ValueError`` for
        an answer whose result is not an object.
        """
        request_id, line = self._prepare(method, params)
        waiter = self._waiting[request_id] = Waiter()
        sent = True  # from here the child may have it (a cancel for an id it never saw is harmless)
        try:
            try:
                await self._write(line)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError, RuntimeError):
                sent = False
                raise MCPError(types.CONNECTION_CLOSED, "Connection closed") from None
            return await self._answer(waiter, renew)
        except anyio.get_cancelled_exc_class():
            if sent and waiter.answer is None and not waiter.closed:
                await self._cancel(request_id)
            raise
        finally:
            self._waiting.pop(request_id, None)

    def send_now(self, method: str, params: dict[str, Any], notify: Callable[[Waiter], None]) -> str | None:
        """Send a request at once, without a task waiting for it: its id, or None (nothing sent)
        when it cannot go in one write now (the pipe is busy, the connection closed).

        *notify* is called, sync, from the stdout pump with each change of its :class:`Waiter`
        (progress, the answer, the connection's end); its owner calls :meth:`forget` once done
        with it, or :meth:`abandon` to cancel it. Errors as :meth:`request` (nothing is sent).
        """
        transport = self._stdin.transport
        if self._closed or transport.is_closing() or transport.get_write_buffer_size():
            return None
        request_id, line = self._prepare(method, params)
        self._waiting[request_id] = Waiter(notify)
        self._stdin.write(line)
        if transport.get_write_buffer_size():  # the pipe is full: the stdin pump watches it stall
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._sink.send_nowait(b"")  # if it is busy, it is draining already, these bytes too
        return request_id

    def forget(self, request_id: str) -> None:
        """Stop routing to *request_id* (a late answer is dropped)."""
        self._waiting.pop(request_id, None)

    def abandon(self, request_id: str) -> None:
        """Stop waiting for a request sent with :meth:`send_now`, and tell the child to cancel it."""
        waiter = self._waiting.pop(request_id, None)
        if waiter is None or waiter.answer is not None or waiter.closed or self._closed:
            return
        transport = self._stdin.transport
        if not transport.is_closing():  # after its request, in the same pipe: never ahead of it
            self._stdin.write(encode(_cancel_notification(request_id)))

    def _prepare(self, method: str, params: dict[str, Any]) -> tuple[str, bytes]:
        """A new request's id and line, announced to whoever watches what is sent."""
        request_id = f"{PREFIX}{next(self._ids)}"
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        params = {**params, "_meta": {**meta, "progressToken": request_id}}
        try:
            line = encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        except (ValueError, RecursionError) as exc:
            reason = f"{type(exc).__name__}: {str(exc)[:200]}"
            message = f"the request cannot be encoded as JSON ({reason})"
            raise MCPError(types.INVALID_PARAMS, message) from None
        if self._closed:
            raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
        if self._on_request is not None:
            self._on_request(request_id, method, params)
        if (sending := SENDING.get()) is not None:
            sending(request_id)
        return request_id, line

    async def _answer(self, waiter: Waiter, renew: Renew) -> dict[str, Any]:
        assert waiter.changed is not None
        while True:
            await waiter.changed.wait()
            waiter.changed.clear()  # before reading: a wake from now on is seen next round
            if waiter.progress is not None:  # the latest, even with the answer in: the SDK path relays it too
                progress, waiter.progress = waiter.progress, None
                await renew(*progress)
            if waiter.answer is not None:
                return result(waiter.answer)
            if waiter.closed:
                raise MCPError(types.CONNECTION_CLOSED, "Connection closed")

    async def _cancel(self, request_id: str) -> None:
        notification = _cancel_notification(request_id)
        gone = (
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
            OSError,
            RuntimeError,
        )  # nothing to cancel
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_GRACE), contextlib.suppress(*gone):
            await self._sink.send(encode(notification))  # queued: never ahead of its request

    async def _write(self, line: bytes) -> None:
        transport = self._stdin.transport
        if self._closed or transport.is_closing() or transport.get_write_buffer_size():
            await self._sink.send(line)  # behind what waits, or to fail as the connection ended
        else:
            self._stdin.write(line)  # usually taken by the pipe at once
            if transport.get_write_buffer_size():
                await self._sink.send(b"")  # the pipe is full: the pump waits for it, stall timer and all

    def claims(self, message: Any) -> bool:
        """Whether :meth:`route` takes *message*: an answer to a raw call, or its progress. Pure."""
        if not isinstance(message, dict):
            return False
        if "method" not in message:
            request_id = message.get("id")
            return isinstance(request_id, str) and request_id.startswith(PREFIX)
        if message.get("method") != "notifications/progress" or message.get("id") is not None:
            return False
        params = message.get("params")
        token = params.get("progressToken") if isinstance(params, dict) else None
        return isinstance(token, str) and token.startswith(PREFIX)

    def route(self, message: Any) -> bool:
        """Hand a parsed child message to its raw call, if it belongs to one (:meth:`claims`). Sync."""
        if not self.claims(message):
            return False
        if "method" not in message:
            waiter = self._waiting.get(message["id"])
            if waiter is not None:  # else late: dropped
                waiter.answer = message
                waiter.wake()
            return True
        params = message["params"]
        waiter = self._waiting.get(params["progressToken"])
        progress = _finite(params.get("progress"))
        if waiter is not None and progress is not None:
            total, text = _finite(params.get("total")), params.get("message")
            waiter.progress = (progress, total, text if isinstance(text, str) else None)
            waiter.wake()
        return True

    def unreadable(self, line: bytes) -> None:
        """A line that names a raw call but is not JSON (a lone surrogate, nesting past the
        parser's limit): fail that call now rather than let it wait for its timeout. Sync."""
        named = set(_ANSWER_ID.findall(line))
        waiter = self._waiting.get(named.pop().decode()) if len(named) == 1 else None
        if waiter is not None and waiter.answer is None:
            message = "the extension's answer is not valid JSON"
            waiter.answer = {"error": {"code": types.INTERNAL_ERROR, "message": message}}
            waiter.wake()

    def close(self) -> None:
        self._closed = True
        for waiter in list(self._waiting.values()):  # a notified owner forgets its waiter at once
            waiter.closed = True
            waiter.wake()


def _finite(value: Any) -> float | None:
    """*value* as a finite float, or None (not a number, a bool, NaN, infinite, too big)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of 400 digits
        return None
    return number if math.isfinite(number) else None


def call_params(name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The params of ``tools/call`` *name*."""
    return {"name": name} if arguments is None else {"name": name, "arguments": arguments}


def tool_result(answer: dict[str, Any]) -> dict[str, Any]:
    """The ``result`` of a child's *answer* to ``tools/call``. Errors as :func:`result`."""
    called = result(answer)
    if not isinstance(called.get("content", []), list):
        raise ValueError("not a tool result")
    return called


def _cancel_notification(request_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id, "reason": "the caller cancelled the request"},
    }


def result(answer: dict[str, Any]) -> dict[str, Any]:
    """The ``result`` object of a child's *answer*.

    Error handling: ``MCPError`` with the child's error; ``ValueError`` for an answer that has
    neither a well-formed error nor a result object.
    """
    error = answer.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, dict) else None
        if not isinstance(code, int) or isinstance(code, bool):
            raise ValueError("an error without a code")
        message = error.get("message")
        raise MCPError(code, message if isinstance(message, str) else "", error.get("data"))
    result = answer.get("result")
    if not isinstance(result, dict):
        raise ValueError("not a result object")
    return result
