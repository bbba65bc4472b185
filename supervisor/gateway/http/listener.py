"""uvicorn in the daemon's task group, serving ``/mcp``, ``/mcp/NAME``, ``/metrics``, ``/healthz``
and the dashboard's pages (an app given by the daemon; ``/mcp`` is left out when only they are asked for).

Three habits keep it a good citizen: the socket is bound here first, so a busy port is a clear
error instead of uvicorn's ``sys.exit``; its signal capture is off, since only the daemon
handles signals (uvicorn would re-raise a captured SIGTERM after serving); and it is stopped by
asking (``should_exit``), once every MCP session has been ended, so that open streams close
rather than wait out uvicorn's graceful period and get cancelled.

A request passes, in order: the connection's bounds (:mod:`.connections`), :class:`.Guard`,
:class:`.ProfilePaths`, the body budget (:mod:`.bodies`), the fast path (:mod:`.fastcalls`: a
plain tool call of a known session, answered without the SDK), then Starlette's routes, ``/mcp``
being the SDK's streamable-HTTP transport under :class:`.Sessions`. A plain tool call to a
running child skips all of it but the connection's bounds, asking the others' decisions
(:mod:`.quick`).
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import structlog
import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from supervisor.errors import SupervisorError
from supervisor.gateway.http.bodies import Bodies
from supervisor.gateway.http.connections import BoundedProtocol, Connections, Screen
from supervisor.gateway.http.fastcalls import FastPath
from supervisor.gateway.http.guard import Guard, ProfilePaths
from supervisor.gateway.http.limits import HttpLimits
from supervisor.gateway.http.quick import QuickCalls
from supervisor.gateway.http.sessions import Sessions
from supervisor.gateway.server import Gateway

__all__ = ("HttpApp", "Listening", "build_app", "serve_http")

log = structlog.get_logger(__name__)

DEFAULT_LIMITS = HttpLimits()
SHUTDOWN_GRACE = 3  # seconds for requests still being served to end once the daemon stops


class HttpApp:
    """The ASGI app of one listener and the parts a shutdown or a test reaches for."""

    def __init__(self, app: ASGIApp, sessions: Sessions, bodies: Bodies, quick: QuickCalls) -> None:
        self.app, self.sessions, self.bodies, self.quick = app, sessions, bodies, quick


@dataclass(frozen=True, slots=True)
class Listening:
    """What :func:`serve_http` started: its port, and its parts (for ``health`` and tests)."""

    port: int
    app: HttpApp
    connections: Connections


def build_app(
    gateway: Gateway,
    *,
    host: str,
    port: int,
    token: str | None,
    metrics: Callable[[], str],
    health: Callable[[], Any],
    limits: HttpLimits = DEFAULT_LIMITS,
    pages: ASGIApp | None = None,
    mcp: bool = True,
) -> HttpApp:
    async def metrics_route(request: Request) -> Response:
        return PlainTextResponse(metrics(), media_type="text/plain; version=0.0.4")

    async def healthz_route(request: Request) -> Response:
        return JSONResponse({"status": "ok", **health()})

    sessions = Sessions(
        gateway.server,
        limits,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),  # Guard does it
    )
    gateway.end_idle_http = sessions.end_idle
    routes = [Route("/metrics", metrics_route), Route("/healthz", healthz_route)]
    if mcp:
        routes.append(Route("/mcp", endpoint=StreamableHTTPASGIApp(sessions)))
    starlette = Starlette(routes=routes, lifespan=lambda app: sessions.run())
    fast = FastPath(starlette, gateway, sessions)
    bodies = Bodies(fast, limits)
    gateway.http_in_flight = bodies.in_flight
    paths = ProfilePaths(bodies, gateway.views)
    guarded = Guard(paths, host=host, port=port, token=token, pages=pages)
    return HttpApp(guarded, sessions, bodies, QuickCalls(fast, guarded, paths, bodies, sessions))


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the daemon owns signals (uvicorn would re-raise them)
        yield


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise SupervisorError(f"cannot listen on http://{host}:{port}: {exc.strerror or exc}") from exc
    return sock


async def serve_http(
    gateway: Gateway,
    *,
    host: str,
    port: int,
    token: str | None,
    metrics: Callable[[], str],
    health: Callable[[], Any],
    limits: HttpLimits = DEFAULT_LIMITS,
    screen: Screen | None = None,
    pages: ASGIApp | None = None,
    mcp: bool = True,
    task_status: anyio.abc.TaskStatus[Listening] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway at ``http://HOST:PORT/mcp`` until cancelled; ``started()`` with :class:`Listening`.

    *screen* turns a connection away before its first byte is read (see :class:`.Connections`).
    *pages* serves ``/`` and ``/dashboard/...``; *mcp* False leaves ``/mcp`` out (the dashboard alone).

    Raises:
        SupervisorError: the address cannot be bound.
    """
    sock = _bind(host, port, limits.backlog)
    bound = sock.getsockname()[1]
    http = build_app(
        gateway,
        host=host,
        port=bound,
        token=token,
        metrics=metrics,
        health=health,
        limits=limits,
        pages=pages,
        mcp=mcp,
    )
    connections = Connections(limits, screen)
    config = uvicorn.Config(
        http.app,
        http=functools.partial(BoundedProtocol, connections=connections, quick=http.quick),  # type: ignore[arg-type]
        log_config=None,  # our logging is configured once, by the daemon
        access_log=False,
        lifespan="on",
        timeout_keep_alive=int(limits.keep_alive),
        backlog=limits.backlog,  # asyncio accepts up to this many at once, before any is refused
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        server_header=False,
        proxy_headers=False,  # no proxy in front: a forwarded-for header names no client here
    )
    server = _Server(config)
    log.info(
        "gateway.http_listening",
        url=f"http://{host}:{bound}/mcp",
        mcp=mcp,
        dashboard=pages is not None,
        token=token is not None,
        max_connections=limits.max_connections,
    )
    if token is None and mcp:  # unlike mcp.sock, TCP cannot tell which local user is calling
        log.warning(
            "gateway.http_without_token", hint="every local user can use the tools; set gateway.http.token"
        )
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            with anyio.CancelScope(shield=True):  # ended by should_exit below, never mid-shutdown
                try:
                    await server.serve(sockets=[sock])  # owns the socket from here on
                except Exception:  # the HTTP listener is lost; the daemon and mcp.sock go on
                    log.exception("gateway.http_crashed")
                    return
            if not server.should_exit:
                log.error("gateway.http_stopped", hint="see the errors above")

        tg.start_soon(run)
        task_status.started(Listening(bound, http, connections))
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await http.sessions.end_all()  # their streams close now, not after the grace
            server.should_exit = True
