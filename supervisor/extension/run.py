"""A run: one upstream kind's connection as the watcher serves it, declared.

The watcher opens a run (:func:`supervisor.extension.childrun.open_child` or
:func:`supervisor.extension.remoterun.open_remote`), serves its :attr:`Run.upstream` until it
ends, and asks the run only what differs by kind: its pid, whether a slow start is busy, how a
failed start or an end reads, and its own guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from supervisor.extension.backoff import Outcome
    from supervisor.extension.upstream import Upstream

__all__ = ("Run",)


class Run(Protocol):
    """One run of an extension, whatever its kind (see the module)."""

    @property
    def upstream(self) -> Upstream:
        """The session the run talks MCP over."""

    @property
    def pid(self) -> int | None:
        """Its process (None: nothing of it runs here)."""

    async def cpu_seconds(self) -> float | None:
        """Its CPU time so far (None: unknown, taken as idle): a start past its deadline goes on
        while busy."""

    async def start_failed(self, exc: Exception) -> Outcome:
        """How a handshake that raised *exc* reads."""

    def ended(self, uptime: float) -> Outcome:
        """How a run that served for *uptime* s and then ended reads."""

    def guard(self, helpers: TaskGroup, config: Any, exceeded: Callable[[str], None]) -> None:
        """Start its own guard in *helpers*, if *config* sets one; *exceeded* ends the run."""
