"""The bus of the 2026-07-28 listen streams: the SDK's, with each stream's client known.

The SDK's :class:`~mcp.server.subscriptions.ListenHandler` subscribes a stream to its bus
without saying whose the stream is. :class:`~.listen.Listen` names the client in
:data:`LISTENER` around the handler, and :class:`Bus` keeps it beside the stream's listener, so
that an update from a per-client instance reaches its owner's streams alone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

import anyio
import structlog
from mcp.shared.subscriptions import ServerEvent

__all__ = ("LISTENER", "Bus")

log = structlog.get_logger(__name__)

LISTENER: ContextVar[object] = ContextVar("LISTENER", default=None)  # the client of a listen stream


class Bus:
    """An in-process :class:`~mcp.server.subscriptions.SubscriptionBus` whose events may be for
    one client only. Listeners are synchronous and called in subscription order."""

    def __init__(self) -> None:
        # A token per subscription: the same callable may be registered twice.
        self._listeners: dict[object, tuple[object, Callable[[ServerEvent], None]]] = {}

    async def publish(self, event: ServerEvent, only: object = None) -> None:
        """*event* to every listener (with *only*, to the listen streams of that client alone)."""
        for client, listener in list(self._listeners.values()):
            if only is not None and client is not only:
                continue
            try:
                listener(event)
            except Exception:  # one bad listener must not starve the others
                log.exception("gateway.listener_failed")
        await anyio.lowlevel.checkpoint()  # the streams drain between the events of a burst

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        token = object()
        self._listeners[token] = (LISTENER.get(), listener)
        return lambda: self._listeners.pop(token, None)  # type: ignore[return-value]
