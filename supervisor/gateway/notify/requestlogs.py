"""A child's log messages for 2026-07-28 clients: on the stream of the request that asked.

At 2026-07-28 there is no ``logging/setLevel``: a client asks for log messages per request,
with ``io.modelcontextprotocol/logLevel`` in the request's ``_meta``, and gets those at or
above that level on that request's own stream, while it is served. Children speak the
handshake era over stdio, whose notifications name no request: a log message a child sends
while such a request is in flight to it is that request's (two at once both get it).

A :class:`RequestLog` is one such request's share: producers :meth:`~RequestLog.offer` entries
synchronously, in bounded space (the oldest dropped past :data:`~.clients.MAX_PENDING_LOGS`);
its own task (:meth:`~RequestLog.run`) sends them, so a client that stops reading delays
nobody but itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.server import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from supervisor.gateway.notify.downstream import LOG_LEVELS, MAX_PENDING_LOGS

__all__ = ("FLUSH_SECONDS", "RequestLog", "asked_levels")

log = structlog.get_logger(__name__)

FLUSH_SECONDS = 2.0  # how long a finished request waits for its log messages to go out first
Target = Callable[[], ServerRequestContext[Any] | None]  # the request they go to now, if any


def asked_levels(ctx: ServerRequestContext[Any] | None) -> frozenset[str]:
    """The levels a 2026-07-28 request asked for in its ``_meta`` (none: it did not ask). Pure."""
    if ctx is None or ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return frozenset()
    level = (ctx.meta or {}).get(types.LOG_LEVEL_META_KEY)
    return frozenset(LOG_LEVELS[LOG_LEVELS.index(level) :]) if level in LOG_LEVELS else frozenset()


class RequestLog:
    """One request's log messages on their way to it.

    Args:
        levels: the levels it asked for (producers offer only those).
        target: the request to send to when sending; a call parked for input
            (:mod:`.inputrequired`) goes on under the retry that attends it, and has none meanwhile.
    """

    def __init__(self, levels: frozenset[str], target: Target) -> None:
        self.levels = levels
        self.dropped = 0
        self.done = anyio.Event()
        self.scope = anyio.CancelScope()
        self._target = target
        self._entries: deque[tuple[str, Any, str | None]] = deque(maxlen=MAX_PENDING_LOGS)
        self._wake = anyio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def offer(self, level: str, data: Any, logger: str | None) -> None:
        """Queue an entry (its *data* already cut to :data:`~.clients.MAX_LOG_DATA`) if asked for. Sync."""
        if level not in self.levels or self._closed:
            return
        if len(self._entries) == self._entries.maxlen:
            self.dropped += 1
        self._entries.append((level, data, logger))
        self._wake.set()

    def close(self) -> None:
        """No more entries: :meth:`run` sends those queued, then ends."""
        self._closed = True
        self._wake.set()

    async def run(self) -> None:
        """Send what is queued until closed and drained, or cancelled (:attr:`scope`)."""
        with self.scope:
            while not (self._closed and not self._entries):
                await self._wake.wait()
                self._wake = anyio.Event()
                while self._entries:
                    try:
                        await self._send(*self._entries.popleft())
                    except Exception as exc:  # its request was answered, or its client went, meanwhile:
                        self.dropped += 1  # that entry is lost, not the ones for a later retry's stream
                        log.debug("gateway.request_log_lost", error=str(exc)[:200])
        if self.dropped:
            log.info("gateway.request_logs_dropped", count=self.dropped)
        self.done.set()

    async def _send(self, level: str, data: Any, logger: str | None) -> None:
        ctx = self._target()
        if ctx is None or level not in asked_levels(ctx):  # parked; or the retry asked for less
            return
        params = types.LoggingMessageNotificationParams(level=level, data=data, logger=logger)  # type: ignore[arg-type]
        await ctx.session.send_notification(
            types.LoggingMessageNotification(params=params), related_request_id=ctx.request_id
        )
