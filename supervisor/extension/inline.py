"""A plain tool call served by the event loop's callbacks instead of a task.

A task per call, its cancel scopes and its wake-ups cost more than the rest of a call passing
through the daemon. :class:`InlineCall` sends the request from the caller's callback or task
and is answered where the child's answer is read (the stdout pump, or the pipe's own
callback); see :meth:`supervisor.extension.calls.Calls.call_tool_inline`, which starts one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import mcp_types as types
import structlog
from mcp import MCPError

from supervisor.errors import CallFailed
from supervisor.extension.asking import Asking, Budget, Caller
from supervisor.upstream.raw import Waiter, call_params, tool_result

if TYPE_CHECKING:
    from supervisor.extension.upstream import Upstream

__all__ = ("Answered", "Host", "InlineCall")

log = structlog.get_logger(__name__)


class Host(Protocol):
    """What an inline call uses of its extension: the bookkeeping an awaited call shares
    (:class:`~supervisor.extension.calls.Calls`)."""

    name: str
    _asking: Asking
    _answered_at: float

    @property
    def config(self) -> Any: ...  # call_timeout, call_timeout_max

    def _inline_began(self) -> None: ...

    def _inline_ended(self, tool: str, started: float, ok: bool) -> None: ...

    def _call_failed(self, what: str, exc: MCPError, connection: Upstream) -> CallFailed: ...

    def _invalid_result(self, what: str, exc: Exception) -> CallFailed: ...

    def _call_timed_out(self, what: str, started: float) -> CallFailed: ...


Answered = Callable[[dict[str, Any] | CallFailed], None]


class InlineCall:
    """One tool call served by the event loop's callbacks, not by a task (see
    :meth:`Calls.call_tool_inline`). A task per call, its cancel scopes and its wake-ups cost
    more than the rest of a passing call; here the stdout pump's callback answers it.

    Its bookkeeping is an awaited call's, through the same helpers: it is in flight, holds the
    idle timer off, is enrolled for the child's questions (its budget held while the client is
    asked), ends on ``call_timeout`` renewed by progress (``call_timeout_max`` in all), and is
    counted and timed. It ends once (answered, failed, timed out or cancelled); every callback
    after that does nothing.
    """

    __slots__ = (
        "_answered",
        "_armed_for",
        "_budget",
        "_connection",
        "_deadline",
        "_ended",
        "_enrolled",
        "_ext",
        "_request_id",
        "_started",
        "_timer",
        "_tool",
    )

    def __init__(
        self,
        ext: Host,
        connection: Upstream,
        tool: str,
        answered: Answered,
        caller: Caller | None,
    ) -> None:
        self._ext, self._connection, self._tool, self._answered = ext, connection, tool, answered
        self._started = time.monotonic()
        self._ended = False
        self._request_id = ""
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = self._armed_for = math.inf
        self._budget = Budget(self, ext.config.call_timeout, ext.config.call_timeout_max)
        self._enrolled = ext._asking.call(connection, caller, self._budget)

    @classmethod
    def send(
        cls,
        ext: Host,
        connection: Upstream,
        tool: str,
        arguments: dict[str, Any] | None,
        answered: Answered,
        caller: Caller | None,
    ) -> InlineCall | None:
        """The call, sent; None if it could not go at once (nothing sent, nothing counted)."""
        raw = connection.raw
        assert raw is not None
        call = cls(ext, connection, tool, answered, caller)
        call._enrolled.enroll()
        try:
            request_id = raw.send_now("tools/call", call_params(tool, arguments), call._notify)
        except MCPError:  # cannot be encoded: the awaited path says so
            request_id = None
        if request_id is None:
            call._ended = True
            call._enrolled.withdraw(abandoned=False)
            return None
        call._request_id = request_id  # the child has it: from here the rest is bookkeeping
        call._arm(call._deadline)
        call._enrolled.sent(request_id)
        ext._inline_began()
        return call

    @property
    def deadline(self) -> float:
        return self._deadline

    @deadline.setter
    def deadline(self, when: float) -> None:
        # One timer per call: a later deadline (progress) only changes what the timer checks when
        # it fires; an earlier one (a question answered: back from the cap) re-arms it.
        self._deadline = when
        if self._ended or not self._request_id or (self._timer is not None and self._armed_for <= when):
            return  # ended, not sent yet (armed once it is), or armed for no later
        self._stop_timer()
        self._arm(when)

    def _arm(self, when: float) -> None:
        self._armed_for = when
        self._timer = asyncio.get_running_loop().call_later(when - time.monotonic(), self._expired)

    def cancel(self) -> None:
        """Stop waiting (the client cancelled the call, or went): the child is told, nobody answered."""
        if not self._ended:
            assert self._connection.raw is not None
            self._connection.raw.abandon(self._request_id)
            self._end(None, abandoned=True)

    def _expired(self) -> None:
        self._timer = None
        if self._ended:
            return
        if self._deadline > time.monotonic():  # renewed meanwhile (or a timer that woke early)
            self._arm(self._deadline)
            return
        assert self._connection.raw is not None
        self._connection.raw.abandon(self._request_id)
        self._end(self._ext._call_timed_out(self._what, self._started), abandoned=True)

    @property
    def _what(self) -> str:
        return f"tool {self._tool!r}"

    def _notify(self, waiter: Waiter) -> None:
        """The stdout pump's news of our request (sync): progress, the answer, the connection's end."""
        if self._ended:
            return
        ext = self._ext
        if waiter.progress is not None:
            waiter.progress = None  # nobody to relay it to (a call with a token is awaited)
            ext._answered_at = time.monotonic()
            self._budget.renew()
        if waiter.answer is not None:
            ext._answered_at = time.monotonic()
            outcome: dict[str, Any] | CallFailed
            try:
                outcome = tool_result(waiter.answer)
            except MCPError as exc:
                outcome = ext._call_failed(self._what, exc, self._connection)
            except ValueError as exc:
                outcome = ext._invalid_result(self._what, exc)
            self._end(outcome)
        elif waiter.closed:
            closed = MCPError(types.CONNECTION_CLOSED, "Connection closed")
            self._end(ext._call_failed(self._what, closed, self._connection))

    def _end(self, outcome: dict[str, Any] | CallFailed | None, *, abandoned: bool = False) -> None:
        self._ended = True
        self._stop_timer()
        ok = isinstance(outcome, dict) and outcome.get("isError") is not True
        if outcome is not None:  # first: the client waits, the bookkeeping does not (all of it is sync)
            try:
                self._answered(outcome)
            except Exception:  # a bug of ours: this call's answer is lost, the pump goes on
                log.exception("gateway.inline_answer_crashed", extension=self._ext.name, tool=self._tool)
        try:
            assert self._connection.raw is not None
            self._connection.raw.forget(self._request_id)
            self._enrolled.withdraw(abandoned=abandoned)
            self._ext._inline_ended(self._tool, self._started, ok)
        except Exception:  # a bug of ours: never out into the pump or the loop
            log.exception("extension.inline_call_crashed", extension=self._ext.name, tool=self._tool)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
