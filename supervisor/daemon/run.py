"""Running the daemon: startup phases, signals, shutdown.

Startup has two phases. The first is light (no MCP SDK yet): open the signal receiver, bind
the control socket (which also refuses a second daemon on the same socket), arm the
containment, sweep the processes and temporary directories that a crashed earlier daemon on
this socket left behind, and give the first extensions a head start (:mod:`.headstart`). The
second imports the daemon proper while those children load, serves the gateway's listeners,
sweeps the spool, and launches the autostart extensions concurrently. Then it serves until
SIGTERM/SIGINT; SIGHUP reloads the config. Shutdown stops every extension in parallel within
``shutdown_timeout``. A second signal, or that timeout's polite part running out, stops being
polite: teardowns skip their graces and SIGKILL what is left (they are shielded, so the
process trees still die before the daemon exits).
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from supervisor import logs, sockets
from supervisor.config.settings import Settings, StdioConfig
from supervisor.control import server as control
from supervisor.daemon import fdlimits, identity
from supervisor.daemon.headstart import HeadStart
from supervisor.daemon.systemd import Notifier, keep_watchdog
from supervisor.errors import ConfigError, SupervisorError, first_line
from supervisor.extension.startup import StartSlots, default_slots
from supervisor.process import children as process
from supervisor.process import sandbox
from supervisor.process.containment import Containment
from supervisor.upstream.spool import Spool

if TYPE_CHECKING:
    from supervisor.daemon.root import Daemon

__all__ = ("run",)

log = structlog.get_logger(__name__)


async def run(
    settings: Settings,
    *,
    config_path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
    log_json: bool | None = None,
) -> int:
    """Run the daemon until SIGTERM or SIGINT; return the process exit code.

    *config_path* and *overrides* are what a reload (SIGHUP or the ``reload`` method) reads;
    *warnings* are what loading *settings* had to say (logged once logging is set up).
    *log_json*: JSON lines (True), readable lines (False), or JSON unless stderr is a terminal.
    """
    logs.configure(json=log_json)  # None: JSON lines unless stderr is a terminal
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
    instance = identity.instance_key(settings.socket)
    prefix = identity.marker_prefix(instance)
    environ = identity.child_environ(os.environ)
    context = identity.sandbox_context(settings, config_path=config_path, environ=environ)
    try:
        listener = await sockets.listen(settings.socket)  # a second daemon stops here: before any spawn
    except SupervisorError as exc:
        log.error("daemon.socket_unavailable", error=str(exc))
        return 1
    socket_file = sockets.identity(settings.socket)
    served = False  # control.serve owns the listener from its call on
    containment: Containment | None = None
    daemon: Daemon | None = None
    unbound = False  # a listener's socket could not be bound
    try:
        # Signals first: a SIGTERM during startup must still tear down what was spawned.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with anyio.create_task_group() as tg:
                containment = await Containment.prepare(
                    instance=instance,
                    prefix=prefix,
                    want=os.environ.get("MCP_SUPERVISOR_CONTAINMENT", "auto"),
                )
                tg.start_soon(containment.keep_guardian)
                tg.start_soon(containment.keep_reaping)
                swept = await process.sweep_marked(f"{instance}:", keep=prefix)
                if swept:
                    log.warning("daemon.swept_orphans", count=swept)
                await anyio.to_thread.run_sync(sandbox.sweep, context.tmp)  # their temporary dirs
                slots = StartSlots(settings.start_slots or default_slots())
                head = HeadStart()  # MCP_SUPERVISOR_HEAD_START=0: every spawn waits for the autostart
                if os.environ.get("MCP_SUPERVISOR_HEAD_START", "1") != "0":
                    head = await HeadStart.launch(
                        settings, environ=environ, prefix=prefix, context=context, slots=slots
                    )
                try:
                    daemon = _build(settings, tg, slots, containment, notifier, config_path, overrides)
                    await tg.start(_serve_signals, daemon, tg, signals)
                    served = True
                    serve_control = functools.partial(
                        control.serve,
                        listener=listener,
                        socket_identity=socket_file,
                        max_connections=fds.control,
                    )
                    await tg.start(serve_control, daemon, settings.socket)
                    unbound = not await _serve(daemon, tg, head, fds)  # a signal may cancel it: not a failure
                finally:
                    await head.close()  # what no watcher took (all of it, on a way out before the autostart)
                if unbound:
                    tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if not served:
                await listener.aclose()
                sockets.unlink_if_ours(settings.socket, socket_file)
            if containment is not None:
                await containment.close()
            if daemon is not None:
                await anyio.to_thread.run_sync(daemon.spool.close)
            await anyio.to_thread.run_sync(functools.partial(sandbox.sweep, context.tmp, remove=True))
    notifier.close()
    if unbound:
        return 1
    log.info("daemon.stopped")
    return 0


def _build(
    settings: Settings,
    tg: TaskGroup,
    slots: StartSlots,
    containment: Containment,
    notifier: Notifier,
    config_path: str | None,
    overrides: Mapping[str, Any] | None,
) -> Daemon:
    """Import the daemon proper and build it."""
    # Imported only now: the MCP SDK and the gateway cost about half a second of CPU, which the
    # head start's children spend loading on another core meanwhile (see .headstart).
    from supervisor.daemon.root import Daemon

    logs.quiet_sdk_deprecations()
    daemon = Daemon(
        settings,
        tg=tg,
        environ=os.environ,
        config_path=config_path,
        overrides=overrides,
        notifier=notifier,
        start_slots=slots,
    )
    daemon.containment = containment
    return daemon


async def _serve(daemon: Daemon, tg: TaskGroup, head: HeadStart, fds: fdlimits.FdPlan) -> bool:
    """Serve the gateway's listeners, then start the extensions (with *head*'s runs). False when
    a listener's socket cannot be bound."""
    from supervisor.daemon.web import Web
    from supervisor.gateway.unix import serve_unix

    settings = daemon.settings
    await tg.start(daemon.gateway.run)
    daemon.web = Web(
        tg,
        fds,
        settings=lambda: daemon.settings,
        gateway=daemon.gateway,
        pages=daemon.dashboard_app,
        screen=daemon.callers.refusal,
        metrics=daemon.metrics.render,
        health=daemon.counts,
    )
    try:
        await tg.start(
            functools.partial(serve_unix, daemon.gateway, settings.gateway_socket, max_connections=fds.unix)
        )
        if settings.gateway.http.enabled:
            await daemon.web.open(mcp=True)
    except SupervisorError as exc:
        log.error("daemon.socket_unavailable", error=str(exc))
        return False
    await _prepare_spool(daemon.spool)
    await daemon.prune_catalogs()
    await _tell_sandbox_level(settings, daemon.sandbox_context)
    await daemon.autostart(head)
    daemon.notifier.ready(daemon.summary())
    tg.start_soon(keep_watchdog, daemon.notifier)  # on the loop: a blocked loop stops the pings
    log.info("daemon.ready", extensions=len(settings.extensions))
    return True


async def _tell_sandbox_level(settings: Settings, context: sandbox.Context) -> None:
    """Say once what this host confines the configured sandboxes with, and what it cannot enforce."""
    confined = [e for e in settings.extensions.values() if isinstance(e, StdioConfig) and e.sandbox.enabled]
    networks = sorted({e.sandbox.network for e in confined})
    if not networks:
        return
    host = await anyio.to_thread.run_sync(sandbox.probe_host, context.max_abi)
    lacks = list(dict.fromkeys(lack for network in networks for lack in host.lacks(network)))
    if host.failure is not None or lacks:
        log.warning("sandbox.partial", confined=host.level(), lacks=lacks, failure=host.failure)
    else:
        log.info("sandbox.level", confined=host.level())


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
    daemon: Daemon,
    tg: TaskGroup,
    signals: AsyncIterator[int],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Signal handlers only note the signal; the work happens here, in the event loop. Those
    received since the daemon began (its receiver opened first) are served now, in order."""
    task_status.started()
    shutting_down = False
    async for signum in signals:
        if signum == signal.SIGHUP:
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
        log.exception("daemon.reload_failed", errors=[first_line(exc)], hint="the reload may be incomplete")


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
