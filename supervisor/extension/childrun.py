"""One run of a stdio child, as the watcher serves it: spawned, connected, judged by its exit.

:func:`open_child` launches the child (or takes the run the daemon's head start launched) and
connects to its stdio; :class:`ChildRun` says what the watcher needs of that kind: its pid, its
tree's CPU time (a start past its deadline goes on while busy), how a failed start or the run's
end reads (by the exit status, with the last stderr line), and its guard (``memory_max``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup
from mcp import MCPError

from supervisor.child import connection as transport
from supervisor.config.extension import StdioConfig
from supervisor.errors import first_line
from supervisor.extension import launch, startup
from supervisor.extension.backoff import Outcome, OutcomeKind
from supervisor.extension.state import ExitStatus, one_line
from supervisor.process import sandbox
from supervisor.process import usage as resources
from supervisor.process.children import ChildProcess
from supervisor.process.sandbox import caches

__all__ = ("ChildRun", "open_child")

log = structlog.get_logger(__name__)


class ChildRun:
    """A connected child's run (see the module). *last_stderr*: the run's last stderr line so far."""

    def __init__(
        self,
        connection: transport.Connection,
        launched: launch.Launched,
        last_stderr: Callable[[], str | None],
        explain: str | None,
        confinement: sandbox.Sandbox | None,
    ) -> None:
        self.upstream = connection
        self._confinement = confinement
        self.child: ChildProcess = connection.child
        self._scratch = launched.jail.scratch if launched.jail is not None else ()
        self._last_stderr = last_stderr
        self._explain = explain  # where to see what a confined one may reach

    @property
    def pid(self) -> int | None:
        return self.child.pid

    async def cpu_seconds(self) -> float | None:
        child = self.child
        return await startup.tree_cpu(child.pid, child.marker, child.cgroup)

    async def start_failed(self, exc: Exception) -> Outcome:
        """A handshake that failed: an exit during startup explains it best."""
        if self.upstream.ended.is_set() or isinstance(exc, MCPError):
            with anyio.move_on_after(transport.EXIT_FLUSH_GRACE):
                await self.child.exited.wait()
        exit_status = _exit_status(self.child)
        error = f"{exit_status.describe()} during startup" if exit_status else first_line(exc, typed=False)
        if exit_status is not None:
            error += await self._said_last()
        return Outcome(OutcomeKind.START_FAILED, error=error, exit=exit_status)

    def ended(self, uptime: float) -> Outcome:
        """How a run that served ended: its exit, or (still running) the connection's failure."""
        child = self.child
        if child.returncode is None:  # stdio broke or a message was too large: it gets killed
            return Outcome(OutcomeKind.CRASHED, uptime, error=self.upstream.failure)
        exit_status = _exit_status(child)
        assert exit_status is not None
        if child.returncode == 0:
            return Outcome(OutcomeKind.CLEAN_EXIT, uptime, exit=exit_status)
        return Outcome(OutcomeKind.CRASHED, uptime, error=exit_status.describe(), exit=exit_status)

    def guard(self, helpers: TaskGroup, config: StdioConfig, exceeded: Callable[[str], None]) -> None:
        """``memory_max``, when set: its tree (and its scratch tmpfs) over it ends the run; and a
        confined one's ``cache_max``: its private package cache growing past it does too."""
        confined = self._confinement
        if confined is not None and confined.caching and confined.spec.cache_max is not None:
            assert confined.cache is not None
            helpers.start_soon(caches.enforce, confined.cache, confined.spec.cache_max, self._cache_exceeded)
        if config.memory_max is not None:
            child = self.child
            enforce = functools.partial(resources.enforce_memory_max, scratch=self._scratch)
            helpers.start_soon(enforce, child.pid, child.marker, child.cgroup, config.memory_max, exceeded)

    def _cache_exceeded(self, error: str) -> None:
        log.warning("extension.cache_exceeded", error=error)
        self.upstream.end(error)

    async def _said_last(self) -> str:
        """``: LINE`` when the child that exited during startup said why on stderr (its last line,
        once the pipe is read), and for a confined one where to see what it may reach; or ""."""
        with anyio.move_on_after(transport.EXIT_FLUSH_GRACE):
            while not self.child.stderr.drained():  # noqa: ASYNC110 - a pipe's emptiness fires no event
                await anyio.sleep(0.001)
        await anyio.lowlevel.checkpoint()  # the pump hands on what it read last
        last = self._last_stderr()
        if last is None:
            return ""
        said = f": {one_line(last, 200)}"
        return said + (f" ({self._explain})" if self._explain else "")


@asynccontextmanager
async def open_child(
    name: str,
    config: StdioConfig,
    launched: launch.Launched | None,
    *,
    marker_prefix: str,
    env: launch.Environment,
    credentials: str | None,
    confinement: sandbox.Sandbox | None,
    last_stderr: Callable[[], str | None],
    **connect: Any,
) -> AsyncIterator[ChildRun]:
    """Launch a run of *config* (or take *launched*, the head start's), connect to its stdio and
    yield the :class:`ChildRun`; *connect* goes to :func:`supervisor.child.connection.connect`.

    Resource handling: the tree ends with the context (the connection's exit, or a discard when
    no connection took it over), and its sandbox directory with it.

    Error handling: :class:`~supervisor.errors.SpawnError` as :func:`launch.launch` raises it.
    """
    try:
        if launched is None:
            launched = await launch.launch(
                config,
                env=env,
                credentials=credentials,
                confinement=confinement,
                marker=launch.run_marker(marker_prefix, name),
            )
        async with transport.connect(
            launched.child,
            stop_timeout=config.stop_timeout,
            max_message_bytes=config.max_message_bytes,
            stdin_timeout=config.call_timeout,  # by then every call queued behind has timed out
            **connect,
        ) as connection:
            explain = None
            if confinement is not None:
                explain = f"confined: `mcp-supervisor check-config --explain {name}` shows what it may reach"
            yield ChildRun(connection, launched, last_stderr, explain, confinement)
    finally:
        if launched is not None:  # the tree if no connection took it over, then its directory
            await launch.discard(launched)


def _exit_status(child: ChildProcess) -> ExitStatus | None:
    if child.returncode is None:
        return None
    return ExitStatus(child.returncode, at=child.exited_at or datetime.now(UTC))
