"""Who a child's request to its client goes to: the client whose call it is serving.

A child asks its client things in the middle of a call: ``elicitation/create``,
``sampling/createMessage``, ``roots/list``. Over stdio such a request names no request of ours
(the SDK's related request id is transport metadata, never on the wire), so the caller is
inferred from the calls in flight on that child run:

- exactly one client has calls in flight there: the request goes to it, and its answer back;
- none, or several clients (a call from the control socket counts as a client of its own):
  the child gets a JSON-RPC error at once, never a guess that may reach the wrong person;
- ``roots/list`` is answered from the one caller's roots when it declared the capability,
  else from the extension's ``roots:`` setting (an empty list when unset), never an error.

An ask lives no longer than the calls it may serve: it is cancelled (the child gets an error)
when the last call of that client on that run ends, and never outlives their ``call_timeout_max``.
While it waits for the client (a human, perhaps), the calls' inactivity budget is held.

A call the gateway stopped waiting for (its client cancelled it or went, or it timed out) has
been cancelled in the child (``notifications/cancelled``). A child that follows the spec stops
serving it, but a question it sent before it read the cancel may still be on its way: the call
stays its client's call in flight, for routing questions only (it is *abandoned*), for
:data:`CANCEL_GRACE` more, renewed by each progress the child still reports on it, until the
child answers it or its ``call_timeout_max`` passes. Meanwhile its questions are never put to
another client, and alone it makes a question unanswerable; after it, a question goes to whoever
is calling (a child that ignores the cancel in silence and asks later is not told from one that
asks for a call of now). At most :data:`MAX_ABANDONED` are kept per run; past that, the one due
to end first is folded into a time until which every question on that run is ambiguous.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Sequence
from contextvars import Token
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import mcp_types as types
import structlog
from mcp import MCPError

from supervisor.upstream.wire import SENDING, Watched

if TYPE_CHECKING:
    from supervisor.extension.upstream import Upstream

__all__ = (
    "CANCEL_GRACE",
    "MAX_ABANDONED",
    "NOT_ANSWERABLE",
    "Asking",
    "Budget",
    "Caller",
    "Deadline",
    "Enrolled",
)

log = structlog.get_logger(__name__)

NOT_ANSWERABLE = types.INVALID_REQUEST  # as the SDK's client answers a request it does not support
MAX_ABANDONED = 256  # per child run: calls the gateway stopped waiting for, kept for routing questions
# After its cancel (or its last progress), how long an abandoned call still counts: a question
# the child sent before it read the cancel is still on its way. Not call_timeout: a child that
# follows the spec never answers a cancelled call, so that blocked every other client's
# questions for the whole call_timeout.
CANCEL_GRACE = 2.0


class Caller(Protocol):
    """The client a call came from, as its child may ask it things (see ``gateway.passthrough``)."""

    @property
    def client(self) -> object:
        """The same object for every call from one client connection."""
        ...

    def refusal(self, method: str) -> str | None:
        """Why this client cannot be asked *method* (it did not declare it, ...), or None. Sync."""
        ...

    def opens_urls(self) -> bool:
        """Whether the client takes URL-mode elicitation (a login it asks its person to open)."""
        ...

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        """The client's answer. *patience*: the calls' ``call_timeout``, for a client that must come
        back for the question (a 2026-07-28 client's retry) rather than be sent it.

        Error handling: ``MCPError`` with the client's error, or why none came.
        """
        ...


class Deadline(Protocol):
    """What a :class:`Budget` moves: a cancel scope, or the timer of a call served without a task."""

    deadline: float


class Budget:
    """A call's deadline: *timeout* of inactivity, renewed by progress, never past *cap* in all.

    While the client is asked something on the call's behalf (:meth:`hold`), only the cap counts:
    the child is waiting, not idle.
    """

    def __init__(self, scope: Deadline, timeout: float, cap: float) -> None:
        self.scope, self.timeout = scope, timeout
        self.cap_deadline = time.monotonic() + cap
        self._held = 0
        self.renew()

    def renew(self) -> None:
        if not self._held:
            self.scope.deadline = min(time.monotonic() + self.timeout, self.cap_deadline)

    def hold(self) -> None:
        self._held += 1
        self.scope.deadline = self.cap_deadline

    def release(self) -> None:
        self._held -= 1
        self.renew()


@dataclass(eq=False)
class _Call:
    caller: Caller | None  # None: the control socket, which cannot be asked anything
    budget: Budget
    asks: set[_Ask] = field(default_factory=set)
    sent: types.RequestId | None = None  # the id of its request to the child, once sent

    @property
    def client(self) -> object:
        return self if self.caller is None else self.caller.client  # each anonymous call is its own client

    def sending(self, request_id: types.RequestId) -> None:
        self.sent = request_id


@dataclass(eq=False, slots=True)
class _Left:
    """An abandoned call: its client, and until when it counts (see the module's docstring)."""

    client: object
    until: float  # silence past it: the child let it go; its progress renews it
    cap: float  # its call_timeout_max


class _Abandoned:
    """The abandoned calls of one child run, by the id of their request (see the module's docstring).

    *watched* is that run's :class:`~supervisor.child.wire.Watched`: the child's answer to one of them, or
    its progress, reaches :meth:`_heard`.
    """

    def __init__(self, watched: Watched) -> None:
        self._watched = watched
        self._left: dict[object, _Left] = {}
        self._ambiguous_until = 0.0  # what was folded in at the bound

    def add(self, call: _Call) -> None:
        now = time.monotonic()
        cap = call.budget.cap_deadline
        left = _Left(call.client, min(cap, now + CANCEL_GRACE), cap)
        if len(self._left) >= MAX_ABANDONED:
            self._prune(now)
        if len(self._left) >= MAX_ABANDONED:
            key, first = min(self._left.items(), key=lambda item: item[1].until)
            self._ambiguous_until = max(self._ambiguous_until, first.until)
            self._forget(key)
        key = call.sent if call.sent is not None else object()  # never sent: nothing to hear of
        self._left[key] = left
        if call.sent is not None:
            self._watched.ids[call.sent] = functools.partial(self._heard, call.sent)

    def clients(self) -> set[object]:
        """The clients whose abandoned calls still count; ``self`` stands for those folded in."""
        now = time.monotonic()
        self._prune(now)
        clients = {left.client for left in self._left.values()}
        return clients | {self} if now < self._ambiguous_until else clients

    def __len__(self) -> int:
        return len(self._left)

    def _heard(self, key: object, answered: bool) -> None:
        left = self._left.get(key)
        if left is None or answered:
            self._forget(key)
        else:
            left.until = min(left.cap, time.monotonic() + CANCEL_GRACE)

    def _prune(self, now: float) -> None:
        for key in [key for key, left in self._left.items() if left.until <= now]:
            self._forget(key)

    def _forget(self, key: object) -> None:
        self._left.pop(key, None)
        self._watched.ids.pop(key, None)  # type: ignore[call-overload]  # an id, or an object never watched


@dataclass(eq=False)
class _Ask:
    scope: anyio.CancelScope
    calls: set[_Call]


class Enrolled:
    """:meth:`Asking.call`'s ``with``: a class, not a generator, for it runs on every call.

    A call served without a task (:class:`supervisor.extension.calls.InlineCall`) uses its
    parts instead: :meth:`enroll`, :meth:`sent` with the id of its request, :meth:`withdraw`.
    """

    __slots__ = ("_asking", "_call", "_connection", "_token")

    def __init__(self, asking: Asking, connection: Upstream, call: _Call) -> None:
        self._asking, self._connection, self._call = asking, connection, call
        self._token: Token[Any] | None = None

    def __enter__(self) -> None:
        self.enroll()
        self._token = SENDING.set(self._call.sending)  # the id of the request it sends, for _Abandoned

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if self._token is not None:
            SENDING.reset(self._token)
        cancelled = exc_type is not None and issubclass(exc_type, anyio.get_cancelled_exc_class())
        self.withdraw(abandoned=cancelled)  # by its client, or its timeout: not answered

    def enroll(self) -> None:
        self._asking._calls.setdefault(self._connection, []).append(self._call)

    def sent(self, request_id: types.RequestId) -> None:
        self._call.sending(request_id)

    def withdraw(self, *, abandoned: bool) -> None:
        """The call ended: answered, failed, or (*abandoned*) no longer waited for."""
        call, calls_of = self._call, self._asking._calls
        calls = calls_of.get(self._connection, [])
        calls.remove(call)
        if not calls:
            calls_of.pop(self._connection, None)
        for ask in call.asks:
            ask.calls.discard(call)
            if not ask.calls:  # no call left that it may serve
                ask.scope.cancel()
        if abandoned:
            self._asking._abandoned(self._connection, call)


class Asking:
    """The calls in flight on each run of one extension, and the answers to its child's requests.

    Args:
        extension: the extension's name, for messages.
        roots: absolute paths answered to ``roots/list`` when no calling client gives any.
    """

    def __init__(self, extension: str, roots: Sequence[str] = ()) -> None:
        self._extension = extension
        self._roots = [types.Root(uri=Path(path).as_uri(), name=Path(path).name or path) for path in roots]
        self._calls: weakref.WeakKeyDictionary[Upstream, list[_Call]] = weakref.WeakKeyDictionary()
        self._left: weakref.WeakKeyDictionary[Upstream, _Abandoned] = weakref.WeakKeyDictionary()
        self._roots_from: weakref.WeakKeyDictionary[Upstream, object] = weakref.WeakKeyDictionary()

    def in_flight(self, connection: Upstream) -> int:
        return len(self._calls.get(connection, ()))

    def call(self, connection: Upstream, caller: Caller | None, budget: Budget) -> Enrolled:
        """Record a call from *caller* on *connection* for as long as the ``with`` lasts; one that
        ends cancelled (by its client, or its timeout) stays counted as abandoned."""
        return Enrolled(self, connection, _Call(caller, budget))

    def _abandoned(self, connection: Upstream, call: _Call) -> None:
        if connection.ended.is_set():  # the run is over: nothing will ask for it
            return
        left = self._left.get(connection)
        if left is None:
            left = self._left[connection] = _Abandoned(connection.watched)
        left.add(call)

    async def answer(
        self, connection: Upstream, request: types.ServerRequest
    ) -> types.ClientResult | types.ErrorData:
        """The answer to the child's *request*: the caller's, ours, or an error saying why none."""
        method = request.method
        calls = list(self._calls.get(connection, ()))
        left = self._left.get(connection)
        abandoned = left.clients() if left is not None else set()
        clients = {call.client for call in calls} | abandoned
        caller = calls[0].caller if calls and len(clients) == 1 else None
        refusal = caller.refusal(method) if caller is not None else None
        if isinstance(request, types.ListRootsRequest):
            if caller is None or refusal is not None:
                return types.ListRootsResult(roots=list(self._roots))
        elif len(clients) > 1:
            return self._refuse(
                method,
                f"calls from {len(clients)} clients are in flight (each call of a 2026-07-28 client "
                "counts as one, and so does a call cancelled in the last few seconds, which the "
                "extension may still be serving) and a request over stdio does not say which call "
                "it serves; the gateway does not guess",
            )
        elif abandoned and not calls:
            return self._refuse(
                method,
                "the call it came during was cancelled or timed out: the gateway stopped waiting for "
                "it, and nobody is left to answer",
            )
        elif not calls:
            return self._refuse(
                method, "it came outside any call through the gateway, so nobody can answer it"
            )
        elif caller is None:
            return self._refuse(method, "the call came from the control socket (`mcp-supervisor call`)")
        elif refusal is not None:
            return self._refuse(method, refusal)
        assert caller is not None
        answer = await self._forward(calls, caller, request)
        if isinstance(request, types.ListRootsRequest) and not isinstance(answer, types.ErrorData):
            self._roots_from[connection] = caller.client
        return answer

    async def _forward(
        self, calls: list[_Call], caller: Caller, request: types.ServerRequest
    ) -> types.ClientResult | types.ErrorData:
        deadline = max(call.budget.cap_deadline for call in calls)
        patience = min(call.budget.timeout for call in calls)
        ask = _Ask(anyio.CancelScope(deadline=deadline), set(calls))
        for call in calls:
            call.asks.add(ask)
            call.budget.hold()
        try:
            with ask.scope:
                return await caller.ask(request, patience)
        except MCPError as exc:
            log.info("gateway.ask_failed", method=request.method, code=exc.code, error=exc.message[:200])
            return exc.error
        finally:
            for call in calls:
                call.asks.discard(ask)
                call.budget.release()
        # Only reached when ask.scope was cancelled: no call left to serve, or the cap passed.
        return self._refuse(
            request.method,
            "the call it served ended, or reached call_timeout_max, before the client answered",
        )

    async def roots_changed(self, client: object) -> None:
        """Tell the runs whose roots came from *client* that they changed (a client's list_changed)."""
        for connection, source in list(self._roots_from.items()):
            if source is client and not connection.ended.is_set():
                with anyio.move_on_after(1):  # a child not reading its stdin is not worth waiting for
                    try:
                        await connection.roots_changed()
                    except Exception as exc:  # the connection ended meanwhile
                        log.debug("gateway.roots_changed_failed", error=str(exc)[:200])

    def _refuse(self, method: str, why: str) -> types.ErrorData:
        message = f"mcp-supervisor cannot forward {method} from extension {self._extension!r}: {why}"
        return types.ErrorData(code=NOT_ANSWERABLE, message=message)
