"""One object per downstream client connection: what it asked for and what it is still owed.

A :class:`Downstream` holds one client's log level, resource subscriptions and pending
notifications. Producers (the gateway's change announcer, an extension's log messages) only
mark it, synchronously and in bounded space; its own task, :meth:`Downstream.run`, does the
sending, so a client that stops reading delays nobody but itself.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import anyio
import structlog
from mcp.server.connection import Connection

__all__ = (
    "LOG_LEVELS",
    "MAX_LOG_DATA",
    "MAX_PENDING_LOGS",
    "MAX_SUBSCRIPTIONS",
    "Downstream",
)

log = structlog.get_logger(__name__)

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
MAX_PENDING_LOGS = 256  # per client; past it the oldest are dropped and counted
MAX_SUBSCRIPTIONS = 1_000  # resource URIs one client may subscribe to
MAX_LOG_DATA = 16 << 10  # characters of one log message's data kept for clients; the rest is cut


class Downstream:
    """The gateway's state for one client connection (an SDK server ``Connection``)."""

    def __init__(self, connection: Connection, context: Any = None, session: Any = None) -> None:
        self.connection = connection
        self.context = context  # its first request's context: which view (profile) it has
        self.session = session  # whose it is (gateway.session.Session)
        self.log_level: str | None = None  # None: the client never asked for log messages
        self.subscriptions: set[str] = set()  # exposed resource URIs
        self.dropped_logs = 0
        self._list_changed: set[str] = set()
        self._updated: dict[str, None] = {}  # resource URIs, insertion-ordered, at most MAX_SUBSCRIPTIONS
        self._logs: deque[tuple[str, Any, str | None]] = deque(maxlen=MAX_PENDING_LOGS)
        self._wake = anyio.Event()

    # ---- producers: sync, bounded, never wait -------------------------------------------

    def lists_changed(self, kinds: set[str]) -> None:
        self._list_changed |= kinds
        self._wake.set()

    def wants(self, level: str) -> bool:
        return self.log_level is not None and LOG_LEVELS.index(level) >= LOG_LEVELS.index(self.log_level)

    def log(self, level: str, data: Any, logger: str | None) -> None:
        """Queue a log message (its *data* already cut to :data:`MAX_LOG_DATA`) if this client wants it."""
        if not self.wants(level):
            return
        if len(self._logs) == self._logs.maxlen:
            self.dropped_logs += 1
        self._logs.append((level, data, logger))
        self._wake.set()

    def resource_updated(self, uri: str) -> None:
        if uri in self.subscriptions:
            self._updated[uri] = None
            self._wake.set()

    # ---- the client's own task ----------------------------------------------------------

    async def run(self) -> None:
        """Send what is owed, in bursts; ends when cancelled (the connection closed)."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            kinds, self._list_changed = self._list_changed, set()
            updated, self._updated = list(self._updated), {}
            logs = list(self._logs)
            self._logs.clear()
            for kind in sorted(kinds):
                await _SEND_LIST_CHANGED[kind](self.connection)
            for uri in updated:
                await self.connection.send_resource_updated(uri)
            for level, data, logger in logs:
                await self.connection.log(level, data, logger)  # type: ignore[arg-type]


_SEND_LIST_CHANGED = {
    "tools": Connection.send_tool_list_changed,
    "prompts": Connection.send_prompt_list_changed,
    "resources": Connection.send_resource_list_changed,
}
