"""Tool calls to a child as plain JSON, beside its SDK session (its :class:`~supervisor.upstream.raw.Raw`).

:class:`RawCalls` writes the request line itself and takes the answer line back as parsed JSON,
before the session sees it. Its ids (``mcpsv-N``) double as progress tokens, so the stdout pump
routes a line to its waiter by one substring test and one parse. Everything else the child
sends goes to the session as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp import MCPError

from supervisor.upstream.raw import (
    PREFIX,
    Waiter,
    call_params,
    cancel_notification,
    encode,
    request_line,
    result,
)

__all__ = ("MARK", "RawCalls")

MARK = b'"' + PREFIX.encode()  # in every line that answers a raw call or reports its progress
_ANSWER_ID = re.compile(rb'"id"\s*:\s*"(' + PREFIX.encode() + rb'\d+)"')
CANCEL_GRACE = 1.0  # seconds to hand the child a cancel notification when a call is abandoned

Renew = Callable[[float, float | None, str | None], Awaitable[None]]


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
            self._stdin.write(encode(cancel_notification(request_id)))

    def _prepare(self, method: str, params: dict[str, Any]) -> tuple[str, bytes]:
        """A new request's id and line, announced to whoever watches what is sent."""
        if self._closed:
            raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
        request_id = f"{PREFIX}{next(self._ids)}"
        return request_id, request_line(request_id, method, params, self._on_request)

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
        notification = cancel_notification(request_id)
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
        if (waiter := self._waiting.get(params["progressToken"])) is not None:
            waiter.report(params)
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
