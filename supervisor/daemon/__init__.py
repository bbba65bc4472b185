"""The daemon: the set of extensions, the control socket, signals, and the task group they live in.

Startup phases: install the signal handlers, bind the control socket (which also refuses a
second daemon on the same socket), sweep processes and spool files that a crashed earlier
daemon on this socket left behind, launch the autostart extensions concurrently, then serve
until SIGTERM/SIGINT; SIGHUP reloads the config. Shutdown stops every extension in parallel
within ``shutdown_timeout``. A second signal, or that timeout's polite part running out, stops
being polite: teardowns skip their graces and SIGKILL what is left (they are shielded, so the
process trees still die before the daemon exits).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup, TaskStatus
from mcp.shared.dispatcher import ProgressFnT

from supervisor import logs
from supervisor.child.spool import Spool, default_root
from supervisor.config import settings as config
from supervisor.config.settings import ExtensionConfig, Settings
from supervisor.control import server as control
from supervisor.daemon import fdlimits
from supervisor.daemon.health import cgroup_of, process_stats
from supervisor.daemon.metrics import Metrics
from supervisor.daemon.systemd import Notifier, keep_watchdog
from supervisor.errors import ConfigError, SupervisorError, UnknownExtension
from supervisor.extension.demand import Demand
from supervisor.extension.instances import Client, Instances, figures
from supervisor.extension.pins import Pins, PinStore
from supervisor.extension.saved import CatalogStore, default_state_root, fingerprint, prune
from supervisor.extension.startup import StartSlots, default_slots
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from supervisor.gateway.http import HttpLimits, serve_http
from supervisor.gateway.server import Gateway
from supervisor.gateway.unix import serve_unix
from supervisor.process import children as process
from supervisor.process import sandbox
from supervisor.process import usage as resources
from supervisor.process.containment import Containment

__all__ = ("Daemon", "instance_key", "run", "sandbox_context")

log = structlog.get_logger(__name__)


class Daemon:
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
    ) -> None:
        self.settings = settings
        self.instance = instance_key(settings.socket)
        self.marker_prefix = f"{self.instance}:{os.getpid()}:"
        self.config_path = config_path
        self._overrides = dict(overrides or {})
        self._environ = {k: v for k, v in environ.items() if k not in _NOT_FOR_CHILDREN}
        self._tg = tg
        self.notifier = notifier or Notifier(None)
        self._reloading = anyio.Lock()
        # One operation at a time per name (start, stop, restart, or a reload replacing it),
        # so nothing acts on an Extension object that a reload is retiring.
        self._name_locks: dict[str, anyio.Lock] = {}
        self.hurry = anyio.Event()  # set when shutdown stops being polite
        self.start_slots = StartSlots(settings.start_slots or default_slots())  # starts at once
        self.containment: Containment | None = None  # prepared by run() once the socket is ours
        self.spool = Spool(
            Path(settings.spool.dir) if settings.spool.dir else default_root(environ),
            instance=self.instance,
            max_inline_bytes=settings.spool.max_inline_bytes,
            max_total_bytes=settings.spool.max_total_bytes,
        )
        self.catalogs = default_state_root(environ) / "catalogs" / self.instance  # saved listings
        self.pin_dir = default_state_root(environ) / "pins" / self.instance  # pinned tool definitions
        self.sandbox_context = sandbox_context(settings, config_path=config_path, environ=self._environ)
        self.metrics = Metrics(self.health)
        self.usage = resources.Sampler(
            self.marker_prefix, self._subtree
        )  # each tree's RSS/CPU, read once a second
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
            _expect_launch(ext)

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
        env = {**self._environ, **config.env}
        store = CatalogStore(self.catalogs, name, fingerprint(config.command, config.args, config.cwd, env))
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
            return Extension(
                name,
                own,
                environ=self._environ,
                marker_prefix=self.marker_prefix,
                hurry=self.hurry,
                spool=self.spool.for_extension(name),
                on_call=functools.partial(self.metrics.observe_call, name),
                on_notification=functools.partial(self.gateway.notify, owner=client),  # its log: client's
                demand=demand,
                pins=pins,
                start_slots=self.start_slots,
                sandbox_context=self.sandbox_context,
            )

        return Instances(name, make, config.max_instances)

    async def _start_instance(self, ext: Extension) -> None:
        await ext.start(self._tg)

    def instance_of(self, name: str, client: Client) -> Extension:
        """*client*'s own instance of per-client extension *name* (:mod:`supervisor.extension.instances`)."""
        return self._instances[name].of(client)

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
        states = collections.Counter(ext.snapshot().state.value for ext in self._extensions.values())
        return {"extensions": dict(states), "gateway_clients": self.gateway.client_count()}

    def summary(self) -> str:
        """Extension counts by state, for systemd's STATUS= line: ``3 running, 1 backoff``."""
        counts = collections.Counter(ext.snapshot().state for ext in self._extensions.values())
        parts = [f"{counts[state]} {state.value}" for state in State if counts[state]]
        return ", ".join(parts) or "no extensions"

    def _state_changed(self, snapshot: Snapshot) -> None:
        self.gateway.invalidate(snapshot)
        if self.notifier.enabled:
            self.notifier.status(self.summary())

    def extensions(self) -> list[Extension]:
        """Every configured extension, in the config's order."""
        return list(self._extensions.values())

    def get(self, name: str) -> Extension:
        try:
            return self._extensions[name]
        except KeyError:
            raise UnknownExtension(name) from None

    def status(self, name: str | None = None) -> list[Snapshot]:
        chosen = [self.get(name)] if name is not None else self._extensions.values()
        return [self._with_instances(ext) for ext in chosen]

    def _with_instances(self, ext: Extension) -> Snapshot:
        snapshot = self._with_usage(ext)
        instances = self._instances.get(ext.name)
        if instances is None or ext.config.instances != "per-client":
            return snapshot
        return replace(snapshot, instances=tuple(self._with_usage(i) for i in instances.all()))

    def _with_usage(self, ext: Extension) -> Snapshot:
        snapshot = ext.snapshot()
        usage = self.usage.usage(snapshot.name, snapshot.pid, ext.run_marker)
        return replace(snapshot, resources=usage.as_dict())

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[Extension]:
        """Hold *name*'s lock and yield its current object, looked up once the lock is held."""
        self.get(name)  # an unknown name gets no lock
        async with self._name_locks.setdefault(name, anyio.Lock()):
            yield self.get(name)  # a reload may have replaced or removed it meanwhile

    async def start(self, name: str, *, wait: bool = True) -> Snapshot:
        async with self._exclusive(name) as ext:
            self._instances[name].resume()  # per-client: clients' next calls start theirs
            await ext.start(self._tg)
        return await _settled(ext) if wait else ext.snapshot()

    async def stop(self, name: str, *, wait: bool = True) -> Snapshot:
        async with self._exclusive(name) as ext:
            instances = self._instances[name]  # per-client: every instance too, held until start
            if wait:
                async with anyio.create_task_group() as stoppers:
                    stoppers.start_soon(ext.stop)
                    stoppers.start_soon(functools.partial(instances.stop_all, hold=True))
            else:
                ext.request_stop()  # the watchers do the rest: no task per request
                instances.held = True
                instances.release_all()
        return ext.snapshot()

    async def restart(self, name: str, *, wait: bool = True) -> Snapshot:
        if not wait:
            snapshot = self.get(name).snapshot()
            self._tg.start_soon(self._restart, name)
            return snapshot
        ext = await self._restart(name)
        if ext is None:
            raise UnknownExtension(name)
        return await _settled(ext)

    async def _restart(self, name: str) -> Extension | None:
        """Restart *name*; None if a reload removed it meanwhile. Never raises: may run as a task."""
        with contextlib.suppress(UnknownExtension):
            async with self._exclusive(name) as ext, anyio.create_task_group() as restarts:
                restarts.start_soon(ext.restart, self._tg)
                restarts.start_soon(self._instances[name].restart_all, self._tg)  # per-client: each
            return ext
        return None

    def tools(self, name: str | None = None) -> list[tuple[str, types.Tool]]:
        chosen = [self.get(name)] if name is not None else self._extensions.values()
        return [(ext.name, tool) for ext in chosen for tool in ext.tools()]

    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]:
        return self.gateway.exposed(extension, tool)

    def collisions(self, extension: str) -> list[str]:
        return self.gateway.collisions(extension)

    def profiles(self) -> list[dict[str, Any]]:
        return self.gateway.profiles()

    async def call(
        self, name: str, tool: str, arguments: dict[str, Any], *, progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        return await self.get(name).call_tool(tool, arguments, progress=progress)

    def logs(self, name: str, lines: int) -> list[str]:
        return self.get(name).logs(lines)

    def tool_changes(self, name: str) -> list[dict[str, Any]]:
        """The tools of *name* whose definition changed since it was pinned (see :mod:`.pins`)."""
        self.get(name)
        return [change.as_dict() for change in self._pins[name].changes().values()]

    async def approve(self, name: str, tool: str | None = None) -> list[str]:
        """Pin the current definition of *tool* of *name* (None: of each changed one); those approved."""
        self.get(name)
        pins = self._pins[name]
        approved = pins.approve(tool)
        await pins.save()
        return approved

    def health(self) -> dict[str, Any]:
        """Diagnostics of the daemon itself: the process, the spool, and each extension's counters."""
        spool = self.spool.stats()
        return {
            "process": process_stats().as_dict(),
            "spool": {
                "dir": str(self.spool.run_dir),
                "files": spool.files,
                "bytes": spool.bytes,
                "max_files": self.spool.max_files,
                "max_bytes": self.spool.max_total_bytes,
            },
            "containment": self.containment.describe() if self.containment else None,
            "start_slots": self.start_slots.stats(),
            "extensions": [
                _health_of(ext, self.usage, self._instances.get(ext.name))
                for ext in self._extensions.values()
            ],
        }

    async def reload(self) -> dict[str, list[str]]:
        """Re-read the config; start what was added, stop what was removed, restart what changed.

        Extensions whose settings are unchanged are left alone (same process), and a manual
        stop stays in force. Settings that only a restart can apply (socket, spool, gateway)
        are reported under ``needs_restart`` and not applied.

        Error handling: raises :class:`ConfigError` listing every problem; nothing changes then.
        """
        async with self._reloading:
            new = await anyio.to_thread.run_sync(self._load)
            self.notifier.reloading()
            self._configure_pins(new)  # before any start: a changed tools_on_change applies to it
            old = self.settings
            gone = [n for n in self._extensions if n not in new.extensions]
            changed = [
                n
                for n, c in new.extensions.items()
                if n in self._extensions and c != self._extensions[n].config
            ]
            added = [n for n in new.extensions if n not in self._extensions]
            async with contextlib.AsyncExitStack() as held:
                for name in sorted({*gone, *changed, *added}):  # each operation holds one: no deadlock
                    await held.enter_async_context(self._name_locks.setdefault(name, anyio.Lock()))
                await self._apply(new, gone, changed, added)
            self._pins = {name: pins for name, pins in self._pins.items() if name in new.extensions}
            self.start_slots.resize(new.start_slots or default_slots())
            frozen = [key for key in _RESTART_ONLY if getattr(new, key) != getattr(old, key)]
            self.settings = new.model_copy(update={key: getattr(old, key) for key in _RESTART_ONLY})
            self.notifier.ready(self.summary())
            self.gateway.set_profiles(new.profiles)
            self.gateway.invalidate()
            await self.prune_catalogs()
        report = {
            "added": added,
            "removed": gone,
            "restarted": changed,
            "unchanged": [n for n in new.extensions if n not in added and n not in changed],
            "needs_restart": frozen,
        }
        log.info("daemon.reloaded", **report)
        return report

    async def prune_catalogs(self) -> None:
        """Delete the saved listings and pins of extensions the config no longer has."""
        names = set(self._extensions)
        await anyio.to_thread.run_sync(prune, self.catalogs, names)
        await anyio.to_thread.run_sync(prune, self.pin_dir, names)  # every extension has pins

    def _load(self) -> Settings:
        """The config file again; whatever goes wrong reading it is a ConfigError, never the daemon's end."""
        warnings: list[str] = []
        try:
            settings = config.load(self.config_path, overrides=self._overrides, warnings=warnings)
        except ConfigError:
            raise
        except Exception as exc:  # a loader bug: keep running on the old config, and say so
            raise ConfigError([f"{self.config_path}: cannot be loaded ({_first_line(exc)})"]) from exc
        for warning in warnings:
            log.warning("config.client_keys_ignored", detail=warning)
        return settings

    async def _apply(self, new: Settings, gone: list[str], changed: list[str], added: list[str]) -> None:
        """Stop what is gone or changed, then start what changed or was added (under their locks)."""
        was_live = {n: self._extensions[n].snapshot().state.is_live for n in changed}
        async with anyio.create_task_group() as stoppers:
            for name in (*gone, *changed):
                stoppers.start_soon(self._extensions[name].stop)
                stoppers.start_soon(self._instances.pop(name).stop_all)
        for name in gone:
            del self._extensions[name]
            del self._name_locks[name]  # a waiter still holding it finds the name gone
            self.metrics.forget(name)
        for name in (*changed, *added):
            self._extensions[name] = self._make(name, new.extensions[name])
            self._instances[name] = self._instances_of(name, new.extensions[name])
            _expect_launch(self._extensions[name], was_live=was_live.get(name, False))
        # Keep the daemon's own order the config's order.
        self._extensions = {n: self._extensions[n] for n in new.extensions}
        for name in (*changed, *added):
            await self._launch(self._extensions[name], was_live=was_live.get(name, False))

    async def autostart(self) -> None:
        """Launch every autostart extension, and each on-demand one without a saved listing.

        Returns once their watchers run (not once ready).
        """
        for ext in self._extensions.values():
            await self._launch(ext)

    async def stop_all(self) -> None:
        """Stop every extension in parallel; returns once all their process trees are gone."""
        async with anyio.create_task_group() as stoppers:
            for ext in self._extensions.values():
                stoppers.start_soon(ext.stop)
            for instances in self._instances.values():
                stoppers.start_soon(instances.stop_all)


def _expect_launch(ext: Extension, *, was_live: bool = False) -> None:
    """Let calls wait for what :meth:`Daemon._launch` is about to start (not a learning run)."""
    if was_live or (ext.config.autostart and not ext.config.on_demand):
        ext.expect_start()


_NOT_FOR_CHILDREN = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})  # systemd talks to us only
_RESTART_ONLY = ("socket", "spool", "gateway")


