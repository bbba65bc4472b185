"""A parked call of a 2026-07-28 client, and what its child's questions and progress meet.

A :class:`Parked` call runs in a task of the :mod:`.inputrequired` table, outside the request
that started it; :func:`serve_parked` marks that task, so that during it a child's question goes
to the call (:class:`ParkedCaller`: recorded for the next input-required result) rather than
to a request channel, and its progress and log messages to whichever request attends it now.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import mcp_types as types
import structlog
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.shared.dispatcher import ProgressFnT

from supervisor.extension.asking import NOT_ANSWERABLE
from supervisor.gateway.asks.callers import SessionCaller, capability_refusal
from supervisor.gateway.progress import LatestProgress
from supervisor.gateway.session import MAX_ASKS

__all__ = (
    "Parked",
    "ParkedCaller",
    "Pending",
    "Table",
    "attending",
    "caller",
    "progress",
    "serve_parked",
)

log = structlog.get_logger(__name__)


class Table(Protocol):
    """What a parked call's questions need of its table (:class:`.inputrequired.InputRequired`)."""

    def room_for(self, call: Parked) -> str | None: ...

    def ask(self, call: Parked, request: types.ServerRequest) -> Pending: ...


@dataclass(eq=False)
class Pending:
    key: str
    request: types.InputRequest
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: types.ClientResult | None = None
    error: str | None = None


@dataclass(eq=False)
class Parked:
    handle: bytes
    client: Hashable  # what a retry must come from: an mcp.sock Session, or ("http", profile)
    identity: tuple[str, str, Any]  # method, name or URI, arguments
    capabilities: types.ClientCapabilities | None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    changed: anyio.Event = field(default_factory=anyio.Event)
    pending: dict[str, Pending] = field(default_factory=dict)
    asked: int = 0  # requests from the child so far: their keys
    round: int = 0  # of the requestState the client holds (0: none yet)
    attended: bool = False
    slot: bool = False  # counted in the bounds: it has been waiting for input
    relay: ProgressFnT | None = None  # the attending request's progress
    attendant: ServerRequestContext[Any] | None = None  # the attending request (its log messages)
    outcome: tuple[Any, BaseException | None] | None = None
    parked_at: float | None = None  # when its last input-required result went out, unanswered since
    patience: float | None = None  # its extension's call_timeout: how long a retry may take

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


_CURRENT: ContextVar[tuple[Table, Parked] | None] = ContextVar("mcp_supervisor_parked", default=None)


def serve_parked(table: Table, call: Parked) -> None:
    """The current task (and those it starts) serves *call*, parked in *table*."""
    _CURRENT.set((table, call))


def caller(ctx: ServerRequestContext[Any]) -> SessionCaller | ParkedCaller:
    """Who a child's questions go to during the request of *ctx*: its parked call, if it has one."""
    current = _CURRENT.get()
    return ParkedCaller(*current) if current is not None else SessionCaller(ctx)


def attending(ctx: ServerRequestContext[Any]) -> Callable[[], ServerRequestContext[Any] | None]:
    """Which request serves the client of the request of *ctx* at a given moment: that request, or
    whichever attends its parked call (None while nobody does)."""
    current = _CURRENT.get()
    if current is None:
        return lambda: ctx
    call = current[1]
    return lambda: call.attendant


def progress(ctx: ServerRequestContext[Any]) -> ProgressFnT:
    """Where a child's progress goes during the request of *ctx*: whichever request attends its call."""
    current = _CURRENT.get()
    if current is None:
        return LatestProgress(ctx.session.report_progress)
    call = current[1]

    async def relay(value: float, total: float | None, message: str | None) -> None:
        if call.relay is not None:  # parked: nobody to tell
            try:
                await call.relay(value, total, message)
            except Exception as exc:  # that request was answered, or its client went, meanwhile
                log.debug("gateway.progress_dropped", error=str(exc)[:200])

    return relay


class ParkedCaller:
    """A parked call's client, as its child's questions see it (see :mod:`supervisor.extension.asking`)."""

    def __init__(self, table: Table, call: Parked) -> None:
        self._table, self._call = table, call

    @property
    def client(self) -> object:
        # Each call is a client of its own: a question put to the wrong parked call would wait for
        # a retry that may never come, and over stdio a child's request does not say which it serves.
        return self._call

    def opens_urls(self) -> bool:
        return False  # a 2026-07-28 client: no URL-mode elicitation in its era

    def refusal(self, method: str) -> str | None:
        call = self._call
        refusal = capability_refusal(call.capabilities, method)
        if refusal is None and len(call.pending) >= MAX_ASKS:
            refusal = f"the call has {MAX_ASKS} requests waiting for the client already"
        return refusal if refusal is not None else self._table.room_for(call)

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        if (refusal := self.refusal(request.method)) is not None:
            raise MCPError(NOT_ANSWERABLE, refusal)
        self._call.patience = patience
        pending = self._table.ask(self._call, request)
        try:
            await pending.answered.wait()
        finally:
            self._call.pending.pop(pending.key, None)
        if pending.answer is None:
            raise MCPError(types.CONNECTION_CLOSED, pending.error or "the client did not answer")
        return pending.answer
