"""One run of a remote server, as the watcher serves it: connected, judged by why it ended.

:func:`open_remote` reads the headers' secrets and opens the transport; :class:`RemoteRun` says
what the watcher needs of that kind. It has no pid and no tree: a start past its deadline has
nothing to be busy with, and every end of a run (a refused connection, a broken stream, a lost
session, a guard) is a crash the restart policy backs off from, never a clean exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from anyio.abc import TaskGroup

from supervisor.config import secrets as secretrefs
from supervisor.config.extension import RemoteConfig
from supervisor.errors import first_line
from supervisor.extension.backoff import Outcome, OutcomeKind
from supervisor.remote.connection import RemoteConnection, connect

__all__ = ("RemoteRun", "open_remote")


class RemoteRun:
    """A connected remote run (see the module)."""

    pid: int | None = None

    def __init__(self, connection: RemoteConnection) -> None:
        self.upstream = connection

    async def cpu_seconds(self) -> float | None:
        return None  # nothing of it runs here: past the deadline, the start ends

    async def start_failed(self, exc: Exception) -> Outcome:
        """A handshake that failed: the transport's reason first (a refused connection, a 4xx)."""
        error = self.upstream.failure or first_line(exc, typed=False)
        return Outcome(OutcomeKind.START_FAILED, error=f"{error} ({self.upstream.url})")

    def ended(self, uptime: float) -> Outcome:
        return Outcome(OutcomeKind.CRASHED, uptime, error=self.upstream.failure or "the connection ended")

    def guard(self, helpers: TaskGroup, config: Any, exceeded: Any) -> None:
        """No guard of its own: liveness (``ping_interval``) is every kind's."""


@asynccontextmanager
async def open_remote(
    config: RemoteConfig, *, credentials: str | None, **connect_options: Any
) -> AsyncIterator[RemoteRun]:
    """Open a run of *config* and yield its :class:`RemoteRun`; *connect_options* go to
    :func:`supervisor.remote.connection.connect`.

    Error handling: :class:`~supervisor.errors.SpawnError` (permanent) for a header whose secret
    cannot be read.
    """
    headers: Mapping[str, str] = await secretrefs.resolve(config.headers, credentials, field="headers")
    async with connect(
        config.url,
        kind=config.type,
        headers=headers,
        max_message_bytes=config.max_message_bytes,
        stop_timeout=config.stop_timeout,
        **connect_options,
    ) as connection:
        yield RemoteRun(connection)