def _health_of(
    ext: Extension, usage: resources.Sampler, instances: Instances | None = None
) -> dict[str, Any]:
    snapshot = ext.snapshot()
    per_client = instances if ext.config.instances == "per-client" else None
    return {
        **figures(ext, usage),
        "tools": snapshot.tools,
        "log_lines": ext.stderr_lines,
        "log_lines_max": ext.config.log_lines,
        "cgroup": cgroup_of(snapshot.pid) if snapshot.pid else None,
        "instances": per_client.health(usage) if per_client is not None else None,
        "sandbox": snapshot.sandbox,
    }


async def _settled(ext: Extension) -> Snapshot:
    """Wait until a start has an answer: running, or why not (backoff, failed, stopped)."""
    return await ext.wait_for(lambda s: s.state not in (State.STARTING, State.STOPPING))


def sandbox_context(
    settings: Settings, *, config_path: str | None, environ: Mapping[str, str]
) -> sandbox.Context:
    """What the extensions of a daemon on *settings* must never see: its config, sockets, state, spool."""
    spool = Path(settings.spool.dir) if settings.spool.dir else default_root(environ)
    return sandbox.daemon_context(
        environ=environ,
        config_path=config_path,
        socket=settings.socket,
        state=str(default_state_root(environ)),
        spool=str(spool),
        instance=instance_key(settings.socket),
    )


