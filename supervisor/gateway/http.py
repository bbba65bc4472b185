"""The gateway over streamable HTTP: ``/mcp``, plus ``/metrics`` and ``/healthz``, on the daemon's loop.

uvicorn serves the SDK's streamable-HTTP app inside the daemon's task group (it ships with the
MCP SDK, which builds its HTTP app on Starlette for it). Three habits keep it a good citizen:
the socket is bound here first, so a busy port is a clear error instead of uvicorn's
``sys.exit``; its signal capture is off, since only the daemon handles signals (uvicorn would
re-raise a captured SIGTERM after serving); and it is stopped by asking (``should_exit``), not
by cancelling it mid-shutdown.

Every request passes :class:`Guard` first: the ``Host`` header must name the loopback address
when bound there (DNS rebinding), a browser's ``Origin`` must be this listener's own, and with a
``token`` configured every path but ``/healthz`` needs ``Authorization: Bearer <token>``,
compared in constant time.

``/mcp/NAME`` serves the profile ``NAME`` (:mod:`.views`): the path becomes ``/mcp`` with the
name in the ASGI scope, so each request is served in the view its URL names; an unknown name
is a 404 with a JSON body listing the configured ones.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import structlog
import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import SupervisorError
from ..paths import is_loopback
from .listeners import MAX_CONNECTIONS, MAX_MESSAGE
from .server import Gateway
from .views import SCOPE_KEY, Views

__all__ = ("Guard", "ProfilePaths", "build_app", "serve_http")

log = structlog.get_logger(__name__)

SESSION_IDLE_TIMEOUT = 600  # seconds an HTTP session may stay unused before it is forgotten
SHUTDOWN_GRACE = 3  # seconds for open HTTP streams to end once the daemon stops
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class Guard:
    """ASGI middleware: Host and Origin checks and the bearer token, before anything else runs."""

    def __init__(self, app: ASGIApp, *, host: str, port: int, token: str | None) -> None:
        self.app = app
        self._token = token.encode() if token is not None else None
        bracketed = f"[{host}]" if ":" in host else host
        names = (*_LOOPBACK_NAMES, bracketed) if is_loopback(host) else (bracketed,)
        self._hosts = {f"{name}:{port}" for name in names} | ({*names} if port == 80 else set())
        self._check_host = is_loopback(host)  # off loopback, the token is what keeps strangers out
        self._origins = {f"{scheme}://{h}" for scheme in ("http", "https") for h in self._hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # websockets and whatever comes next: not ours to serve
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope.get("path", ""), headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, text = refusal
        log.warning("gateway.http_refused", status=status, reason=text, path=scope.get("path"))
        extra = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        await PlainTextResponse(text, status_code=status, headers=extra)(scope, receive, send)

    def _refusal(self, path: str, headers: dict[str, str]) -> tuple[int, str] | None:
        if self._check_host and headers.get("host") not in self._hosts:
            return 421, "unexpected Host header"
        origin = headers.get("origin")
        if origin is not None and origin not in self._origins:
            return 403, "cross-origin requests are not allowed"
        if self._token is not None and path != "/healthz":
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
                return 401, "a valid bearer token is required"
        return None


class ProfilePaths:
    """ASGI middleware: ``/mcp/NAME`` is ``/mcp`` in profile NAME; an unknown NAME is a 404."""

    def __init__(self, app: ASGIApp, views: Views) -> None:
        self.app, self._views = app, views

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith("/mcp/"):
            name = path.removeprefix("/mcp/").rstrip("/")
            if self._views.get(name) is None or not name:
                body = {"error": f"unknown profile {name[:100]!r}", "profiles": self._views.names()}
                await JSONResponse(body, status_code=404)(scope, receive, send)
                return
            scope = {**scope, "path": "/mcp", "raw_path": b"/mcp", SCOPE_KEY: name}
        await self.app(scope, receive, send)


def build_app(
    gateway: Gateway,
    *,
    host: str,
    port: int,
    token: str | None,
    metrics: Callable[[], str],
    health: Callable[[], Any],
) -> ASGIApp:
    async def metrics_route(request: Request) -> Response:
        return PlainTextResponse(metrics(), media_type="text/plain; version=0.0.4")

    async def healthz_route(request: Request) -> Response:
        return JSONResponse({"status": "ok", **health()})

    app = gateway.server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),  # Guard does it
        max_request_body_size=MAX_MESSAGE,
        max_sessions=MAX_CONNECTIONS,  # the same bound as mcp.sock
        session_idle_timeout=SESSION_IDLE_TIMEOUT,
        host=host,
        custom_starlette_routes=[Route("/metrics", metrics_route), Route("/healthz", healthz_route)],
    )
    return Guard(ProfilePaths(app, gateway.views), host=host, port=port, token=token)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the daemon owns signals (uvicorn would re-raise them)
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
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
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway at ``http://HOST:PORT/mcp`` until cancelled; ``started()`` with the bound port.

    Raises:
        SupervisorError: the address cannot be bound.
    """
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    app = build_app(gateway, host=host, port=bound, token=token, metrics=metrics, health=health)
    config = uvicorn.Config(
        app,
        log_config=None,  # our logging is configured once, by the daemon
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        server_header=False,
    )
    server = _Server(config)
    log.info("gateway.http_listening", url=f"http://{host}:{bound}/mcp", token=token is not None)
    if token is None:  # unlike mcp.sock, TCP cannot tell which local user is calling
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
        task_status.started(bound)
        try:
            await anyio.sleep_forever()
        finally:
            server.should_exit = True
