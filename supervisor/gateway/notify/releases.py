"""Resource subscriptions nobody holds any more: the child is sent ``resources/unsubscribe``.

Clients of both eras hold exposed URIs (:class:`~.fanout.Fanout` counts them); when the last
holder lets go (a ``resources/unsubscribe``, a disconnect, a listen stream's end), the owning
extension's running child is told, from one task per extension (:class:`Releases`), so that
it stops sending updates nobody is routed. A release is sent only if nobody holds the URI by
then, and taking that URI waits for a release of it in progress (:meth:`Releases.taking`): a
child never ends unsubscribed from a URI a client holds. Nothing else waits: takes of one URI
run side by side (a take is counted as held before it starts, so no release begins during it),
and other URIs never wait for it, however slowly the child answers. Per-client instances are
left alone (theirs end with their client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import mcp_types as types
import structlog

from supervisor.extension.state import State
from supervisor.gateway.names import parse_uri
from supervisor.gateway.owner import TaskOwner

if TYPE_CHECKING:
    from supervisor.extension.served import Served

__all__ = ("Releases",)

log = structlog.get_logger(__name__)

TIMEOUT = 10.0  # seconds one unsubscribe may take; then the next


class Releases(TaskOwner):
    """The children's subscriptions to let go of. *find* an extension by name; *held*: whether a
    client holds an exposed URI."""

    def __init__(self, find: Callable[[str], Served | None], held: Callable[[str], bool]) -> None:
        self._find, self._held = find, held
        self._pending: dict[str, dict[str, str]] = {}  # extension -> exposed URI -> the child's
        self._releasing: dict[str, anyio.Event] = {}  # exposed URI -> set once its release ended

    @asynccontextmanager
    async def taking(self, uri: str) -> AsyncIterator[None]:
        """Around taking exposed *uri* in its child, once held: after a release of it in progress
        (at most :data:`TIMEOUT`), so that the release cannot land after the take."""
        while (releasing := self._releasing.get(uri)) is not None:
            await releasing.wait()
        yield

    def released(self, uri: str) -> None:
        """Nobody holds exposed *uri* any more. Sync."""
        target = parse_uri(uri)
        ext = self._find(target[0]) if target is not None else None
        if target is None or ext is None or self._tg is None or ext.config.instances == "per-client":
            return
        if ext.state is not State.RUNNING:
            return  # a new run takes only what is held
        pending = self._pending.get(ext.name)
        if pending is None:
            pending = self._pending[ext.name] = {}
            self._tg.start_soon(self._release, ext)
        pending[uri] = target[1]

    async def _release(self, ext: Served) -> None:
        try:
            while pending := self._pending.get(ext.name):
                uri, original = next(iter(pending.items()))
                del pending[uri]
                if self._held(uri) or ext.state is not State.RUNNING:
                    continue
                done = self._releasing[uri] = anyio.Event()  # no await since the check: nobody took it
                request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=original))
                try:
                    with anyio.fail_after(TIMEOUT):
                        await ext.request(request, types.EmptyResult)
                except Exception as exc:  # TimeoutError, an MCP error, the extension gone
                    log.info("gateway.unsubscribe_failed", extension=ext.name, error=str(exc)[:300])
                finally:
                    del self._releasing[uri]
                    done.set()
        finally:
            self._pending.pop(ext.name, None)
