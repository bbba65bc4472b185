"""One supervised extension: its state, its lifetimes, what it offers; its watcher and calls mixed in.

The watcher task is the only writer of the state and the only task that opens and closes the
child's connection; everyone else reads :meth:`Extension.snapshot` and borrows the connection
for calls. Each lifetime (``start()`` to stopped or failed) has its own cancel scope and done
event, so any number of concurrent ``stop()`` calls share one teardown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup

from supervisor.config.extension import RemoteConfig, StdioConfig
from supervisor.extension import launch, startup
from supervisor.extension.asking import Asking
from supervisor.extension.backoff import Backoff, RestartPolicy
from supervisor.extension.calls import Calls
from supervisor.extension.demand import Demand
from supervisor.extension.pins import Pins
from supervisor.extension.state import Snapshot, State, one_line
from supervisor.extension.upstream import Upstream
from supervisor.extension.watcher import Watcher
from supervisor.process import sandbox
from supervisor.upstream.listing import Listing
from supervisor.upstream.spool import ExtensionSpool

if TYPE_CHECKING:
    from supervisor.config.extension import ExtensionConfig
    from supervisor.remote.tokens import TokenStore

__all__ = ("Extension",)

log = structlog.get_logger(__name__)

ChangeHook = Callable[[Snapshot], None]
CallHook = Callable[[str, float, bool], None]  # tool, seconds, succeeded
NotificationHook = Callable[[str, types.ServerNotification, "Extension"], None]  # name, message, whose
ResultT = TypeVar("ResultT")


def _policy_of(config: ExtensionConfig) -> RestartPolicy:
    b = config.backoff
    return RestartPolicy(
        mode=config.restart,
        backoff=Backoff(initial=b.initial, maximum=b.max, multiplier=b.multiplier, jitter=b.jitter),
        max_restarts=config.max_restarts,
        reset_after=b.reset_after,
    )


class Extension(Calls, Watcher):
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
        tokens: TokenStore | None = None,
        login: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.tokens = tokens  # a remote server's OAuth login (see supervisor.remote.auth)
        self._login = login  # starts (or joins) that login: its authorization URL, for a client to open
        self.policy = _policy_of(config)
        self._env, self._credentials = launch.environment(environ, config)  # secrets filled at each run
        self._head_start: launch.Launched | None = None  # a first run the daemon spawned for it
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
        self._connection: Upstream | None = None
        self._in_flight = 0
        self._asking = Asking(name, config.roots)  # who the child's sampling/elicitation/roots go to
        self._answered_at = 0.0  # when the child last answered a call or reported progress (liveness)
        self._asked = 0  # the child's requests we are answering: it waits on us, so it is alive
        self._restarting = 0  # restart() calls in progress: calls wait through their stop phase
        self._launching = False  # the daemon starts it shortly (autostart, a reload): calls wait
        self._cut: tuple[Upstream | None, str] = (None, "")  # the connection a stop cut, and how
        # One lifetime: set by start(), ended by the watcher.
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None
        self._stop_requested = False
        self._ending = False  # the watcher decided to end on its own (gave up, clean exit)
        self._gave_up = False
        self._needs_login = False  # the last run ended waiting for a person to log in (remote)
        self._restart_at = 0.0
        self._demand = demand
        self._armed = config.on_demand and demand is not None  # a call may start it (see dormant)
        self._idled = False  # this lifetime ended by the idle timer: its spool stays
        self._slots = start_slots
        self._ticket: startup.Ticket | None = None  # while waiting for a start slot
        self._slow: str | None = None  # while a start is past its deadline but busy: says so
        self._handshaken = False  # a run completed its handshake (ends first_start_timeout)
        self.sandbox = (
            sandbox.sandbox_for(name, config, sandbox_context or sandbox.Context(environ))
            if isinstance(config, StdioConfig)
            else None  # a remote server runs nothing here
        )

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
            sandbox=self._sandbox_described(),
            remote=self._remote_described(),
        )

    @property
    def credentials_dir(self) -> str | None:
        """Where its ``${credential:NAME}`` references are read (``$CREDENTIALS_DIRECTORY``)."""
        return self._credentials

    @property
    def run_id(self) -> str | None:
        """The running run's id (None until one runs): a request meant for one run is refused by the next."""
        return self._connection.run if self._connection is not None else None

    @property
    def run_marker(self) -> str | None:
        """The marker of the running child's tree (None until it runs, and for a remote server):
        tells this run's processes from those of another instance of the same extension."""
        child = getattr(self._connection, "child", None)
        return child.marker if child is not None else None

    def _remote_described(self) -> dict[str, Any] | None:
        if not isinstance(self.config, RemoteConfig):
            return None
        described = getattr(self._connection, "described", None)  # a RemoteConnection's, while it runs
        record = {"url": self.config.url, **(described() if described is not None else {})}
        login = self.tokens.shown() if self.tokens is not None else None
        return record if login is None else {**record, "login": login.as_dict()}

    def _sandbox_described(self) -> dict[str, Any]:
        if isinstance(self.config, RemoteConfig):
            return {"mode": "remote"}  # nothing of it runs here to confine
        if self.sandbox is None:
            return {"mode": "off"}
        assert isinstance(self.config, StdioConfig)
        return self.sandbox.describe(self.config.command, starting=self._snapshot.state is State.STARTING)

    @property
    def state(self) -> State:
        """Its state now: what :meth:`snapshot` would say, without making one (which describes
        its sandbox and counts its tools)."""
        return self._snapshot.state

    @property
    def dormant(self) -> bool:
        """Not running, and the next call starts it (``on_demand``, or stopped by ``idle_stop``)."""
        return self._armed and self._snapshot.state in (State.STOPPING, State.STOPPED, State.FAILED)

    def tools(self) -> list[types.Tool]:
        """The running child's tools (a dormant one's saved tools); a copy the caller may change."""
        return [tool.model_copy(deep=True) for tool in self.listing().tools]

    def listing(self) -> Listing:
        """What the running child offers (dormant, or waiting for a login: the saved listing).
        Shared: do not change it."""
        if self._demand is not None and self._snapshot.state is State.NEEDS_LOGIN:
            return self._demand.saved or Listing()  # a call asks for the login (URL elicitation)
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

    async def start(
        self, tg: TaskGroup, *, learn: bool = False, head_start: launch.Launched | None = None
    ) -> None:
        """Run a watcher in the daemon's long-lived *tg*, unless one is live. Returns at once.

        A stopped or failed extension starts afresh with a new failure budget. A start while a
        stop is in progress, or while the watcher is ending on its own (it gave up, or the
        child exited cleanly), waits for that ending to finish, then starts. *learn*: the run
        is only to learn the listing; once idle it stops, even without ``idle_stop``.
        *head_start*: a run the daemon already launched for it (:mod:`supervisor.daemon.headstart`),
        served as the first run instead of spawning; ended here if a watcher is live.
        """
        while self._done is not None and not self._done.is_set():
            if not (self._stop_requested or self._ending):
                self._launching = False  # a live watcher's state says what a call waits for
                if head_start is not None:
                    await launch.discard(head_start)
                return
            await self._done.wait()  # a call meanwhile still waits: the start is coming
        self._launching = False  # from here the watcher's state (STARTING before any await) says it
        self._head_start = head_start  # the watcher takes it before its first await
        # No await between the check above and these assignments: one watcher per lifetime.
        self._scope, self._done = anyio.CancelScope(), anyio.Event()
        self._stop_requested = self._ending = self._gave_up = self._idled = self._needs_login = False
        self._armed = self.config.on_demand and self._demand is not None
        if self._demand is not None:
            self._demand.learning = learn
        await tg.start(self._watch)

    @property
    def launch_expected(self) -> bool:
        """The daemon said it starts it shortly (:meth:`expect_start`), and no stop or start came since."""
        return self._launching

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


def _now() -> datetime:
    return datetime.now(UTC)
