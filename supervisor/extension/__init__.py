"""One supervised extension: its state machine, its watcher task, its calls.

The watcher task is the only writer of the state and the only task that opens and closes the
child's connection; everyone else reads :meth:`Extension.snapshot` and borrows the connection
for calls. Each lifetime (``start()`` to stopped or failed) has its own cancel scope and done
event, so any number of concurrent ``stop()`` calls share one teardown.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup, TaskStatus
from mcp import MCPError
from mcp.shared.dispatcher import ProgressFnT

from supervisor.child import connection as transport
from supervisor.child.spool import ExtensionSpool
from supervisor.config import secrets as secretrefs
from supervisor.errors import CallFailed, ExtensionUnavailable, SpawnError
from supervisor.extension import liveness, startup
from supervisor.extension.asking import Asking, Budget, Caller
from supervisor.extension.backoff import Backoff, Outcome, OutcomeKind, RestartPolicy
from supervisor.extension.demand import Demand, tasks_working
from supervisor.extension.pins import Pins
from supervisor.extension.state import ExitStatus, Listing, Snapshot, State, one_line
from supervisor.process import sandbox
from supervisor.process import usage as resources
from supervisor.process.children import ChildProcess

if TYPE_CHECKING:
    from supervisor.config.settings import ExtensionConfig

__all__ = ("Extension",)

log = structlog.get_logger(__name__)

ChangeHook = Callable[[Snapshot], None]
CallHook = Callable[[str, float, bool], None]  # tool, seconds, succeeded
NotificationHook = Callable[[str, types.ServerNotification, "Extension"], None]  # name, message, whose
ResultT = TypeVar("ResultT")

REFRESH_DELAY = 0.05  # a burst of list_changed from a child becomes one re-listing


def _policy_of(config: ExtensionConfig) -> RestartPolicy:
    b = config.backoff
    return RestartPolicy(
        mode=config.restart,
        backoff=Backoff(initial=b.initial, maximum=b.max, multiplier=b.multiplier, jitter=b.jitter),
        max_restarts=config.max_restarts,
        reset_after=b.reset_after,
    )


class Extension:
    """A stdio MCP server kept running according to its restart policy.

    Args:
        name: the extension's configured name.
        config: its settings; replaced only by building a new Extension.
        environ: the daemon's environment; ``config.env`` is merged over it.
        marker_prefix: identifies this daemon's children (see :mod:`supervisor.process.children`).
        on_change: called with each new snapshot (sync, must not block).
        hurry: once set, teardowns skip their graces (the daemon's forced shutdown).
        spool: where oversized media in results goes; emptied when the watcher ends.
        on_call: called after each call with the tool, its duration and whether it succeeded.
        on_notification: called with the child's log messages and resource updates (sync).
        demand: its on-demand start, saved listing and idle timer (``on_demand``, ``idle_stop``).
        pins: its pinned tool definitions (shared with its per-client instances).
        start_slots: the daemon's start slots, taken by each start (None: start at once).
        sandbox_context: the daemon's layout for the sandbox (what to hide); None: only the
            environment's (see :mod:`supervisor.process.sandbox`).
    """

    def __init__(
        self,
        name: str,
        config: ExtensionConfig,
        *,
        environ: Mapping[str, str],
        marker_prefix: str,
        on_change: ChangeHook | None = None,
        hurry: anyio.Event | None = None,
        spool: ExtensionSpool | None = None,
        on_call: CallHook | None = None,
        on_notification: NotificationHook | None = None,
        demand: Demand | None = None,
        pins: Pins | None = None,
        start_slots: startup.StartSlots | None = None,
        sandbox_context: sandbox.Context | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.policy = _policy_of(config)
        # A secret's value is a reference until the spawn. The daemon's credentials directory is
        # its own: a child gets what its env names, not the way to read every other credential.
        inherited = {k: v for k, v in environ.items() if k != secretrefs.CREDENTIALS}
        self._env = {**inherited, **config.env}
        self._credentials = environ.get(secretrefs.CREDENTIALS)  # the daemon's, for ${credential:NAME}
        self.pins = pins
        self._marker_prefix = marker_prefix
        self._on_change = on_change
        self._hurry = hurry
        self._spool = spool
        if spool is not None:  # a rewrite of structured output must keep it valid for its schema
            spool.schemas.follow(lambda: self._listing.tools)
        self._on_call = on_call
        self._on_notification = on_notification
        self.calls = 0  # tool calls asked of this extension
        self.errors = 0  # of those, the ones without a result, or with isError
        self._snapshot = Snapshot(name=name, state=State.STOPPED, since=_now())
        self._changed = anyio.Event()
        self._stderr: deque[str] = deque(maxlen=config.log_lines)
        self._last_stderr: str | None = None  # this run's last line, raw; made safe when read
        self._listing = Listing()  # what the running child offers
        self._stale: set[str] = set()  # listings the child said changed, not yet fetched again
        self._stale_event = anyio.Event()
        self._connection: transport.Connection | None = None
        self._in_flight = 0
        self._asking = Asking(name, config.roots)  # who the child's sampling/elicitation/roots go to
        self._answered_at = 0.0  # when the child last answered a call or reported progress (liveness)
        self._asked = 0  # the child's requests we are answering: it waits on us, so it is alive
        self._restarting = 0  # restart() calls in progress: calls wait through their stop phase
        self._launching = False  # the daemon starts it shortly (autostart, a reload): calls wait
        self._cut: tuple[transport.Connection | None, str] = (None, "")  # the connection a stop cut, and how
        # One lifetime: set by start(), ended by the watcher.
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None
        self._stop_requested = False
        self._ending = False  # the watcher decided to end on its own (gave up, clean exit)
        self._gave_up = False
        self._restart_at = 0.0
        self._demand = demand
        self._armed = config.on_demand and demand is not None  # a call may start it (see dormant)
        self._idled = False  # this lifetime ended by the idle timer: its spool stays
        self._slots = start_slots
        self._ticket: startup.Ticket | None = None  # while waiting for a start slot
        self._slow: str | None = None  # while a start is past its deadline but busy: says so
        self._handshaken = False  # a run completed its handshake (ends first_start_timeout)
        self.sandbox = sandbox.sandbox_for(name, config, sandbox_context or sandbox.Context(environ))

    # ---- reading -------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        last = self._last_stderr
        queued = self._slots.position(self._ticket) if self._slots and self._ticket else None
        detail = "on demand" if self.dormant and self._snapshot.state is State.STOPPED else None
        if self._snapshot.state is State.STARTING:
            detail = "queued for a start slot" if queued else self._slow
        return replace(
            self._snapshot,
            tools=len(self.listing().tools),
            in_flight=self._in_flight,
            last_stderr=one_line(last) if last is not None else None,
            detail=detail,
            queued=queued,
            sandbox=self.sandbox.describe(self.config.command) if self.sandbox else {"mode": "off"},
        )

    @property
    def run_marker(self) -> str | None:
        """The marker of the running child's tree (None until it runs): tells this run's processes
        from those of another instance of the same extension."""
        return self._connection.child.marker if self._connection is not None else None

    @property
    def dormant(self) -> bool:
        """Not running, and the next call starts it (``on_demand``, or stopped by ``idle_stop``)."""
        return self._armed and self._snapshot.state in (State.STOPPING, State.STOPPED, State.FAILED)

    def tools(self) -> list[types.Tool]:
        """The running child's tools (a dormant one's saved tools); a copy the caller may change."""
        return [tool.model_copy(deep=True) for tool in self.listing().tools]

    def listing(self) -> Listing:
        """What the running child offers (dormant: the saved listing). Shared: do not change it."""
        if self._demand is None or not self._demand.stands_in:
            return self._listing
        if self.dormant:
            return self._demand.saved or Listing()
        if self._snapshot.state.is_transient and self._demand.saved is not None:  # a call is starting it
            return self._demand.saved
        return self._listing

    def offered(self) -> Listing:
        """:meth:`listing` as gateway clients see it: without the tools ``tools_on_change: hold`` holds."""
        listing = self.listing()
        return self.pins.shown(listing) if self.pins is not None else listing

    def known_listing(self) -> Listing:
        """What its gateway names are kept for while it does not run, as clients would see it
        (held tools left out): its current or last run's listing, else the saved one (an earlier
        daemon's too). Shared."""
        known = self._listing  # kept in backoff; emptied once the watcher ends
        if not (known.tools or known.prompts) and self._demand is not None and self._demand.saved is not None:
            known = self._demand.saved
        return self.pins.shown(known) if self.pins is not None else known

    @property
    def on_the_way(self) -> bool:
        """Not running now, but a call would wait for it: starting, in backoff, or in a restart."""
        state = self._snapshot.state
        if state is State.RUNNING:
            return self._stop_requested and self._restarting > 0
        coming = self._restarting > 0 or self._launching
        return state.is_transient or (coming and state in (State.STOPPING, State.STOPPED))

    def needs_listing(self) -> bool:
        """An on-demand extension with no saved listing: one run at daemon start learns it."""
        return self._armed and self._demand is not None and self._demand.saved is None

    @property
    def stderr_lines(self) -> int:
        """How many lines the stderr ring holds now (at most ``log_lines``)."""
        return len(self._stderr)

    def logs(self, lines: int) -> list[str]:
        """The last *lines* lines the child wrote to stderr (bounded by ``log_lines``)."""
        return list(self._stderr)[-lines:] if lines > 0 else []

    async def wait_for(self, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        """Return the first snapshot, current or future, that satisfies *predicate*."""
        while True:
            changed = self._changed
            snapshot = self.snapshot()
            if predicate(snapshot):
                return snapshot
            await changed.wait()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self, tg: TaskGroup, *, learn: bool = False) -> None:
        """Run a watcher in the daemon's long-lived *tg*, unless one is live. Returns at once.

        A stopped or failed extension starts afresh with a new failure budget. A start while a
        stop is in progress, or while the watcher is ending on its own (it gave up, or the
        child exited cleanly), waits for that ending to finish, then starts. *learn*: the run
        is only to learn the listing; once idle it stops, even without ``idle_stop``.
        """
        self._launching = False  # from here its state says what a call waits for
        while self._done is not None and not self._done.is_set():
            if not (self._stop_requested or self._ending):
                return
            await self._done.wait()
        # No await between the check above and these assignments: one watcher per lifetime.
        self._scope, self._done = anyio.CancelScope(), anyio.Event()
        self._stop_requested = self._ending = self._gave_up = self._idled = False
        self._armed = self.config.on_demand and self._demand is not None
        if self._demand is not None:
            self._demand.learning = learn
        await tg.start(self._watch)

    def expect_start(self) -> None:
        """The daemon is about to start it (autostart, a reload): a call meanwhile waits as for a start."""
        self._launching = True

    def request_stop(self) -> None:
        """Ask the watcher to stop, without waiting for it. Idempotent. Calls no longer start it."""
        self._armed = self._launching = False
        self._end()

    def _stop_idle(self) -> None:
        """The idle timer's stop: the next call starts it again; its spool's links stay valid."""
        self._armed = self._idled = True
        self._end()

    def _end(self) -> None:
        if self._done is None or self._done.is_set():
            return
        assert self._scope is not None
        self._stop_requested = True
        # Before the cancel: it fails the calls in flight at once, and they say why.
        self._cut = (self._connection, "was restarted" if self._restarting else "was stopped")
        self._scope.cancel()  # lands in the handshake, the running wait or the backoff sleep

    async def stop(self) -> None:
        """Return once the child's process tree is gone. Idempotent; safe to call concurrently."""
        self.request_stop()
        if self._done is not None:
            await self._done.wait()

    async def restart(self, tg: TaskGroup) -> None:
        self._restarting += 1
        try:
            await self.stop()
            await self.start(tg)
        finally:
            self._restarting -= 1

    # ---- calls ---------------------------------------------------------------------------

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> types.CallToolResult:
        """Forward one call; wait for running (if on the way) and answer within ``call_timeout``.

        ``call_timeout`` is an inactivity budget: each progress notification from the child
        renews it, up to ``call_timeout_max`` in all. *progress* receives them. What the child
        asks its client meanwhile goes to *caller* (see :mod:`supervisor.extension.asking`).

        Error handling: :class:`ExtensionUnavailable` when not running in time (``retryable``
        while starting or in backoff), :class:`CallFailed` when the call itself fails.
        """

        async def call(connection: transport.Connection, progress: ProgressFnT) -> types.CallToolResult:
            return await connection.call_tool(tool, arguments, progress=progress)

        return await self._call(tool, call, progress, lambda result: not result.is_error, caller)

    async def call_tool_raw(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> dict[str, Any]:
        """:meth:`call_tool` for the gateway's fast path: the child's result as plain JSON.

        Media in it went to the spool as usual; nothing else was checked beyond its shape
        (see :mod:`supervisor.child.rawcalls`). Errors as :meth:`call_tool`.
        """

        async def call(connection: transport.Connection, progress: ProgressFnT) -> dict[str, Any]:
            return await connection.call_tool_raw(tool, arguments, progress=progress)

        return await self._call(
            tool, call, progress, lambda result: result.get("isError") is not True, caller
        )

    async def _call(
        self,
        tool: str,
        send: Callable[[transport.Connection, ProgressFnT], Awaitable[ResultT]],
        progress: ProgressFnT | None,
        succeeded: Callable[[ResultT], bool],
        caller: Caller | None,
    ) -> ResultT:
        """One tool call with its bookkeeping: counts, errors, the metrics hook."""
        started, ok = time.monotonic(), False
        self.calls += 1
        try:

            async def call(connection: transport.Connection, progress: ProgressFnT) -> ResultT:
                if tool not in self._listing.tool_names:
                    unknown = f"extension {self.name!r} has no tool {tool!r}"
                    raise CallFailed(unknown, code=types.INVALID_PARAMS)
                return await send(connection, progress)

            result = await self._forward(f"tool {tool!r}", call, progress, caller)
            ok = succeeded(result)
            return result
        finally:
            if not ok:
                self.errors += 1
            if self._on_call is not None:
                label = tool if tool in self._listing.tool_names else "(unknown)"
                self._on_call(label, time.monotonic() - started, ok)

    async def request(
        self,
        request: types.ClientRequest,
        result_type: type[ResultT],
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> ResultT:
        """Forward any other client request (prompts/get, resources/read, ...) like a call."""

        async def send(connection: transport.Connection, progress: ProgressFnT) -> ResultT:
            return await connection.request(request, result_type, progress=progress)

        return await self._forward(repr(request.method), send, progress, caller)

    async def request_raw(
        self,
        method: str,
        params: dict[str, Any],
        *,
        run: str | None = None,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
        blocking: bool = False,
        touch: bool = True,
    ) -> tuple[dict[str, Any], str]:
        """Forward any request as plain JSON (see :meth:`transport.Connection.request_raw`);
        returns the child's result and the :attr:`run_marker` of the run that answered.

        With *run* (a :attr:`run_marker`), only that run of the child may answer: another one
        fails with :class:`CallFailed` (``INVALID_PARAMS``) saying the extension restarted.
        *blocking*: the request waits for work done elsewhere (``tasks/result``), so only
        ``call_timeout_max`` bounds it. *touch* False: it does not renew ``idle_stop``'s period.
        """

        async def send(connection: transport.Connection, progress: ProgressFnT) -> tuple[dict[str, Any], str]:
            marker = connection.child.marker
            if run is not None and marker != run:
                message = f"extension {self.name!r} restarted since; the request was for its earlier run"
                raise CallFailed(message, code=types.INVALID_PARAMS)
            return await connection.request_raw(method, params, progress=progress), marker

        return await self._forward(repr(method), send, progress, caller, blocking=blocking, touch=touch)

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What the running child declared at ``initialize`` (None while it does not run)."""
        return self._connection.capabilities if self._connection is not None else None

    async def roots_changed(self, client: object) -> None:
        """A client's roots changed: tell the child if its roots came from that client."""
        await self._asking.roots_changed(client)

    async def _forward(
        self,
        what: str,
        send: Callable[[transport.Connection, ProgressFnT], Awaitable[ResultT]],
        progress: ProgressFnT | None,
        caller: Caller | None,
        *,
        blocking: bool = False,
        touch: bool = True,
    ) -> ResultT:
        timeout, cap = self.config.call_timeout, self.config.call_timeout_max
        started = time.monotonic()
        connection: transport.Connection | None = None
        demand = self._demand if touch else None  # a tasks/list poll must not keep it alive
        if demand is not None:
            demand.touch()
        with anyio.CancelScope() as scope:
            budget = Budget(scope, timeout, cap)
            if blocking:
                budget.hold()  # never released: nothing renews it (the task's progress goes elsewhere)

            async def renew(value: float, total: float | None, message: str | None) -> None:
                budget.renew()
                self._answered_at = time.monotonic()
                if progress is not None:
                    await progress(value, total, message)

            connection = await self._wait_connection()
            self._in_flight += 1
            try:
                with self._asking.call(connection, caller, budget):
                    result = await send(connection, renew)
                self._answered_at = time.monotonic()
                return result
            except MCPError as exc:
                self._answered_at = time.monotonic()
                raise self._call_failed(what, exc, connection) from None
            except CallFailed:
                raise
            except Exception as exc:  # a malformed result: ValidationError, output schema RuntimeError
                log.warning("extension.bad_result", request=what, error=_first_line(exc))
                raise CallFailed(f"extension {self.name!r} returned an invalid result for {what}") from None
            finally:
                self._in_flight -= 1
                if demand is not None:
                    demand.touch()
        if connection is None:
            state = self._snapshot.state
            raise ExtensionUnavailable(
                self.name, state.value, retryable=True, detail=f"not running after {timeout:g}s"
            )
        if time.monotonic() - started >= cap:
            detail = f"did not finish within call_timeout_max ({cap:g}s)"
        else:
            detail = f"did not answer within {timeout:g}s"  # nor report progress
        raise CallFailed(f"{what} of {self.name!r} {detail}", code=types.REQUEST_TIMEOUT)

    async def _wait_connection(self) -> transport.Connection:
        started = False
        while True:
            changed = self._changed
            state = self._snapshot.state
            if state is State.RUNNING and self._connection is not None and not self._stop_requested:
                return self._connection
            if self.dormant and state is not State.STOPPING and not started and self._demand is not None:
                started = True  # one try per call; fifty callers share one spawn (start() is idempotent)
                await self._demand.start(self)
                continue
            on_the_way = state.is_transient or state is State.RUNNING  # RUNNING: just crashed, or stopping
            on_the_way = on_the_way or (self.dormant and state is State.STOPPING)  # idle stop, then a start
            restarting = (self._restarting or self._launching) and state in (State.STOPPING, State.STOPPED)
            if not (on_the_way or restarting):
                raise ExtensionUnavailable(
                    self.name,
                    state.value,
                    retryable=False,
                    detail=self._snapshot.last_error,
                    advice=f"start it with `mcp-supervisor start {self.name}`",
                )
            await changed.wait()

    def _call_failed(self, what: str, exc: MCPError, connection: transport.Connection) -> CallFailed:
        # Only a connection that ended (or that a stop cut) is ours to report: -32000 is also the
        # code many servers give their own errors ("database is locked"), from a live child.
        ours = connection.ended.is_set() or self._cut[0] is connection
        if exc.code == types.CONNECTION_CLOSED and ours:
            failure = connection.failure
            ended = f"failed ({failure})" if failure else "exited"
            ended = self._cut[1] if self._cut[0] is connection else ended
            message = f"extension {self.name!r} {ended} during the call to {what}; it may or may not have run"
            return CallFailed(message, code=exc.code)
        return CallFailed(f"{self.name}: {exc.message}", code=exc.code, data=exc.error.data, from_child=True)

    # ---- the watcher ---------------------------------------------------------------------

    async def _watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        assert self._scope is not None and self._done is not None
        done = self._done
        with self._scope, structlog.contextvars.bound_contextvars(extension=self.name):
            try:
                self._set(State.STARTING, failures=0, last_error=None, next_restart=None)
                task_status.started()
                while await self._run_once():
                    await anyio.sleep(max(0.0, self._restart_at - time.monotonic()))  # stop() lands here
                    self._set(State.STARTING, restarts=self._snapshot.restarts + 1, next_restart=None)
            except Exception as exc:  # a bug of ours: fail this extension, keep the daemon
                log.exception("extension.watcher_crashed")
                self._gave_up = self._ending = True
                self._snapshot = replace(self._snapshot, last_error=f"internal error: {exc}")
            finally:
                self._connection, self._listing = None, Listing()
                if self._spool is not None and not self._idled:  # no child left to refer to its files
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._spool.remove)
                final = State.FAILED if self._gave_up and not self._stop_requested else State.STOPPED
                self._set(final, pid=None, next_restart=None)
                done.set()

    async def _run_once(self) -> bool:
        """Start the child, serve until it ends, tear it down. Returns whether to restart."""
        # Fixed-length and unique, so no run's marker is a prefix of another's (:1 vs :12).
        marker = f"{self._marker_prefix}{self.name}:{secrets.token_hex(6)}"
        self._last_stderr = None
        ticket = await self._take_slot()  # stop() lands here while queued: nothing to tear down
        try:
            env = await secretrefs.resolve(self._env, self._credentials)  # a missing secret: permanent
            async with (
                self._confined() as jail,
                transport.connect(
                    [self.config.command, *self.config.args],
                    wrap=jail.wrap if jail is not None else None,
                    env=env,
                    cwd=self.config.cwd,
                    marker=marker,
                    stop_timeout=self.config.stop_timeout,
                    max_message_bytes=self.config.max_message_bytes,
                    on_stderr=self._on_stderr,
                    on_list_changed=self._list_changed,
                    on_notification=self._notified,
                    on_asked=self._answer,
                    hurry=self._hurry,
                    spool=self._spool,
                    stdin_timeout=self.config.call_timeout,  # by then every call queued behind has timed out
                ) as connection,
            ):
                try:
                    return await self._serve(connection, ticket)
                finally:
                    if self._stop_requested:
                        self._set(State.STOPPING)  # the context's exit tears the tree down
        except SpawnError as exc:
            kind = OutcomeKind.PERMANENT if exc.permanent else OutcomeKind.CRASHED
            return self._decide(Outcome(kind, error=str(exc)))
        finally:
            ticket.release()

    async def _take_slot(self) -> startup.Ticket:
        """One of the daemon's start slots, in arrival order; ``status`` shows ``queued`` meanwhile."""
        if self._slots is None:
            return startup.Ticket(None)
        ticket = self._ticket = self._slots.ticket()
        try:
            waited = await self._slots.acquire(ticket)
        finally:
            self._ticket = None
        if waited:
            log.info("extension.start_slot", waited=round(waited, 3))
            self._set(State.STARTING, since=_now())  # start_timeout and the shown wait count from here
        return ticket

    @contextlib.asynccontextmanager
    async def _confined(self) -> AsyncIterator[sandbox.Run | None]:
        """This run's sandbox (its private temporary directory), removed once the run is over."""
        if self.sandbox is None:
            yield None
            return
        run = await self.sandbox.prepare()  # SpawnError: permanent, says why and how to opt out
        try:
            yield run
        finally:
            await run.remove()

    async def _serve(self, connection: transport.Connection, ticket: startup.Ticket) -> bool:
        child = connection.child
        self._set(State.STARTING, pid=child.pid)
        try:
            listing = await self._handshake(connection)
        except startup.StartTimeout as exc:
            return self._decide(Outcome(OutcomeKind.START_FAILED, error=self._timed_out(exc)))
        except Exception as exc:  # MCPError, or a malformed initialize/tools result
            if connection.ended.is_set() or isinstance(exc, MCPError):
                with anyio.move_on_after(transport.EXIT_FLUSH_GRACE):
                    await child.exited.wait()  # an exit during startup explains the failure best
            exit_status = _exit_status(child)
            error = f"{exit_status.describe()} during startup" if exit_status else _first_line(exc)
            return self._decide(Outcome(OutcomeKind.START_FAILED, error=error, exit=exit_status))
        finally:
            ticket.release()
            self._slow = None
        self._handshaken = True
        if self._demand is not None:  # the gateway compares listings by identity
            listing = self._demand.same(listing)
        if self.pins is not None:  # before any client sees them: a held tool is never offered
            self.pins.observe(listing.tools)
            await self.pins.save()
        self._listing, self._connection = listing, connection
        started = time.monotonic()
        self._set(State.RUNNING, last_error=None)
        async with anyio.create_task_group() as helpers:  # owned by this run: gone before teardown
            helpers.start_soon(self._keep_listings_fresh, connection)
            if self._demand is not None:  # saves the listing, then stops the child once idle
                working = functools.partial(tasks_working, connection)  # a task in it holds it too
                in_flight = lambda: self._in_flight  # noqa: E731
                helpers.start_soon(self._demand.serve, listing, in_flight, self._stop_idle, working)
            self._answered_at = started
            self._start_guards(helpers, connection)
            await connection.ended.wait()
            helpers.cancel_scope.cancel()
        self._connection = None
        uptime = time.monotonic() - started
        if child.returncode is None:  # stdio broke or a message was too large: it gets killed
            return self._decide(Outcome(OutcomeKind.CRASHED, uptime, error=connection.failure))
        exit_status = _exit_status(child)
        assert exit_status is not None
        if child.returncode == 0:
            return self._decide(Outcome(OutcomeKind.CLEAN_EXIT, uptime, exit=exit_status))
        crashed = Outcome(OutcomeKind.CRASHED, uptime, error=exit_status.describe(), exit=exit_status)
        return self._decide(crashed)

    def _start_limit(self) -> tuple[float, str]:
        """The deadline of this start and its setting: ``first_start_timeout`` until a first handshake."""
        first = self.config.first_start_timeout
        if first is not None and not self._handshaken:
            return first, "first_start_timeout"
        return self.config.start_timeout, "start_timeout"

    async def _handshake(self, connection: transport.Connection) -> Listing:
        """The handshake within the start's deadline; past it, on while the child's tree is busy."""
        child = connection.child
        limit, setting = self._start_limit()

        def step(method: str) -> None:
            self._set(State.STARTING, waiting=method)

        def slow() -> None:
            self._slow = startup.slow_detail(limit)
            log.warning("extension.slow_start", setting=setting, limit=limit)
            self._notify()

        return await startup.within_start_limit(
            functools.partial(connection.handshake, on_step=step),
            limit=limit,
            cpu_seconds=functools.partial(startup.tree_cpu, child.pid, child.marker, child.cgroup),
            on_slow=slow,
        )

    def _timed_out(self, exc: startup.StartTimeout) -> str:
        limit, setting = self._start_limit()
        return startup.timeout_error(exc, limit, setting, self._snapshot.waiting or "initialize")

    def _decide(self, outcome: Outcome) -> bool:
        """Record how the run ended and what comes next; called before the tree is torn down."""
        failures = self.policy.next_failures(outcome, self._snapshot.failures)
        changes: dict[str, Any] = {"failures": failures}
        if outcome.exit is not None:
            changes["last_exit"] = outcome.exit
        if outcome.error is not None:
            changes["last_error"] = outcome.error
        level = log.info if outcome.kind is OutcomeKind.CLEAN_EXIT else log.warning
        level(
            "extension.exited",
            kind=outcome.kind.value,
            uptime=round(outcome.uptime, 3),
            error=outcome.error,
            returncode=outcome.exit.returncode if outcome.exit else None,
        )
        if self.policy.should_restart(outcome, failures):
            delay = self.policy.backoff.delay(failures)
            self._restart_at = time.monotonic() + delay
            self._set(State.BACKOFF, pid=None, next_restart=_now() + timedelta(seconds=delay), **changes)
            return True
        self._ending = True
        self._gave_up = self.policy.gave_up(outcome, failures)
        self._set(State.STOPPING, **changes)
        return False

    def _start_guards(self, helpers: TaskGroup, connection: transport.Connection) -> None:
        """Liveness and memory_max, when set: each ends the connection like a crash (see their modules)."""
        config, child = self.config, connection.child
        if config.ping_interval is not None:
            watch = functools.partial(
                liveness.watch,
                connection,
                interval=config.ping_interval,
                ping_timeout=config.ping_timeout,
                in_flight=lambda: self._in_flight,
                answered_at=lambda: time.monotonic() if self._asked else self._answered_at,
                on_unresponsive=lambda error: self._count("unresponsive"),
            )
            helpers.start_soon(watch)
        if config.memory_max is not None:

            def exceeded(error: str) -> None:
                self._count("memory_exceeded")
                log.warning("extension.memory_exceeded", error=error)
                connection.end(error)

            limit = config.memory_max
            helpers.start_soon(
                resources.enforce_memory_max, child.pid, child.marker, child.cgroup, limit, exceeded
            )

    async def _answer(
        self, connection: transport.Connection, request: types.ServerRequest
    ) -> types.ClientResult | types.ErrorData:
        """Answer the child's sampling/elicitation/roots request (a client may take minutes)."""
        self._asked += 1
        try:
            return await self._asking.answer(connection, request)
        finally:
            self._asked -= 1
            self._answered_at = time.monotonic()

    def _count(self, counter: str) -> None:
        """One more run ended by a guard; before the end, so the exit's snapshot carries it."""
        self._snapshot = replace(self._snapshot, **{counter: getattr(self._snapshot, counter) + 1})

    def _list_changed(self, kind: str) -> None:
        self._stale.add(kind)
        if kind == "resources":
            self._stale.add("templates")
        self._stale_event.set()

    def _notified(self, notification: types.ServerNotification) -> None:
        if self._on_notification is not None:
            self._on_notification(self.name, notification, self)

    async def _keep_listings_fresh(self, connection: transport.Connection) -> None:
        """Re-list what the child says changed: one listing in flight, a burst coalesced."""
        while True:
            await self._stale_event.wait()
            await anyio.sleep(REFRESH_DELAY)
            kinds, self._stale, self._stale_event = self._stale, set(), anyio.Event()
            fresh: dict[str, list[Any]] = {}
            for kind in sorted(kinds):
                try:
                    with anyio.fail_after(self.config.start_timeout):
                        fresh[kind] = await connection.list(kind)
                except Exception as exc:  # TimeoutError, MCPError, a malformed listing: keep the old one
                    log.warning("extension.listing_failed", kind=kind, error=_first_line(exc))
            if fresh and connection is self._connection:
                if self.pins is not None and "tools" in fresh:
                    self.pins.observe(fresh["tools"])
                old = self._listing
                current = {"tools": old.tools, "prompts": old.prompts, "resources": old.resources}
                self._listing = Listing.of(**{**current, "templates": old.templates, **fresh})
                log.info("extension.listing_changed", **{kind: len(items) for kind, items in fresh.items()})
                self._notify()
                if self._demand is not None:
                    await self._demand.save(self._listing)
                if self.pins is not None:
                    await self.pins.save()

    def _on_stderr(self, line: str) -> None:
        self._stderr.append(line)
        self._last_stderr = line
        log.info("extension.stderr", line=line)

    def _set(self, state: State, **changes: Any) -> None:
        previous = self._snapshot
        since = changes.pop("since", None) or (previous.since if state is previous.state else _now())
        if state is not State.STARTING:
            changes["waiting"] = None
        self._snapshot = replace(previous, state=state, since=since, **changes)
        if state is not previous.state:
            log.info(
                "extension.state",
                state=state.value,
                previous=previous.state.value,
                pid=self._snapshot.pid,
                error=self._snapshot.last_error,
            )
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        if self._on_change is not None:
            self._on_change(self.snapshot())


def _exit_status(child: ChildProcess) -> ExitStatus | None:
    if child.returncode is None:
        return None
    return ExitStatus(child.returncode, at=child.exited_at or _now())


def _now() -> datetime:
    return datetime.now(UTC)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]
