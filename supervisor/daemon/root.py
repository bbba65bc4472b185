"""The daemon's composition root: the set of extensions of one config, and everything they share.

:class:`Daemon` builds each extension with its spool, saved listing, pins, start slots and
sandbox, the per-client instances, the gateway, metrics and usage sampler; it owns one lock per
extension name so that no two operations act on one at once. What the control socket asks of it
is :mod:`.facade`; a reload is :mod:`.reload`; running it is :mod:`.run`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup

from supervisor import paths
from supervisor.config.settings import ExtensionConfig, Settings, StdioConfig
from supervisor.daemon import identity
from supervisor.daemon.callers import Callers
from supervisor.daemon.facade import Facade
from supervisor.daemon.headstart import HeadStart
from supervisor.daemon.logins import Logins
from supervisor.daemon.metrics import Metrics
from supervisor.daemon.reload import Reloading, expect_launch
from supervisor.daemon.systemd import Notifier
from supervisor.daemon.web import Web
from supervisor.dashboard.live import Pulse
from supervisor.dashboard.pages import Dashboard
from supervisor.dashboard.passes import Passes
from supervisor.errors import ExtensionUnavailable, UnknownExtension
from supervisor.extension import launch
from supervisor.extension.demand import Demand
from supervisor.extension.instances import Client, Instances, Replaced
from supervisor.extension.pins import Pins, PinStore
from supervisor.extension.saved import CatalogStore, fingerprint
from supervisor.extension.startup import StartSlots, default_slots
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from supervisor.gateway.server import Gateway
from supervisor.process import usage as resources
from supervisor.process.containment import Containment
from supervisor.upstream.spool import Spool

__all__ = ("Daemon",)

log = structlog.get_logger(__name__)


class Daemon(Facade, Reloading):
    """The extensions of one config, each started in the daemon's task group *tg*.

    Implements :class:`supervisor.control.server.Backend`; the control socket is a thin layer on it.
    *config_path* and *overrides* are what :meth:`reload` reads again.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tg: TaskGroup,
        environ: Mapping[str, str],
        config_path: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        notifier: Notifier | None = None,
        start_slots: StartSlots | None = None,
    ) -> None:
        self.settings = settings
        self.instance = identity.instance_key(settings.socket)
        self.marker_prefix = identity.marker_prefix(self.instance)
        self.config_path = config_path
        self._overrides = dict(overrides or {})
        self._environ = identity.child_environ(environ)
        self._tg = tg
        self.notifier = notifier or Notifier(None)
        self._reloading = anyio.Lock()
        # One operation at a time per name (start, stop, restart, or a reload replacing it),
        # so nothing acts on an Extension object that a reload is retiring.
        self._name_locks: dict[str, anyio.Lock] = {}
        self._restarting: set[str] = set()  # restarts asked for without waiting, not begun (one per name)
        self.hurry = anyio.Event()  # set when shutdown stops being polite
        # Starts at once: the daemon's own, shared with the head start's runs (see .run).
        self.start_slots = start_slots or StartSlots(settings.start_slots or default_slots())
        self.containment: Containment | None = None  # prepared by run() once the socket is ours
        self.spool = Spool(
            identity.spool_root(settings, environ),
            instance=self.instance,
            max_inline_bytes=settings.spool.max_inline_bytes,
            max_total_bytes=settings.spool.max_total_bytes,
        )
        self.catalogs = paths.default_state_root(environ) / "catalogs" / self.instance  # saved listings
        self.pin_dir = paths.default_state_root(environ) / "pins" / self.instance  # pinned tool definitions
        self.logins = Logins(paths.default_state_root(environ) / "oauth" / self.instance)  # remote logins
        self.sandbox_context = identity.sandbox_context(
            settings, config_path=config_path, environ=self._environ
        )
        self.metrics = Metrics(self.health)
        self.usage = resources.Sampler(
            self.marker_prefix, self._subtree
        )  # each tree's RSS/CPU, read once a second
        self.changes = Pulse()  # each state change, for the dashboard's live pages
        self.callers = Callers(self.runs, self.may_call_gateway)  # who is at the HTTP listener
        self.dashboard_app = Dashboard(
            self, Passes(), settings=lambda: self.settings.dashboard, extension_of=self.callers.extension_of
        )
        self.web: Web | None = None  # the HTTP listener, once run() serves the gateway
        self.gateway = Gateway(
            self,
            spool_dir=self.spool.run_dir,
            name_budget=settings.gateway.max_name_length,
            profiles=settings.profiles,
        )
        self._pins: dict[str, Pins] = {}  # by extension name; kept across reloads
        self._configure_pins(settings)
        self._extensions = {name: self._make(name, config) for name, config in settings.extensions.items()}
        self._instances = {name: self._instances_of(name, c) for name, c in settings.extensions.items()}
        for ext in self._extensions.values():  # the gateway listens before autostart launches them
            expect_launch(ext)

    def _make(self, name: str, config: ExtensionConfig) -> Extension:
        return Extension(
            name,
            config,
            environ=self._environ,
            marker_prefix=self.marker_prefix,
            hurry=self.hurry,
            spool=self.spool.for_extension(name),
            on_call=functools.partial(self.metrics.observe_call, name),
            on_change=self._state_changed,
            on_notification=self.gateway.notify,
            demand=self._demand_of(name, config),
            pins=self._pins[name],
            start_slots=self.start_slots,
            sandbox_context=self.sandbox_context,
            tokens=self.logins.store(name, config),
            login=functools.partial(self.login_url, name),
        )

    def _configure_pins(self, settings: Settings) -> None:
        """A :class:`Pins` for each extension of *settings* (kept if it has one), with its mode."""
        for name, extension in settings.extensions.items():
            mode = extension.tools_on_change or settings.tools_on_change
            if name in self._pins:
                self._pins[name].set_mode(mode)
            else:
                store = PinStore(self.pin_dir, name)  # a bounded read, as a saved catalog's
                self._pins[name] = Pins(name, mode=mode, store=store, on_change=self.gateway.invalidate)

    def _demand_of(self, name: str, config: ExtensionConfig) -> Demand:
        """Its saved listing (every extension's: the gateway keeps its names while it is stopped),
        and with ``on_demand`` or ``idle_stop`` its start on a call and its idle timer."""
        store = CatalogStore(self.catalogs, name, fingerprint(config))
        holds = functools.partial(self.gateway.holds, name)
        stands_in = config.on_demand or config.idle_stop is not None
        return Demand(
            idle_stop=config.idle_stop,
            store=store,
            start=self._start_on_demand,
            holds=holds,
            stands_in=stands_in,
        )

    def _instances_of(self, name: str, config: ExtensionConfig) -> Instances:
        pins = self._pins[name]  # the extension's: what one instance sees changed, all clients see

        def make(client: Client) -> Extension:
            own = config.model_copy(update={"on_demand": True})  # its client's first call starts it
            holds = functools.partial(self.gateway.holds, name)
            demand = Demand(idle_stop=config.idle_stop, store=None, start=self._start_instance, holds=holds)
            last_run: str | None = None  # the id of its last run seen running

            def changed(snapshot: Snapshot) -> None:
                nonlocal last_run
                self.changes.bump()
                if snapshot.state is State.RUNNING and snapshot.run != last_run:
                    if last_run is not None:  # a new run knows nothing of its client's subscriptions
                        self.gateway.instance_restarted(instance, client)
                    last_run = snapshot.run

            instance = Extension(
                name,
                own,
                environ=self._environ,
                marker_prefix=self.marker_prefix,
                hurry=self.hurry,
                spool=self.spool.for_extension(name),
                on_call=functools.partial(self.metrics.observe_call, name),
                on_change=changed,
                on_notification=functools.partial(self.gateway.notify, owner=client),  # its log: client's
                demand=demand,
                pins=pins,
                start_slots=self.start_slots,
                sandbox_context=self.sandbox_context,
                tokens=self.logins.store(name, config),  # the host's one login
                login=functools.partial(self.login_url, name),
            )
            return instance

        return Instances(name, make, config.max_instances, reclaim=self.gateway.reclaim)

    async def _start_instance(self, ext: Extension) -> None:
        await ext.start(self._tg)

    def instance_of(self, name: str, client: Client) -> Extension:
        """*client*'s own instance of per-client extension *name* (:mod:`supervisor.extension.instances`).

        Error handling: :class:`ExtensionUnavailable` as :meth:`Instances.of`, and retryable
        while a reload replaces the extension.
        """
        return self._current_instances(name).of(client)

    async def instance_when_room(self, name: str, client: Client) -> Extension:
        """:meth:`instance_of`, waiting for room while an instance is on its way out
        (:meth:`Instances.acquire`; the caller bounds the wait), from the instances of now."""
        while True:
            with contextlib.suppress(Replaced):  # a reload replaced them meanwhile: the new ones
                return await self._current_instances(name).acquire(client)

    def _current_instances(self, name: str) -> Instances:
        instances = self._instances.get(name)
        ext = self._extensions.get(name)
        # Between a reload's stop and its start, or reloaded to shared: the caller routes again.
        if instances is None or ext is None or ext.config.instances != "per-client":
            raise ExtensionUnavailable(name, "reloading", retryable=True)
        return instances

    def existing_instance(self, name: str, client: Client) -> Extension | None:
        """*client*'s instance of per-client *name* if it has one; never makes one."""
        instances = self._instances.get(name)
        return instances.existing(client) if instances is not None else None

    async def _start_on_demand(self, ext: Extension) -> None:
        """A call's start of a dormant extension; nothing if a reload replaced or removed it."""
        with contextlib.suppress(UnknownExtension):
            async with self._exclusive(ext.name) as current:
                if current is ext:
                    await ext.start(self._tg)

    async def _launch(self, ext: Extension, *, was_live: bool = False) -> None:
        """Start what the config says runs now: autostart; on demand only to learn its listing."""
        if was_live:
            await ext.start(self._tg)
        elif ext.config.on_demand:
            if ext.config.autostart and ext.needs_listing():
                await ext.start(self._tg, learn=True)
        elif ext.config.autostart:
            await ext.start(self._tg)

    def _subtree(self) -> Path | None:
        subtree = self.containment.subtree if self.containment is not None else None
        return subtree.path if subtree is not None else None

    def counts(self) -> dict[str, Any]:
        """Extensions by state and gateway clients, for ``/healthz``."""
        states = collections.Counter(ext.state.value for ext in self._extensions.values())
        return {"extensions": dict(states), "gateway_clients": self.gateway.client_count()}

    def summary(self) -> str:
        """Extension counts by state, for systemd's STATUS= line: ``3 running, 1 backoff``."""
        counts = collections.Counter(ext.state for ext in self._extensions.values())
        parts = [f"{counts[state]} {state.value}" for state in State if counts[state]]
        return ", ".join(parts) or "no extensions"

    def _state_changed(self, snapshot: Snapshot) -> None:
        self.changes.bump()
        self.gateway.invalidate(snapshot)
        if self.notifier.enabled:
            self.notifier.status(self.summary())

    def extensions(self) -> list[Extension]:
        """Every configured extension, in the config's order."""
        return list(self._extensions.values())

    def runs(self) -> dict[int, str]:
        """The pid of every running extension and per-client instance, with its name."""
        found: dict[int, str] = {}
        for name, ext in self._extensions.items():
            instances = self._instances.get(name)
            for one in (ext, *(instances.all() if instances is not None else ())):
                pid = one.snapshot().pid
                if pid is not None:
                    found[pid] = name
        return found

    def may_call_gateway(self, name: str) -> bool:
        """Whether extension *name*'s config lets it call the HTTP gateway (``sandbox.gateway``)."""
        ext = self._extensions.get(name)
        return ext is not None and isinstance(ext.config, StdioConfig) and ext.config.sandbox.gateway

    def get(self, name: str) -> Extension:
        try:
            return self._extensions[name]
        except KeyError:
            raise UnknownExtension(name) from None

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[Extension]:
        """Hold *name*'s lock and yield its current object, looked up once the lock is held."""
        self.get(name)  # an unknown name gets no lock
        async with self._name_locks.setdefault(name, anyio.Lock()):
            yield self.get(name)  # a reload may have replaced or removed it meanwhile

    async def autostart(self, head: HeadStart | None = None) -> None:
        """Launch every autostart extension, and each on-demand one without a saved listing.

        The runs *head* launched for them are theirs (the head start chose plain autostarts
        only); the rest stay *head*'s. One that a ``stop`` or ``start`` reached first, or that a
        reload replaced, is left as they made it. Returns once their watchers run (not once ready).
        """
        for name in list(self._extensions):  # a reload may change the table meanwhile
            with contextlib.suppress(UnknownExtension):
                async with self._exclusive(name) as ext:
                    launched = head.take(name, ext.config) if head is not None else None
                    if ext.config.autostart and not ext.config.on_demand and not ext.launch_expected:
                        if launched is not None:  # a stop or a start came first
                            await launch.discard(launched)
                    elif launched is not None:
                        await ext.start(self._tg, head_start=launched)
                    else:
                        await self._launch(ext)

    async def stop_all(self) -> None:
        """Stop every extension in parallel; returns once all their process trees are gone."""
        async with anyio.create_task_group() as stoppers:
            for ext in self._extensions.values():
                stoppers.start_soon(ext.stop)
            for instances in self._instances.values():
                stoppers.start_soon(instances.stop_all)


_RESTART_ONLY = ("socket", "spool", "gateway")
