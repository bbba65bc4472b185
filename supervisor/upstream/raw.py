"""Plain-JSON calls beside an upstream's SDK session: what every kind's fast path shares.

The SDK's ``ClientSession`` costs about a millisecond of CPU per call on each side of the
daemon (models built, validated and dumped twice, a task and streams per request). A call that
only passes through needs none of that: a kind's raw calls (:class:`Raw`: a child's
:class:`~supervisor.child.rawcalls.RawCalls`, a remote's :class:`~supervisor.remote.rawcalls.RemoteCalls`)
send the request as bytes and hand the answer back as parsed JSON, before the session sees it.

Their request ids (``mcpsv-N``, strings) never clash with the session's (integers), and they
double as progress tokens.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any, Protocol

import mcp_types as types
import pydantic_core
from mcp import MCPError

from supervisor.upstream.wire import SENDING

__all__ = (
    "PREFIX",
    "Raw",
    "Waiter",
    "call_params",
    "cancel_notification",
    "encode",
    "finite",
    "request_line",
    "result",
    "tool_result",
)

PREFIX = "mcpsv-"


class Raw(Protocol):
    """An upstream's calls beside its session, served by callbacks (see :class:`Waiter`)."""

    def send_now(self, method: str, params: dict[str, Any], notify: Callable[[Waiter], None]) -> str | None:
        """Send a request at once, without a task of the caller's waiting for it: its id, or
        None (nothing sent) when it cannot go now; the SDK's path serves it then.

        *notify* is called, sync, with each change of its :class:`Waiter` (progress, the
        answer, the connection's end); its owner calls :meth:`forget` once done with it, or
        :meth:`abandon` to cancel it. Error handling: ``MCPError(INVALID_PARAMS)`` when the
        request cannot be encoded (nothing is sent).
        """

    def forget(self, request_id: str) -> None:
        """Stop routing to *request_id* (a late answer is dropped)."""

    def abandon(self, request_id: str) -> None:
        """Stop waiting for a request sent with :meth:`send_now`, and tell the server to cancel it."""


def request_line(
    request_id: str, method: str, params: dict[str, Any], sent: Callable[[str, str, Any], None] | None
) -> bytes:
    """The request's bytes, *request_id* its progress token too, announced: to *sent* (the
    spool's, which notes the tool of each request) and to :data:`~.wire.SENDING` (a server's
    question then finds the call it came with).

    Error handling: ``MCPError(INVALID_PARAMS)`` when it cannot be encoded (nothing announced).
    """
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    params = {**params, "_meta": {**meta, "progressToken": request_id}}
    try:
        line = encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    except (ValueError, RecursionError) as exc:
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        raise MCPError(types.INVALID_PARAMS, f"the request cannot be encoded as JSON ({reason})") from None
    if sent is not None:
        sent(request_id, method, params)
    if (sending := SENDING.get()) is not None:
        sending(request_id)
    return line


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
    """One raw call in flight: the latest progress and the answer, as its reader finds them.

    An awaiting caller waits on :attr:`changed`; a caller served by callbacks gives *notify*
    instead, called (sync, from the reader) with each change.
    """

    __slots__ = ("answer", "changed", "closed", "notify", "progress")

    def __init__(self, notify: Callable[[Waiter], None] | None = None) -> None:
        # asyncio's Event, cleared and reused: a sixth of anyio.Event's cost, twice per call. The
        # daemon runs anyio on asyncio only (a child's stdin writer is asyncio's too), and a
        # cancel scope cancels a task waiting on it as on anything else.
        self.changed = asyncio.Event() if notify is None else None
        self.notify = notify
        self.progress: tuple[float, float | None, str | None] | None = None
        self.answer: dict[str, Any] | None = None
        self.closed = False

    def report(self, params: dict[str, Any]) -> None:
        """A progress notification's *params* for it: kept and woken, unless its progress is no
        finite number."""
        progress = finite(params.get("progress"))
        if progress is not None:
            total, text = finite(params.get("total")), params.get("message")
            self.progress = (progress, total, text if isinstance(text, str) else None)
            self.wake()

    def wake(self) -> None:
        if self.notify is not None:
            self.notify(self)
        else:
            assert self.changed is not None
            self.changed.set()


def finite(value: Any) -> float | None:
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


def cancel_notification(request_id: str) -> dict[str, Any]:
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
