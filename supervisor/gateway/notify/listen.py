"""``subscriptions/listen`` for 2026-07-28 clients, with resource subscriptions taken in the children.

The SDK's :class:`~mcp.server.subscriptions.ListenHandler` acknowledges, filters and delivers
the stream's events. :class:`Listen` goes before it: the exposed URIs the stream names are
subscribed to in their extensions (as ``resources/subscribe`` of a handshake-era client is)
and counted with every other client's (:meth:`.fanout.Fanout.hold`), so that a restarted child
is subscribed again and an extension holding one does not idle-stop; the stream's end releases
them. At most :data:`~.clients.MAX_SUBSCRIPTIONS` URIs per client (an mcp.sock connection; over
HTTP, where 2026-07-28 has no sessions, a stream), over all its streams.

Streams are counted per client too (:data:`MAX_LISTENS`), so that no client can take the slots
of the others; over HTTP, where a stream has no client to count it by, all streams share
:data:`MAX_HTTP_LISTENS`, and mcp.sock clients never wait for those.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.subscriptions import ListenHandler

from supervisor.gateway.notify.bus import LISTENER
from supervisor.gateway.notify.downstream import MAX_SUBSCRIPTIONS
from supervisor.gateway.notify.fanout import Fanout
from supervisor.gateway.session import MAX_CONNECTIONS, Session, session_of

__all__ = ("MAX_HTTP_LISTENS", "MAX_LISTENS", "Listen")

MAX_LISTENS = 16  # listen streams open at once per mcp.sock client
MAX_HTTP_LISTENS = 256  # ... and over HTTP, all together
_HTTP = "http"  # the pool HTTP streams are counted in

Subscribe = Callable[[ServerRequestContext[Any], str], Awaitable[None]]  # (ctx, exposed URI); raises


class Listen:
    """The ``subscriptions/listen`` handler: *subscribe* takes one exposed URI in its child."""

    def __init__(self, fanout: Fanout, subscribe: Subscribe) -> None:
        self._fanout = fanout
        self._subscribe = subscribe
        self._handler = ListenHandler(
            fanout.bus, max_subscriptions=MAX_LISTENS * MAX_CONNECTIONS + MAX_HTTP_LISTENS
        )
        self._open: dict[Session | str, int] = {}  # an mcp.sock client, or _HTTP -> its streams open

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        session = session_of(ctx)
        own = session.listener == "unix"  # over HTTP (no sessions at 2026-07-28) streams share one bound
        pool: Session | str = session if own else _HTTP
        limit = MAX_LISTENS if own else MAX_HTTP_LISTENS
        if self._open.get(pool, 0) >= limit:
            whose = "per client" if own else "over HTTP in all"
            raise MCPError(types.INVALID_REQUEST, f"at most {limit} listen streams at once {whose}")
        self._open[pool] = self._open.get(pool, 0) + 1
        try:
            # The client: its mcp.sock connection's; over HTTP the stream's own Session.
            return await self._serve(ctx, params, session)
        finally:
            if left := self._open[pool] - 1:
                self._open[pool] = left
            else:
                del self._open[pool]

    async def _serve(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams, client: object
    ) -> types.SubscriptionsListenResult:
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        if not uris:
            return await self._handler(ctx, params)  # list_changed events are everyone's
        release = self._fanout.hold(client, uris)
        if release is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"at most {MAX_SUBSCRIPTIONS} resource subscriptions per client, over all its listen streams",
            )
        try:
            for uri in uris:  # one refused (unknown, hidden, its extension down): the stream is refused
                await self._subscribe(ctx, uri)
            listener = LISTENER.set(client)  # whose stream the bus subscribes: see notify.bus
            try:
                return await self._handler(ctx, params)
            finally:
                LISTENER.reset(listener)
        finally:
            release()  # the children keep theirs: nobody is routed updates nobody holds
