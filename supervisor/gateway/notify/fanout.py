"""Sending to many clients: list_changed, log messages and resource updates, never waiting on one.

:class:`Fanout` keeps a :class:`~.clients.Downstream` for each handshake-era client, from its
first request until its connection closes, each served by a task of its own, and feeds
2026-07-28 clients through the SDK's subscription bus (``subscriptions/listen``, whose resource
subscriptions it counts with the others: :meth:`Fanout.hold`) and, for log messages, through the
:class:`~.requestlogs.RequestLog` of each request that asked. Producers call it synchronously;
everything it holds is bounded by the number of connections and requests.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import structlog
from mcp.server import ServerRequestContext
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)

from supervisor.gateway.asks import parked
from supervisor.gateway.notify.bus import Bus
from supervisor.gateway.notify.downstream import MAX_LOG_DATA, MAX_SUBSCRIPTIONS, Downstream
from supervisor.gateway.notify.requestlogs import FLUSH_SECONDS, RequestLog, asked_levels
from supervisor.gateway.owner import TaskOwner
from supervisor.gateway.session import session_of

__all__ = ("Fanout",)

log = structlog.get_logger(__name__)

_EVENTS = {"tools": ToolsListChanged(), "prompts": PromptsListChanged(), "resources": ResourcesListChanged()}


class Fanout(TaskOwner):
    """The gateway's clients, as one audience. :meth:`run` owns every per-client task."""

    def __init__(self) -> None:
        self.bus = Bus()  # 2026-07-28 clients: subscriptions/listen
        self._clients: dict[Downstream, None] = {}  # each handshake-era client's, in arrival order
        self._subscribers: dict[str, int] = {}  # exposed URI -> clients and listen streams holding it
        self._held: dict[object, int] = {}  # a 2026-07-28 client -> URIs its listen streams hold
        self._request_logs: dict[int, set[RequestLog]] = {}  # id() of an Extension -> requests in it
        # URIs updated, not yet published to the bus, with whose they are (None: everyone's).
        self._updated: dict[tuple[str, object], None] = {}
        self.on_released: Callable[[str], None] | None = None  # nobody holds this URI any more (sync)
        self._updates_waiting = anyio.Event()

    def __len__(self) -> int:
        return len(self._clients)

    async def _serve(self) -> None:
        await self._publish_updates()

    # ---- who is listening ----------------------------------------------------------------

    def client(self, ctx: ServerRequestContext[Any]) -> Downstream | None:
        """The notifications of the handshake-era client behind *ctx* (its Session's), tracked from
        its first request until it closes; None for 2026-07-28 clients (subscriptions/listen)."""
        session = session_of(ctx)
        if session.notifications is not None or self._tg is None:
            return session.notifications
        connection = session.connection
        if connection is None or session.closed:
            return None  # 2026-07-28 clients get their events through subscriptions/listen
        client = session.notifications = Downstream(connection, ctx.request, session)
        scope = anyio.CancelScope()
        self._clients[client] = None
        session.on_close(functools.partial(self._forget, client, scope))

        async def serve() -> None:
            with scope:
                try:
                    await client.run()
                except Exception:  # a bug of ours: this client hears no more, the daemon goes on
                    log.exception("gateway.client_notifier_crashed")

        self._tg.start_soon(serve)
        return client

    def downstreams(self) -> list[Downstream]:
        """Every handshake-era client's notifications, in arrival order (each knows its Session)."""
        return list(self._clients)

    def _forget(self, client: Downstream, scope: anyio.CancelScope) -> None:
        scope.cancel()
        if self._clients.pop(client, False) is None:
            for uri in client.subscriptions:
                self._unref(uri)

    def subscribe(self, client: Downstream, uri: str) -> bool:
        """Record *client*'s subscription; False when it holds :data:`MAX_SUBSCRIPTIONS` already."""
        if uri in client.subscriptions:
            return True
        if len(client.subscriptions) >= MAX_SUBSCRIPTIONS:
            return False
        client.subscriptions.add(uri)
        self._subscribers[uri] = self._subscribers.get(uri, 0) + 1
        return True

    def hold(self, key: object, uris: list[str]) -> Callable[[], None] | None:
        """Count a listen stream's subscriptions (client *key*'s); None if that makes more than
        :data:`MAX_SUBSCRIPTIONS` for it. Returns the (idempotent) release, for when the stream ends.
        """
        held = self._held.get(key, 0) + len(uris)
        if held > MAX_SUBSCRIPTIONS:
            return None
        self._held[key] = held
        for uri in uris:
            self._subscribers[uri] = self._subscribers.get(uri, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            if (left := self._held.pop(key, 0) - len(uris)) > 0:
                self._held[key] = left
            for uri in uris:
                self._unref(uri)

        return release

    def unsubscribe(self, client: Downstream, uri: str) -> None:
        if uri in client.subscriptions:
            client.subscriptions.discard(uri)
            self._unref(uri)

    def subscribed(self) -> list[str]:
        """Every URI some client is subscribed to."""
        return list(self._subscribers)

    def subscribed_by(self, session: object) -> list[str]:
        """The URIs the handshake-era client of *session* is subscribed to (by ``resources/subscribe``)."""
        return [uri for client in self._clients if client.session is session for uri in client.subscriptions]

    def held(self, uri: str) -> bool:
        """Whether some client is subscribed to *uri*."""
        return uri in self._subscribers

    def _unref(self, uri: str) -> None:
        remaining = self._subscribers.get(uri, 0) - 1
        if remaining > 0:
            self._subscribers[uri] = remaining
        elif self._subscribers.pop(uri, None) is not None and self.on_released is not None:
            self.on_released(uri)

    # ---- what they hear ------------------------------------------------------------------

    async def lists_changed(self, kinds: set[str]) -> None:
        for client in self._clients:
            client.lists_changed(kinds)
        for kind in sorted(kinds):
            await self.bus.publish(_EVENTS[kind])

    def log(
        self,
        level: str,
        data: Any,
        logger: str,
        source: object = None,
        hears: Callable[[Downstream], bool] = lambda client: True,
    ) -> None:
        """A log message of Extension *source*: to the requests in it that asked, and to the
        clients that asked and *hears* lets hear it (what their view shows; their own instances)."""
        clients = [client for client in self._clients if client.wants(level) and hears(client)]
        requests = [request for request in self._request_logs.get(id(source), ()) if level in request.levels]
        if not clients and not requests:
            return
        data = _bounded(data)
        for client in clients:
            client.log(level, data, logger)
        for request in requests:
            request.offer(level, data, logger)

    @asynccontextmanager
    async def request_logs(self, ctx: ServerRequestContext[Any], source: object) -> AsyncIterator[None]:
        """While in this context, *source*'s log messages go to the 2026-07-28 request of *ctx* if it
        asked for them; on exit those already queued go out first (within :data:`FLUSH_SECONDS`).
        """
        levels = asked_levels(ctx)
        if not levels or self._tg is None:
            yield
            return
        sink = RequestLog(levels, parked.attending(ctx))
        sinks = self._request_logs.setdefault(id(source), set())
        sinks.add(sink)
        self._tg.start_soon(sink.run)
        try:
            yield
        finally:
            sinks.discard(sink)
            if not sinks and self._request_logs.get(id(source)) is sinks:
                del self._request_logs[id(source)]
            sink.close()
            try:
                with anyio.move_on_after(FLUSH_SECONDS):  # its log messages before its result
                    await sink.done.wait()
            finally:
                sink.scope.cancel()

    def resource_updated(self, uri: str, only: object = None) -> None:
        """*uri* changed: tell its subscribers, handshake-era clients and 2026-07-28 listen
        streams (with *only*, that client's alone: the owner of a per-client instance)."""
        if uri in self._subscribers:
            for client in self._clients:
                if only is None or client.session is only:
                    client.resource_updated(uri)
        if len(self._updated) < MAX_SUBSCRIPTIONS:  # for 2026-07-28 listeners; they filter by URI
            self._updated[uri, only] = None
            self._updates_waiting.set()

    async def _publish_updates(self) -> None:
        """Resource updates to the listen streams, from this one task: a flood stays bounded."""
        while True:
            await self._updates_waiting.wait()
            self._updates_waiting = anyio.Event()
            updated, self._updated = self._updated, {}
            for uri, only in updated:
                await self.bus.publish(ResourceUpdated(uri=uri), only)


def _bounded(data: Any) -> Any:
    """A child's log data as sent on, cut to :data:`MAX_LOG_DATA` characters of JSON if longer."""
    text = data if isinstance(data, str) else json.dumps(data, default=str)
    if len(text) <= MAX_LOG_DATA:
        return data
    return f"{text[:MAX_LOG_DATA]}... ({len(text) - MAX_LOG_DATA} characters cut by mcp-supervisor)"
