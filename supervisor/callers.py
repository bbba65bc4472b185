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
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
import mcp_types as types
import structlog
from mcp import MCPError

if TYPE_CHECKING:
    from .transport import Connection

__all__ = ("NOT_ANSWERABLE", "Asking", "Budget", "Caller")

log = structlog.get_logger(__name__)

NOT_ANSWERABLE = types.INVALID_REQUEST  # as the SDK's client answers a request it does not support


class Caller(Protocol):
    """The client a call came from, as its child may ask it things (see ``gateway.passthrough``)."""

    @property
    def client(self) -> object:
        """The same object for every call from one client connection."""
        ...

    def refusal(self, method: str) -> str | None:
        """Why this client cannot be asked *method* (it did not declare it, ...), or None. Sync."""
        ...

    async def ask(self, request: types.ServerRequest) -> types.ClientResult:
        """The client's answer. Error handling: ``MCPError`` with the client's error, or why none came."""
        ...


class Budget:
    """A call's deadline: *timeout* of inactivity, renewed by progress, never past *cap* in all.

    While the client is asked something on the call's behalf (:meth:`hold`), only the cap counts:
    the child is waiting, not idle.
    """

    def __init__(self, scope: anyio.CancelScope, timeout: float, cap: float) -> None:
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

    @property
    def client(self) -> object:
        return self if self.caller is None else self.caller.client  # each anonymous call is its own client


@dataclass(eq=False)
class _Ask:
    scope: anyio.CancelScope
    calls: set[_Call]


class _Enrolled:
    """:meth:`Asking.call`'s ``with``: a class, not a generator, for it runs on every call."""

    __slots__ = ("_call", "_calls", "_connection")

    def __init__(
        self, calls: weakref.WeakKeyDictionary[Connection, list[_Call]], connection: Connection, call: _Call
    ) -> None:
        self._calls, self._connection, self._call = calls, connection, call

    def __enter__(self) -> None:
        self._calls.setdefault(self._connection, []).append(self._call)

    def __exit__(self, *exc_info: object) -> None:
        call = self._call
        calls = self._calls.get(self._connection, [])
        calls.remove(call)
        if not calls:
            self._calls.pop(self._connection, None)
        for ask in call.asks:
            ask.calls.discard(call)
            if not ask.calls:  # no call left that it may serve
                ask.scope.cancel()


class Asking:
    """The calls in flight on each run of one extension, and the answers to its child's requests.

    Args:
        extension: the extension's name, for messages.
        roots: absolute paths answered to ``roots/list`` when no calling client gives any.
    """

    def __init__(self, extension: str, roots: Sequence[str] = ()) -> None:
        self._extension = extension
        self._roots = [types.Root(uri=Path(path).as_uri(), name=Path(path).name or path) for path in roots]
        self._calls: weakref.WeakKeyDictionary[Connection, list[_Call]] = weakref.WeakKeyDictionary()
        self._roots_from: weakref.WeakKeyDictionary[Connection, object] = weakref.WeakKeyDictionary()

    def in_flight(self, connection: Connection) -> int:
        return len(self._calls.get(connection, ()))

    def call(self, connection: Connection, caller: Caller | None, budget: Budget) -> _Enrolled:
        """Record a call from *caller* on *connection* for as long as the ``with`` lasts."""
        return _Enrolled(self._calls, connection, _Call(caller, budget))

    async def answer(
        self, connection: Connection, request: types.ServerRequest
    ) -> types.ClientResult | types.ErrorData:
        """The answer to the child's *request*: the caller's, ours, or an error saying why none."""
        method = request.method
        calls = list(self._calls.get(connection, ()))
        clients = {call.client for call in calls}
        caller = calls[0].caller if len(clients) == 1 else None
        refusal = caller.refusal(method) if caller is not None else None
        if isinstance(request, types.ListRootsRequest):
            if caller is None or refusal is not None:
                return types.ListRootsResult(roots=list(self._roots))
        elif not calls:
            return self._refuse(
                method, "it came outside any call through the gateway, so nobody can answer it"
            )
        elif len(clients) > 1:
            return self._refuse(
                method,
                f"calls from {len(clients)} clients are in flight (each call of a 2026-07-28 client "
                "counts as one) and a request over stdio does not say which call it serves; "
                "the gateway does not guess",
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
        ask = _Ask(anyio.CancelScope(deadline=deadline), set(calls))
        for call in calls:
            call.asks.add(ask)
            call.budget.hold()
        try:
            with ask.scope:
                return await caller.ask(request)
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
