"""An extension's watcher: the one task that opens each run, serves it and ends it.

The methods of :class:`~supervisor.extension.supervised.Extension` that run in its watcher task.
Only they write the state (through ``_set``) and open or close a run; a run is spawn or connect
(after a start slot), handshake within ``start_timeout``, serve until the run ends or a stop
lands, then the restart policy decides. What differs by kind is the run's (:mod:`.run`).
"""

from __future__ import annotations

import functools
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup, TaskStatus

from supervisor.config.extension import RemoteConfig, StdioConfig
from supervisor.errors import SpawnError, first_line
from supervisor.extension import launch, liveness, startup
from supervisor.extension.backoff import Outcome, OutcomeKind
from supervisor.extension.childrun import open_child
from supervisor.extension.demand import tasks_working
from supervisor.extension.remoterun import open_remote
from supervisor.extension.run import Run
from supervisor.extension.state import State
from supervisor.extension.upstream import Upstream
from supervisor.upstream.listing import Listing

__all__ = ("Watcher",)

log = structlog.get_logger(__name__)

REFRESH_DELAY = 0.05  # a burst of list_changed from a child becomes one re-listing


class Watcher:
    """The watcher, as part of an Extension (its state: ``_scope``, ``_done``, ``_snapshot``, ...)."""

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
                if (head := self._head_start) is not None:  # a bug ended the watcher before its run
                    self._head_start = None
                    with anyio.CancelScope(shield=True):
                        await launch.discard(head)
                self._connection, self._listing = None, Listing()
                if self._spool is not None and not self._idled:  # no child left to refer to its files
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._spool.remove)
                final = State.FAILED if self._gave_up and not self._stop_requested else State.STOPPED
                if self._needs_login and not self._stop_requested:
                    final = State.NEEDS_LOGIN
                self._set(final, pid=None, run=None, next_restart=None)
                done.set()

    async def _run_once(self) -> bool:
        """Open a run of its kind, serve until it ends, tear it down. Returns whether to restart."""
        launched, self._head_start = self._head_start, None  # spawned by the daemon's head start
        self._last_stderr = None
        ticket: startup.Ticket | None = None
        if launched is not None:
            ticket, launched.ticket = launched.ticket, None  # it was launched in a start slot
            if launched.jail is not None and self.sandbox is not None:
                self.sandbox.took(launched.jail)  # its grants are the ones status shows
        try:
            if ticket is None:
                ticket = await self._take_slot()  # stop() lands here while queued
            async with self._open(launched) as run:
                try:
                    return await self._serve(run, ticket)
                finally:
                    if self._stop_requested:
                        self._set(State.STOPPING)  # the context's exit ends the run
        except SpawnError as exc:
            kind = OutcomeKind.PERMANENT if exc.permanent else OutcomeKind.CRASHED
            return self._decide(Outcome(kind, error=str(exc)))
        finally:
            if ticket is not None:
                ticket.release()

    def _open(self, launched: launch.Launched | None) -> AbstractAsyncContextManager[Run]:
        """A run of this extension's kind: a stdio child (*launched*: the head start's), or a
        connection to a remote server."""
        session: dict[str, Any] = {
            "on_list_changed": self._list_changed,
            "on_notification": self._notified,
            "on_asked": self._answer,
            "spool": self._spool,
        }
        config = self.config
        if isinstance(config, RemoteConfig):  # its log messages are what `logs` shows of it
            return open_remote(
                self.name,
                config,
                credentials=self._credentials,
                tokens=self.tokens,
                on_log=self._on_stderr,
                **session,
            )
        assert isinstance(config, StdioConfig)
        return open_child(
            self.name,
            config,
            launched,
            marker_prefix=self._marker_prefix,
            env=self._env,
            credentials=self._credentials,
            confinement=self.sandbox,
            last_stderr=lambda: self._last_stderr,
            on_stderr=self._on_stderr,
            hurry=self._hurry,
            **session,
        )

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

    async def _serve(self, run: Run, ticket: startup.Ticket) -> bool:
        connection = run.upstream
        self._set(State.STARTING, pid=run.pid, run=connection.run)
        try:
            listing = await self._handshake(run)
        except startup.StartTimeout as exc:
            return self._decide(Outcome(OutcomeKind.START_FAILED, error=self._timed_out(exc)))
        except Exception as exc:  # MCPError, a refused connection, a malformed initialize/tools result
            return self._decide(await run.start_failed(exc))
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
            self._start_guards(helpers, run)
            await connection.ended.wait()
            helpers.cancel_scope.cancel()
        self._connection = None
        return self._decide(run.ended(time.monotonic() - started))

    def _start_limit(self) -> tuple[float, str]:
        """The deadline of this start and its setting: ``first_start_timeout`` until a first handshake."""
        first = self.config.first_start_timeout
        if first is not None and not self._handshaken:
            return first, "first_start_timeout"
        return self.config.start_timeout, "start_timeout"

    async def _handshake(self, run: Run) -> Listing:
        """The handshake within the start's deadline; past it, on while the child's tree is busy.

        The deadline counts from here: a head start's child (spawned while the daemon was still
        loading) gets that time on top, and the daemon's own slowness never counts against it."""
        limit, setting = self._start_limit()

        def step(method: str) -> None:
            self._set(State.STARTING, waiting=method)

        def slow() -> None:
            self._slow = startup.slow_detail(limit)
            log.warning("extension.slow_start", setting=setting, limit=limit)
            self._notify()

        return await startup.within_start_limit(
            functools.partial(run.upstream.handshake, on_step=step),
            limit=limit,
            cpu_seconds=run.cpu_seconds,
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
            next_restart = _now() + timedelta(seconds=delay)
            self._set(State.BACKOFF, pid=None, run=None, next_restart=next_restart, **changes)
            return True
        self._ending = True
        self._gave_up = self.policy.gave_up(outcome, failures)
        self._needs_login = outcome.kind is OutcomeKind.NEEDS_LOGIN
        self._set(State.STOPPING, **changes)
        return False

    def _start_guards(self, helpers: TaskGroup, run: Run) -> None:
        """Liveness, and the kind's own (a child's memory_max), when set: each ends the run like
        a crash (see their modules)."""
        config, connection = self.config, run.upstream
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

        def exceeded(error: str) -> None:
            self._count("memory_exceeded")
            log.warning("extension.memory_exceeded", error=error)
            connection.end(error)

        run.guard(helpers, config, exceeded)

    async def _answer(
        self, connection: Upstream, request: types.ServerRequest
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

    async def _keep_listings_fresh(self, connection: Upstream) -> None:
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
                    log.warning("extension.listing_failed", kind=kind, error=first_line(exc, typed=False))
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


def _now() -> datetime:
    return datetime.now(UTC)
