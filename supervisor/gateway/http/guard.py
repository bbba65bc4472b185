"""Who may use the HTTP listener, and in which view: checks on a request's headers, before anything else.

:class:`Guard`: the ``Host`` header must name the loopback address when bound there (DNS
rebinding), a browser's ``Origin`` must be this listener's own, and with a ``token`` configured
every path but ``/healthz`` and the dashboard's needs ``Authorization: Bearer <token>``,
compared in constant time. The dashboard's paths (:func:`is_page`: ``/`` and ``/dashboard/...``)
go to its own app after the Host and Origin checks: it asks for its session cookie instead. A
refused request's body is never read: its connection is closed after the answer.

:class:`ProfilePaths`: ``/mcp/NAME`` serves the profile ``NAME`` (:mod:`..views`): the path
becomes ``/mcp`` with the name in the ASGI scope, so each request is served in the view its URL
names; an unknown name is a 404 with a JSON body listing the configured ones.
"""

from __future__ import annotations

import hmac

import structlog
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from supervisor.gateway.view.profiles import SCOPE_KEY, Views
from supervisor.logs import Throttled
from supervisor.paths import is_loopback

__all__ = ("PAGES", "Guard", "ProfilePaths", "is_page")

log = structlog.get_logger(__name__)

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_ANY = ("0.0.0.0", "::")  # bound to every address: a page of this host comes from loopback
PAGES = "/dashboard/"  # the dashboard's paths, beside ``/`` itself


def is_page(path: str) -> bool:
    """Whether *path* is the dashboard's (served by its app, authenticated by its cookie)."""
    return path == "/" or path.startswith(PAGES)


class Guard:
    """ASGI middleware: Host and Origin checks and the bearer token, before anything else runs.

    *pages*: the dashboard's app, for :func:`is_page` paths (None: no dashboard, they get 401/404).
    """

    def __init__(
        self, app: ASGIApp, *, host: str, port: int, token: str | None, pages: ASGIApp | None = None
    ) -> None:
        self.app, self._pages = app, pages
        self._token = token.encode() if token is not None else None
        bracketed = f"[{host}]" if ":" in host else host
        names = (*_LOOPBACK_NAMES, bracketed) if is_loopback(host) else (bracketed,)
        self._hosts = {f"{name}:{port}" for name in names} | ({*names} if port == 80 else set())
        self._check_host = is_loopback(host)  # off loopback, the token is what keeps strangers out
        origins = self._hosts | ({f"{name}:{port}" for name in _LOOPBACK_NAMES} if host in _ANY else set())
        self._origins = {f"{scheme}://{h}" for scheme in ("http", "https") for h in origins}
        self.refused = Throttled(log, "gateway.http_refused")  # a line a second, however many come

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # websockets and whatever comes next: not ours to serve
            return
        path = scope.get("path", "")
        page = self._pages is not None and is_page(path)
        refusal = self._refusal(path, _headers(scope), token=not page)
        if refusal is None:
            await (self._pages if page and self._pages is not None else self.app)(scope, receive, send)
            return
        status, text = refusal
        self.refused(str(status), status=status, reason=text, path=str(scope.get("path"))[:200])
        answer = {"Connection": "close"}  # its body, if any, is never read
        if status == 401:
            answer["WWW-Authenticate"] = "Bearer"
        await PlainTextResponse(text, status_code=status, headers=answer)(scope, receive, send)

    def admits(self, scope: Scope) -> bool:
        """Whether the request of *scope* passes (the middleware answers the ones that do not). Sync."""
        return self._refusal(scope.get("path", ""), _headers(scope)) is None

    def _refusal(self, path: str, headers: dict[str, str], *, token: bool = True) -> tuple[int, str] | None:
        if self._check_host and headers.get("host") not in self._hosts:
            return 421, "unexpected Host header"
        origin = headers.get("origin")
        if origin is not None and origin not in self._origins:
            return 403, "cross-origin requests are not allowed"
        if token and self._token is not None and path != "/healthz":
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
                return 401, "a valid bearer token is required"
        return None


class ProfilePaths:
    """ASGI middleware: ``/mcp/NAME`` is ``/mcp`` in profile NAME; an unknown NAME is a 404."""

    def __init__(self, app: ASGIApp, views: Views) -> None:
        self.app, self._views = app, views

    def profile(self, path: str) -> str | None:
        """The profile *path* names (None: ``/mcp`` itself, or no profile path).

        Raises:
            LookupError: an unknown profile name.
        """
        if not path.startswith("/mcp/"):
            return None
        name = path.removeprefix("/mcp/").rstrip("/")
        if self._views.get(name) is None or not name:
            raise LookupError(name)
        return name

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


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