def instance_key(socket_path: str) -> str:
    """Names this daemon's children by its socket, so a successor finds what it left behind."""
    return hashlib.sha256(os.path.abspath(socket_path).encode()).hexdigest()[:12]


async def run(
    settings: Settings,
    *,
    config_path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> int:
    """Run the daemon until SIGTERM or SIGINT; return the process exit code.

    *config_path* and *overrides* are what a reload (SIGHUP or the ``reload`` method) reads;
    *warnings* are what loading *settings* had to say (logged once logging is set up).
    """
    logs.configure()
    log.info("daemon.starting", pid=os.getpid(), socket=settings.socket, extensions=len(settings.extensions))
    fds = fdlimits.plan(fdlimits.raise_soft_limit(), _children(settings))
    (log.warning if fds.cramped else log.info)(
        "daemon.fd_limit",
        limit=fds.limit,
        reserved=fds.reserved,
        control=fds.control,
        unix=fds.unix,
        http=fds.http,
    )
    for warning in warnings:
        log.warning("config.client_keys_ignored", detail=warning)
    notifier = Notifier.from_environ(os.environ)
    async with anyio.create_task_group() as tg:
        daemon = Daemon(
            settings,
            tg=tg,
            environ=os.environ,
            config_path=config_path,
            overrides=overrides,
            notifier=notifier,
        )
        # Signals first: a SIGTERM during startup must still tear down what was spawned.
        await tg.start(_serve_signals, daemon, tg)
        try:
            await tg.start(
                functools.partial(control.serve, max_connections=fds.control), daemon, settings.socket
            )
        except SupervisorError as exc:
            log.error("daemon.socket_unavailable", error=str(exc))
            tg.cancel_scope.cancel()
            return 1
        await tg.start(daemon.gateway.run)
        try:
            await tg.start(
                functools.partial(serve_unix, max_connections=fds.unix),
                daemon.gateway,
                settings.gateway_socket,
            )
        except SupervisorError as exc:
            log.error("daemon.socket_unavailable", error=str(exc))
            tg.cancel_scope.cancel()
            return 1
        http = settings.gateway.http
        if http.enabled:
            try:
                await tg.start(
                    functools.partial(
                        serve_http,
                        daemon.gateway,
                        host=http.host,
                        port=http.port,
                        token=http.token.get_secret_value() if http.token else None,
                        metrics=daemon.metrics.render,
                        health=daemon.counts,
                        limits=HttpLimits(max_connections=fds.http, backlog=fdlimits.ACCEPT_BURST),
                    )
                )
            except SupervisorError as exc:
                log.error("daemon.socket_unavailable", error=str(exc))
                tg.cancel_scope.cancel()
                return 1
        daemon.containment = await Containment.prepare(
            instance=daemon.instance,
            prefix=daemon.marker_prefix,
            want=os.environ.get("MCP_SUPERVISOR_CONTAINMENT", "auto"),
        )
        tg.start_soon(daemon.containment.keep_guardian)
        swept = await process.sweep_marked(f"{daemon.instance}:", keep=daemon.marker_prefix)
        if swept:
            log.warning("daemon.swept_orphans", count=swept)
        await anyio.to_thread.run_sync(sandbox.sweep, daemon.sandbox_context.tmp)  # their temporary dirs
        await _prepare_spool(daemon.spool)
        await daemon.prune_catalogs()
        await daemon.autostart()
        notifier.ready(daemon.summary())
        tg.start_soon(keep_watchdog, notifier)  # on the loop: a blocked loop stops the pings
        log.info("daemon.ready", extensions=len(settings.extensions))
    with anyio.CancelScope(shield=True):
        if daemon.containment is not None:
            await daemon.containment.close()
        await anyio.to_thread.run_sync(daemon.spool.close)
        await anyio.to_thread.run_sync(
            functools.partial(sandbox.sweep, daemon.sandbox_context.tmp, remove=True)
        )
    notifier.close()
    log.info("daemon.stopped")
    return 0


def _children(settings: Settings) -> int:
    """How many children the config may run at once: one per extension, per-client ones each."""
    return sum(
        c.max_instances + 1 if c.instances == "per-client" else 1 for c in settings.extensions.values()
    )


async def _prepare_spool(spool: Spool) -> None:
    def prepare() -> int:
        spool.check_filesystem()
        return spool.sweep()

    swept = await anyio.to_thread.run_sync(prepare)
    if swept:
        log.warning("daemon.swept_spool", directories=swept, root=str(spool.root))


async def _serve_signals(
    daemon: Daemon, tg: TaskGroup, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Signal handlers only note the signal; the work happens here, in the event loop."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD) as signals:
        task_status.started()
        shutting_down = False
        async for signum in signals:
            if signum == signal.SIGCHLD:  # an orphan handed to us (a subreaper) may have exited
                if daemon.containment is not None:
                    await daemon.containment.reap()
            elif signum == signal.SIGHUP:
                tg.start_soon(_reload_on_signal, daemon)
            elif not shutting_down:
                shutting_down = True
                log.info("daemon.shutting_down", signal=signal.Signals(signum).name)
                tg.start_soon(_shutdown, daemon, tg)
            else:
                log.warning("daemon.forced_shutdown", signal=signal.Signals(signum).name)
                daemon.hurry.set()  # skip the graces: SIGKILL what is left
                tg.cancel_scope.cancel()


async def _reload_on_signal(daemon: Daemon) -> None:
    """SIGHUP's reload; it runs in the root task group, so nothing it raises may escape."""
    try:
        await daemon.reload()
    except ConfigError as exc:
        log.error(
            "daemon.reload_failed", errors=list(exc.errors), hint="still running on the previous config"
        )
    except Exception as exc:  # not from loading (that is a ConfigError): from applying the new config
        log.exception("daemon.reload_failed", errors=[_first_line(exc)], hint="the reload may be incomplete")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


FORCE_RESERVE = 5.0  # at most this much of shutdown_timeout is kept for killing what is left


async def _shutdown(daemon: Daemon, tg: TaskGroup) -> None:
    """Stop every extension politely, then forcibly: the daemon exits within ``shutdown_timeout``."""
    daemon.notifier.stopping()
    timeout = daemon.settings.shutdown_timeout
    polite = timeout - min(FORCE_RESERVE, timeout / 5)  # the rest: SIGKILL, reap, remove cgroups
    with anyio.move_on_after(polite) as scope:
        await daemon.stop_all()
    if scope.cancelled_caught:
        log.warning("daemon.shutdown_timeout", timeout=timeout, polite=round(polite, 3))
        daemon.hurry.set()
    tg.cancel_scope.cancel()
