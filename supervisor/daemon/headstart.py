"""A head start: the first autostart children spawn before the daemon imports the MCP SDK.

Importing the SDK (pydantic's models of both protocol eras), the gateway and the extensions'
machinery costs the daemon about half a second of CPU; an SDK-based child takes about as long
to load before it can answer ``initialize``. So the daemon launches its first children as soon
as the control socket is its own (a second daemon on that socket spawns nothing) and the
containment is armed, and imports the rest only then: on another core, the children load
meanwhile.

Which: in the config's order, the extensions the autostart gives the first start slots, and of
those the ones whose first start is a plain spawn (autostart, neither on demand nor
per-client). Each takes its start slot now and is launched exactly as its watcher would launch
it (:func:`supervisor.extension.launch.launch`); its watcher adopts the run and the slot for its
first start (:meth:`HeadStart.take`). One the head start cannot launch (a missing command or secret, a
sandbox the kernel cannot enforce) is left to its watcher, which tries and reports it as usual.

Light on purpose: nothing here imports the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import structlog

from supervisor.config.settings import ExtensionConfig, Settings, StdioConfig
from supervisor.errors import SpawnError
from supervisor.extension import launch
from supervisor.extension.startup import StartSlots
from supervisor.process import sandbox

__all__ = ("HeadStart", "first_starts")

log = structlog.get_logger(__name__)


class HeadStart:
    """The runs launched ahead of their watchers, each with the config it was launched for.

    Resource handling: :meth:`close` ends every run no watcher took; the daemon calls it once
    its autostart is done, and on every way out before that.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[StdioConfig, launch.Launched]] = {}

    @classmethod
    async def launch(
        cls,
        settings: Settings,
        *,
        environ: Mapping[str, str],
        prefix: str,
        context: sandbox.Context,
        slots: StartSlots,
    ) -> HeadStart:
        """Launch the first autostart extensions of *settings* (see the module's text), each in
        a start slot of *slots* (the daemon's), handed to its watcher with the run.

        *environ* is what children inherit, *prefix* the daemon's marker prefix, *context* its
        sandbox context. Never raises for one extension: what cannot be launched is left out.
        """
        head = cls()
        try:
            for name, config in first_starts(settings, slots.count - slots.in_use):
                if slots.queued or slots.in_use >= slots.count:
                    break  # the head start never waits for a slot
                if (run := await _launch(name, config, environ, prefix, context, slots)) is not None:
                    head._runs[name] = (config, run)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await head.close()
            raise
        if head._runs:
            pids = {name: run.child.pid for name, (_, run) in head._runs.items()}
            log.info("daemon.head_start", extensions=pids)
        return head

    def take(self, name: str, config: ExtensionConfig) -> launch.Launched | None:
        """The run launched for *name*, now the caller's; None unless it was launched for this
        very *config* (a reload meanwhile may have changed it)."""
        launched_for, run = self._runs.get(name, (None, None))
        if run is None or launched_for != config:
            return None
        del self._runs[name]
        return run

    async def close(self) -> None:
        """End every run nobody took, all at once, and give their start slots back. Idempotent."""
        runs = [run for _, run in self._runs.values()]
        self._runs.clear()
        async with anyio.create_task_group() as ending:
            for run in runs:
                ending.start_soon(launch.discard, run)


async def _launch(
    name: str,
    config: StdioConfig,
    environ: Mapping[str, str],
    prefix: str,
    context: sandbox.Context,
    slots: StartSlots,
) -> launch.Launched | None:
    """One extension's run, in a start slot it holds; None (and no slot) when it cannot start."""
    ticket = slots.ticket()
    await slots.acquire(ticket)
    env, credentials = launch.environment(environ, config)
    run: launch.Launched | None = None
    try:
        run = await launch.launch(
            config,
            env=env,
            credentials=credentials,
            confinement=sandbox.sandbox_for(name, config, context),
            marker=launch.run_marker(prefix, name),
        )
        run.ticket = ticket
    except SpawnError:
        pass  # its watcher meets the same error and reports it
    except Exception:  # a bug of ours must cost the head start only, never the daemon
        log.exception("daemon.head_start_failed", extension=name)
    finally:
        if run is None:
            ticket.release()
    return run


def first_starts(settings: Settings, slots: int) -> list[tuple[str, StdioConfig]]:
    """The plain spawns among the starts that the autostart of *settings* gives the first
    *slots* start slots, in order. Every autostart extension is counted as taking a slot (an
    on-demand one may start to learn its listing), though only the plain ones are chosen."""
    chosen: list[tuple[str, StdioConfig]] = []
    for name, config in settings.extensions.items():
        if slots <= 0:
            break
        if not config.autostart:
            continue
        slots -= 1
        if isinstance(config, StdioConfig) and not config.on_demand and config.instances == "shared":
            chosen.append((name, config))
    return chosen
