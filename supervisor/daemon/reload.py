"""A reload: read the config again; start what was added, stop what was removed, restart what changed.

Extensions whose settings are unchanged are left alone (same process), and a manual stop stays
in force. Settings that only a restart can apply (socket, spool, gateway) are reported under
``needs_restart`` and not applied.
"""

from __future__ import annotations

import contextlib

import anyio
import structlog

from supervisor.config import settings as config
from supervisor.config.settings import Settings
from supervisor.errors import ConfigError, first_line
from supervisor.extension.saved import prune
from supervisor.extension.startup import default_slots
from supervisor.extension.supervised import Extension

__all__ = ("Reloading", "expect_launch")

log = structlog.get_logger(__name__)

_RESTART_ONLY = ("socket", "spool", "gateway")


class Reloading:
    """A reload, as part of the Daemon."""

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
            self.logins.forget(set(new.extensions))  # a removed server's login file stays: the user's
            self.start_slots.resize(new.start_slots or default_slots())
            frozen = [key for key in _RESTART_ONLY if getattr(new, key) != getattr(old, key)]
            self.settings = new.model_copy(update={key: getattr(old, key) for key in _RESTART_ONLY})
            self.notifier.ready(self.summary())
            self.gateway.set_profiles(new.profiles)
            self.gateway.invalidate()
            self.changes.bump()  # the dashboard's pages show the config's new settings
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
            raise ConfigError([f"{self.config_path}: cannot be loaded ({first_line(exc)})"]) from exc
        for warning in warnings:
            log.warning("config.client_keys_ignored", detail=warning)
        return settings

    async def _apply(self, new: Settings, gone: list[str], changed: list[str], added: list[str]) -> None:
        """Stop what is gone or changed, then start what changed or was added (under their locks)."""
        was_live = {n: self._extensions[n].state.is_live for n in changed}
        async with anyio.create_task_group() as stoppers:
            for name in (*gone, *changed):
                stoppers.start_soon(self._extensions[name].stop)
                replaced = self._instances.pop(name)
                replaced.replace()  # its waiting clients ask the new instances
                stoppers.start_soon(replaced.stop_all)
        for name in gone:
            del self._extensions[name]
            del self._name_locks[name]  # a waiter still holding it finds the name gone
            self.metrics.forget(name)
        for name in (*changed, *added):
            self._extensions[name] = self._make(name, new.extensions[name])
            self._instances[name] = self._instances_of(name, new.extensions[name])
            expect_launch(self._extensions[name], was_live=was_live.get(name, False))
        # Keep the daemon's own order the config's order.
        self._extensions = {n: self._extensions[n] for n in new.extensions}
        for name in (*changed, *added):
            await self._launch(self._extensions[name], was_live=was_live.get(name, False))


def expect_launch(ext: Extension, *, was_live: bool = False) -> None:
    """Let calls wait for what :meth:`Daemon._launch` is about to start (not a learning run)."""
    if was_live or (ext.config.autostart and not ext.config.on_demand):
        ext.expect_start()
