"""``subscriptions/listen`` for 2026-07-28 clients, with resource subscriptions taken in the children.

The SDK's :class:`~mcp.server.subscriptions.ListenHandler` acknowledges, filters and delivers
the stream's events. :class:`Listen` goes before it: the exposed URIs the stream names are
subscribed to in their extensions (as ``resources/subscribe`` of a handshake-era client is)
and counted with every other client's (:meth:`.fanout.Fanout.hold`), so that a restarted child
is subscribed again and an extension holding one does not idle-stop; the stream's end releases
them. At most :data:`~.clients.MAX_SUBSCRIPTIONS` URIs per client (an mcp.sock connection; over
HTTP, where 2026-07-28 has no sessions, a stream), over all its streams.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.subscriptions import ListenHandler

from . import passthrough
from .clients import MAX_SUBSCRIPTIONS
from .fanout import Fanout

__all__ = ("Listen",)

Subscribe = Callable[[ServerRequestContext[Any], str], Awaitable[None]]  # (ctx, exposed URI); raises


class Listen:
    """The ``subscriptions/listen`` handler: *subscribe* takes one exposed URI in its child."""

    def __init__(self, fanout: Fanout, subscribe: Subscribe) -> None:
        self._fanout = fanout
        self._subscribe = subscribe
        self._handler = ListenHandler(fanout.bus)

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        if not uris:
            return await self._handler(ctx, params)
        # The client: its mcp.sock connection; over HTTP (no sessions at 2026-07-28) the stream itself.
        client = passthrough.current_link() or ctx.session._connection  # no public accessor (SDK 2.3)
        release = self._fanout.hold(client, uris)
        if release is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"at most {MAX_SUBSCRIPTIONS} resource subscriptions per client, over all its listen streams",
            )
        try:
            for uri in uris:  # one refused (unknown, hidden, its extension down): the stream is refused
                await self._subscribe(ctx, uri)
            return await self._handler(ctx, params)
        finally:
            release()  # the children keep theirs: nobody is routed updates nobody holds
