"""The daemon's HTTP listener, opened once: the gateway's streamable HTTP and the dashboard.

With ``gateway.http.enabled`` it opens as the daemon starts. Otherwise the first
``mcp-supervisor dashboard`` opens it, for the dashboard alone (``/mcp`` is not served): no port
is open on a host where nobody asked for one. Either way it stays open until the daemon exits,
at the config's ``gateway.http`` address, authenticated the same way (:mod:`.httptoken`) and
screened the same way (:mod:`.callers`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup
from starlette.types import ASGIApp

from supervisor.config.settings import Settings
from supervisor.daemon import fdlimits
from supervisor.daemon.httptoken import gateway_token
from supervisor.gateway.http import HttpLimits, Listening, serve_http
from supervisor.gateway.http.connections import Screen
from supervisor.gateway.server import Gateway

__all__ = ("Web",)

log = structlog.get_logger(__name__)


class Web:
    """The HTTP listener of *gateway* and the dashboard's *pages*, served in *tg* once
    :meth:`open` is first awaited, at the address *settings* () names then."""

    def __init__(
        self,
        tg: TaskGroup,
        fds: fdlimits.FdPlan,
        *,
        settings: Callable[[], Settings],
        gateway: Gateway,
        pages: ASGIApp,
        screen: Screen,
        metrics: Callable[[], str],
        health: Callable[[], Any],
    ) -> None:
        self._tg, self._fds, self._settings = tg, fds, settings
        self._gateway, self._pages, self._screen = gateway, pages, screen
        self._metrics, self._health = metrics, health
        self._opening = anyio.Lock()
        self.listening: Listening | None = None

    async def open(self, *, mcp: bool) -> Listening:
        """The listener, opened now if it is not yet (serving ``/mcp`` too when *mcp*).

        Raises:
            SupervisorError: its address cannot be bound, or no token can be kept.
        """
        async with self._opening:
            if self.listening is None:
                self.listening = await self._tg.start(self._serve(mcp=mcp))
            return self.listening

    def _serve(self, *, mcp: bool) -> functools.partial[Any]:
        settings = self._settings()
        http = settings.gateway.http
        configured = http.token.get_secret_value() if http.token else None
        token, source = gateway_token(configured, os.environ)
        log.info("gateway.http_token", source=source)  # where, never what
        return functools.partial(
            serve_http,
            self._gateway,
            host=http.host,
            port=http.port,
            token=token,
            screen=self._screen,
            metrics=self._metrics,
            health=self._health,
            limits=HttpLimits(max_connections=self._fds.http, backlog=fdlimits.ACCEPT_BURST),
            pages=self._pages,  # it says so itself when the config turns it off
            mcp=mcp,
        )
