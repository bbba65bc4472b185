"""One gateway client: a :class:`Session` holds what is that client's, and its close releases it all.

A client is a connection of either listener, in either protocol era:

- on ``mcp.sock``, one Session per connection, made by the listener (:mod:`.unix`) and closed
  when the connection's task ends; the SDK's tasks for it find it through :func:`bind`, a
  context variable set in that task (its 2026-07-28 requests, each an SDK connection of its
  own, belong to it too);
- over HTTP, one per MCP session of a handshake-era client, made on its first request and
  closed with the SDK's connection (DELETE, idle expiry, or ended at the session cap);
- a 2026-07-28 request over HTTP has no session: a Session that serves that request only
  (``lasting`` False; a per-client extension refuses it).

It holds its profile, its in-flight slots (:class:`InFlight`, on ``mcp.sock``; over HTTP the
listener bounds requests per session id, :mod:`.http.bodies`), the questions children put to
it (:meth:`Session.ask`, at most :data:`MAX_ASKS` waiting), and its notifications (its
:class:`~.notify.downstream.Downstream`). The tables that keep something for a client key on
its Session and hear of its end through :meth:`Session.on_close`: its per-client instances
(:mod:`supervisor.extension.instances`), its tasks (:mod:`.tasks.owners`), its parked
2026-07-28 calls (:mod:`.asks.inputrequired`). :meth:`Session.close` ends all of it, once.

The SDK (2.3) has no public way from a request to its connection: :func:`connection_of` is
the one place that reads it.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Awaitable, Callable, Container
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import mcp_types as types
import structlog
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.connection import Connection
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from supervisor.extension.asking import NOT_ANSWERABLE

if TYPE_CHECKING:
    from supervisor.gateway.notify.downstream import Downstream

__all__ = (
    "MAX_ASKS",
    "MAX_CONNECTIONS",
    "MAX_IN_FLIGHT",
    "InFlight",
    "Session",
    "Slot",
    "Tracker",
    "bind",
    "connection_of",
    "session_of",
)

log = structlog.get_logger(__name__)

MAX_CONNECTIONS = 256  # clients at once on mcp.sock (and HTTP sessions); one more is turned away
MAX_IN_FLIGHT = 64  # unanswered requests per mcp.sock connection before the listener stops reading it
MAX_ASKS = 16  # requests from extensions waiting for one client at once
_KEY = "mcp-supervisor.session"  # in the SDK connection's per-connection state
ResultT = TypeVar("ResultT")
RequestId = str | int


class Session:
    """One gateway client (see the module's docstring). Sync but for :meth:`ask`.

    Args:
        listener: ``"unix"`` (``mcp.sock``) or ``"http"``.
        lasting: False for a client that is one request (2026-07-28 over HTTP).
    """

    def __init__(self, listener: str, *, lasting: bool = True) -> None:
        self.listener = listener
        self.lasting = lasting
        self.since = time.time()  # when it connected (wall clock: shown to people)
        self.connection: Connection | None = None  # the SDK connection of its handshake-era requests
        self.notifications: Downstream | None = None  # once it made a handshake-era request
        self.http_id: str | None = None  # its Mcp-Session-Id, once the HTTP fast path knows it
        self.closed = False
        self._asking: set[anyio.CancelScope] = set()
        self._on_close: list[Callable[[], None]] = []

    @functools.cached_property
    def in_flight(self) -> InFlight:
        """Its unanswered requests (an ``mcp.sock`` client's); made on first use, as most
        sessions (one HTTP request of a 2026-07-28 client) never need one."""
        return InFlight(MAX_IN_FLIGHT)

    def __repr__(self) -> str:
        return f"<Session {self.listener}{'' if self.lasting else ' (one request)'} at {id(self):#x}>"

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call *callback* (sync) when this client goes; at once if it has."""
        if self.closed:
            callback()
        else:
            self._on_close.append(callback)

    def close(self) -> None:
        """The client is gone: fail its questions, release its slots, tell every table. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for scope in self._asking:
            scope.cancel()
        if "in_flight" in self.__dict__:
            self.in_flight.release_all()
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a bug of ours: the other tables must still hear of the close
                log.exception("gateway.session_close_crashed")

    def attach(self, connection: Connection) -> None:
        """Note the SDK connection its handshake-era requests come on (its notifications and fast
        calls' questions go there); the first one only. Sync."""
        if self.connection is None and connection.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            self.connection = connection

    async def ask(self, send: Callable[[], Awaitable[ResultT]]) -> ResultT:
        """Put a child's question to this client (*send* does it), one of at most :data:`MAX_ASKS`.

        Error handling: ``MCPError`` when the client is gone, has too many questions waiting, goes
        before it answers, or answers something invalid.
        """
        if self.closed:
            raise MCPError(types.CONNECTION_CLOSED, "the calling client has disconnected")
        if len(self._asking) >= MAX_ASKS:
            raise MCPError(NOT_ANSWERABLE, f"the calling client has {MAX_ASKS} requests waiting already")
        scope = anyio.CancelScope()
        self._asking.add(scope)
        try:
            with scope:
                return await send()
        except ValidationError as exc:
            raise MCPError(
                types.INTERNAL_ERROR, f"the calling client's answer is invalid: {exc.errors()[:1]}"
            ) from None
        finally:
            self._asking.discard(scope)
        raise MCPError(types.CONNECTION_CLOSED, "the calling client disconnected before it answered")


class InFlight:
    """A connection's unanswered requests, at most *limit*: a slot each, freed once however it ends."""

    def __init__(self, limit: int) -> None:
        # fast_acquire: no loop round per request while slots are free; the reader still yields
        # in receive(), and blocks here once *limit* are unanswered.
        self._semaphore = anyio.Semaphore(limit, fast_acquire=True)
        self._pending: dict[RequestId, collections.deque[Slot]] = {}
        self._settled = anyio.Event()
        self.tracker: Tracker | None = None  # a handed-off client's: what connect answers if we die

    async def take(self) -> None:
        """One slot; back-pressure: wait for an answer to go out when none is free."""
        try:
            self._semaphore.acquire_nowait()  # while free: no task lookup (a getpid on 3.11), no loop round
        except anyio.WouldBlock:
            await self._semaphore.acquire()

    def __len__(self) -> int:
        """Requests unanswered now."""
        return sum(map(len, self._pending.values()))

    def holds(self, request_id: RequestId) -> bool:
        """Whether a request *request_id* is unanswered."""
        return request_id in self._pending

    def give_back(self) -> None:
        """A slot taken for a line that turned out not to be a request."""
        self._semaphore.release()

    def hold(self, request_id: RequestId, *, by_id: bool = True) -> Slot:
        """The slot just taken, now held by request *request_id* until :meth:`settle`. *by_id*
        False: settled by the slot alone, never by an answer naming the id (the fast path's:
        a client may reuse an id while the SDK answers another request under it)."""
        slot = Slot(self._semaphore, by_id=by_id)
        if self.tracker is not None:
            slot.token = self.tracker.hold(request_id)
        self._pending.setdefault(request_id, collections.deque()).append(slot)
        return slot

    def settle(self, request_id: RequestId, slot: Slot | None = None, *, answered: bool = True) -> None:
        """Free the slot of an answered (*slot* None: the oldest with this id settled by id) or
        unanswered request.

        *answered*: the client has its answer, or gave the request up; else (the connection
        ends first) a tracker still counts it in flight, for connect to fail.
        """
        waiting = self._pending.get(request_id)
        if not waiting:
            return
        if slot is None:
            slot = next((held for held in waiting if held.by_id), None)
            if slot is None:
                return  # none of this id is the SDK's
            waiting.remove(slot)
        elif slot in waiting:
            waiting.remove(slot)
        else:
            return  # settled already (a duplicate id's answer took it)
        if not waiting:
            del self._pending[request_id]
        if self.tracker is not None and answered:
            self.tracker.release(slot.token)
        slot.release()
        self._settled.set()

    def release_all(self) -> None:
        """The connection ends: every slot is free (a tracker keeps what was unanswered)."""
        for waiting in self._pending.values():
            for slot in waiting:
                slot.release()
        self._pending.clear()
        self._settled.set()

    async def answered(self, besides: Container[RequestId] = ()) -> None:
        """Wait until every request but *besides* is answered (the caller bounds the wait)."""
        while any(request_id not in besides for request_id in self._pending):
            self._settled = anyio.Event()
            await self._settled.wait()


class Tracker(Protocol):
    """Notes the requests in flight where they outlive the daemon (a handed-off client's journal)."""

    def hold(self, request_id: RequestId) -> object:
        """Note *request_id*; a token for :meth:`release`."""

    def release(self, token: object) -> None:
        """The request of *token* is answered or cancelled."""


class Slot:
    """One request's share of an :class:`InFlight`; released once, however it ends."""

    __slots__ = ("_released", "_semaphore", "by_id", "token")

    def __init__(self, semaphore: anyio.Semaphore, *, by_id: bool = True) -> None:
        self._semaphore, self._released = semaphore, False
        self.by_id = by_id  # settled by an answer naming its id (else by the slot only)
        self.token: object = None  # the tracker's, if any

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._semaphore.release()


_CURRENT: ContextVar[Session | None] = ContextVar("mcp_supervisor_session", default=None)


def bind(session: Session) -> None:
    """Make *session* the client of the requests served in the current task and the tasks it starts."""
    _CURRENT.set(session)


def connection_of(ctx: ServerRequestContext[Any]) -> Connection:
    """The SDK connection *ctx* came on. The SDK (2.3) has no public accessor: this reads its own."""
    return ctx.session._connection


def session_of(ctx: ServerRequestContext[Any]) -> Session:
    """The client of the request of *ctx*: the listener's Session on mcp.sock; over HTTP its MCP
    session's (made on first use, closed with the connection), or one for that request alone."""
    connection = connection_of(ctx)
    session: Session | None = connection.state.get(_KEY)
    if session is None:
        session = _CURRENT.get()
        if session is None:
            session = Session("http", lasting=connection.has_standalone_channel)
            connection.exit_stack.callback(session.close)
        connection.state[_KEY] = session
    if connection.has_standalone_channel:
        session.attach(connection)
    return session
