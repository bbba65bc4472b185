"""Per-client instances: one child per gateway client for ``instances: per-client`` extensions.

A stateful server (a browser, a shell) shared by two clients mixes their state. Per client, each
gateway connection gets an :class:`~supervisor.extension.Extension` of its own (its own child,
spool directory and containment), made on that client's first use and started by its first
call like an on-demand one. Its watcher runs in the daemon's task group like any other; the
connection's close only asks it to stop (sync), the watcher tears the tree down, and the
daemon's shutdown waits for it. The control socket's calls use the shared instance (the
daemon's own Extension of that name), whose listing is also the one clients see.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import anyio

from .errors import ExtensionUnavailable
from .extension import Extension

__all__ = ("Client", "Instances")


class Client(Protocol):
    """A gateway client connection, as far as its instances care: it says when it closes."""

    def on_close(self, callback: Callable[[], None]) -> None: ...


class Instances:
    """The per-client instances of extension *name*: at most *limit* at once, retiring ones included."""

    def __init__(self, name: str, make: Callable[[], Extension], limit: int) -> None:
        self.name = name
        self.limit = limit
        self._make = make
        self._by_client: dict[Client, Extension] = {}
        self._retiring: list[Extension] = []  # asked to stop; their trees may still be going

    def of(self, client: Client) -> Extension:
        """*client*'s own instance, made on its first use (not started: its first call starts it).

        Error handling: :class:`ExtensionUnavailable` (retryable) when *limit* instances exist.
        """
        ext = self._by_client.get(client)
        if ext is not None:
            return ext
        self._retiring = [e for e in self._retiring if e.snapshot().state.is_live]
        if len(self._by_client) + len(self._retiring) >= self.limit:
            detail = f"all {self.limit} per-client instances are in use (max_instances)"
            raise ExtensionUnavailable(self.name, "busy", retryable=True, detail=detail)
        ext = self._by_client[client] = self._make()
        client.on_close(functools.partial(self._release, client))
        return ext

    def _release(self, client: Client) -> None:
        ext = self._by_client.pop(client, None)
        if ext is not None:
            ext.request_stop()  # the watcher, in the daemon's task group, tears the tree down
            self._retiring.append(ext)

    def all(self) -> list[Extension]:
        """Every instance whose child may still exist: the clients' ones, then the retiring ones."""
        return [*self._by_client.values(), *(e for e in self._retiring if e.snapshot().state.is_live)]

    async def stop_all(self) -> None:
        """Stop every instance; returns once their process trees are gone."""
        for client in list(self._by_client):
            self._release(client)
        async with anyio.create_task_group() as stoppers:
            for ext in self._retiring:
                stoppers.start_soon(ext.stop)
        self._retiring = []
