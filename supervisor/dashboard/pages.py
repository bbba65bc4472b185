"""The dashboard's ASGI app: the page, its script and style, one JSON-RPC endpoint, one event stream.

Every route sits behind the listener's Host and Origin checks
(:class:`~supervisor.gateway.http.guard.Guard`) and its connection bounds; the bearer token of
``/mcp`` is not asked for here, a session cookie is:

- ``GET /``: the page for a session; without one, a page that says how to get one (401);
- ``GET /dashboard/login?code=C``: a one-time code (:mod:`.passes`) becomes an ``HttpOnly``,
  ``SameSite=Strict`` cookie, and a 303 to ``/`` takes the code out of the address bar;
- ``GET /dashboard/static/NAME``: ``app.js``, ``app.css``;
- ``POST /dashboard/rpc``: one control method, the very ones of the control socket
  (:mod:`supervisor.control.rpc`); in read-only mode only those that change nothing. It must
  come from this origin (``Origin`` present and ours) as JSON, so no other page can post it;
- ``GET /dashboard/events[?logs=NAME]``: server-sent events, the status (and NAME's log tail)
  each time it changes, coalesced (:mod:`.live`);
- ``POST /dashboard/logout``.

Every answer carries a strict Content Security Policy (scripts only from this origin, no
inline script or style, no frames), and the page builds every server-provided text as a DOM
text node, never as markup.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import socket
import time
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs

import anyio
import structlog
from starlette.types import Receive, Scope, Send

from supervisor.control import rpc
from supervisor.control.methods import Backend
from supervisor.dashboard import asgi
from supervisor.dashboard.asgi import COOKIE
from supervisor.dashboard.live import Pulse
from supervisor.dashboard.passes import Passes, Visit
from supervisor.gateway.http.connections import CONNECTION
from supervisor.gateway.http.guard import PAGES as PREFIX
from supervisor.logs import Throttled
from supervisor.paths import is_loopback

__all__ = (
    "MAX_STREAMS",
    "READ_METHODS",
    "WRITE_METHODS",
    "Dashboard",
    "Host",
)

if TYPE_CHECKING:
    from supervisor.config.settings import DashboardConfig

log = structlog.get_logger(__name__)

READ_METHODS = frozenset({"status", "tools", "logs", "health", "explain", "clients", "recent_calls"})
WRITE_METHODS = frozenset({"start", "stop", "restart", "approve", "reload", "login", "logout"})
MAX_REQUEST = 64 << 10  # one rpc body: names and flags, nothing larger
MAX_IN_FLIGHT = 8  # rpc requests of one session being served at once
MAX_STREAMS = 8  # event streams open at once; at the cap the oldest is closed (its page reconnects)
REFRESH = 2.0  # seconds between two looks when nothing is announced: RSS, CPU and uptime move alone
STATUS_STALE = 1.0  # a status this old is made again; younger, every page sends the same one
COALESCE = 0.25  # after a change, what else changes within this is sent with it
HEARTBEAT = 15.0  # a comment line when nothing else was sent, so a gone browser is noticed
LOG_TAIL = 200  # lines of an extension's log a page shows
_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
_STATUS = b'{"jsonrpc":"2.0","id":0,"method":"status"}'


class Host(Backend, Protocol):
    """What the dashboard needs from the daemon: the control methods, and a pulse of changes."""

    changes: Pulse


@cache
def _file(name: str) -> bytes:
    return (importlib.resources.files("supervisor.dashboard") / "static" / name).read_bytes()


class Dashboard:
    """The ASGI app of the dashboard, on one daemon (*host*) and its one-time codes (*passes*).

    *settings* are asked at each request: a reload may turn the dashboard off, or read-only.
    """

    def __init__(
        self,
        host: Host,
        passes: Passes,
        *,
        settings: Callable[[], DashboardConfig],
        extension_of: Callable[[socket.socket], str | None] | None = None,
    ) -> None:
        self._host, self.passes, self._settings = host, passes, settings
        self._extension_of = extension_of  # which extension's tree holds a peer socket, if any
        self.refused = Throttled(log, "dashboard.refused")  # a line a second, however many come
        self._streams: list[anyio.CancelScope] = []  # open event streams, oldest first
        self._in_flight: dict[int, int] = {}  # id(visit) -> rpc requests being served
        self._last_status: tuple[int, float, bytes] = (-1, 0.0, b"")  # version, when, the reply

    def figures(self) -> dict[str, int]:
        """Its tables, for ``health``: each has a cap, and these numbers level off under it."""
        codes, sessions = self.passes.counts
        return {"codes": codes, "sessions": sessions, "streams": len(self._streams)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if not self._settings().enabled:
            await asgi.answer(send, 404, b"the dashboard is off in this daemon's config (dashboard.enabled)")
            return
        refusal = self._peer_refusal(scope)
        if refusal is not None:
            self.refused(refusal, reason=refusal, path=str(path)[:200])
            await asgi.answer(send, 403, refusal.encode())
            return
        route = _ROUTES.get((method, path))
        if route is None and method == "GET" and path.startswith(PREFIX + "static/"):
            route = Dashboard._static
        if route is None:
            allowed = sorted({m for m, p in _ROUTES if p == path})
            if allowed:
                allow = ((b"allow", ", ".join(allowed).encode()),)
                await asgi.answer(send, 405, b"method not allowed", extra=allow)
            else:
                await asgi.answer(send, 404, b"not found")
            return
        await route(self, scope, receive, send)

    def _peer_refusal(self, scope: Scope) -> str | None:
        """Why this peer gets no page: another host (a session cookie over plain HTTP), or one of
        the daemon's own extensions (a page of theirs on another loopback port receives the
        person's cookie: with it they would approve their own changed tools)."""
        client = scope.get("client")
        if client is None or not is_loopback(str(client[0])):
            return "the dashboard is served to this host only (an SSH tunnel reaches it from another)"
        connection = scope.get(CONNECTION)
        transport = getattr(connection, "transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if self._extension_of is not None and sock is not None and self._extension_of(sock) is not None:
            return "the daemon's own extensions may not use the dashboard"
        return None

    # ---- pages ---------------------------------------------------------------------------------

    async def _index(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._visit(scope) is None:
            await asgi.answer(send, 401, _file("signin.html"), "text/html; charset=utf-8")
            return
        await asgi.answer(send, 200, _file("index.html"), "text/html; charset=utf-8")

    async def _static(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path"].removeprefix(PREFIX + "static/")
        if name not in _STATIC:
            await asgi.answer(send, 404, b"not found")
            return
        await asgi.answer(send, 200, _file(name), _STATIC[name])

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        code = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("code", [""])[0]
        opened = self.passes.redeem(code[:200]) if code else None
        if opened is None:
            self.refused("code", reason="a code unknown, used or expired")
            await asgi.answer(send, 403, _file("expired.html"), "text/html; charset=utf-8")
            return
        secret, visit = opened
        log.info("dashboard.session_opened", read_only=visit.read_only or self._settings().read_only)
        cookie = f"{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict".encode()
        await asgi.answer(send, 303, b"", extra=((b"location", b"/"), (b"set-cookie", cookie)))

    async def _logout(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not asgi.same_origin(scope):
            await asgi.answer(send, 403, b"cross-origin requests are not allowed")
            return
        self.passes.end(asgi.cookie(scope, self.passes))
        expired = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0".encode()
        await asgi.answer(send, 204, b"", extra=((b"set-cookie", expired),))

    # ---- the control methods -------------------------------------------------------------------

    async def _rpc(self, scope: Scope, receive: Receive, send: Send) -> None:
        visit = self._visit(scope)
        if visit is None:
            await asgi.answer(send, 401, b"no dashboard session: run mcp-supervisor dashboard")
            return
        if (
            not asgi.same_origin(scope)
            or asgi.header(scope, b"content-type").split(";")[0] != "application/json"
        ):
            await asgi.answer(send, 403, b"a dashboard request comes from its page, as JSON")
            return
        body = await asgi.body(receive, MAX_REQUEST)
        if body is None:
            await asgi.answer(send, 413, b"request too large")
            return
        refusal = self._refusal(body, visit)
        if refusal is not None:
            await asgi.answer(send, 200, refusal.strip(), "application/json")
            return
        key = id(visit)
        if self._in_flight.get(key, 0) >= MAX_IN_FLIGHT:
            await asgi.answer(send, 429, b"too many requests in flight", extra=((b"retry-after", b"1"),))
            return
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            reply = await rpc.handle(self._host, body)
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]
        if reply is None:  # a notification: nothing to answer
            await asgi.answer(send, 204, b"")
            return
        await asgi.answer(send, 200, reply.strip(), "application/json")

    def _refusal(self, body: bytes, visit: Visit) -> bytes | None:
        """The error reply for a method the dashboard does not offer, or None (rpc says the rest)."""
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            return None  # a parse error, in the control protocol's words
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return None
        method = request["method"]
        if method in READ_METHODS:
            return None
        if method in WRITE_METHODS and not (visit.read_only or self._settings().read_only):
            return None
        why = "this dashboard is read-only" if method in WRITE_METHODS else "not a dashboard method"
        return rpc.encode_error(request.get("id"), -32601, f"{method[:100]}: {why}")

    # ---- live ----------------------------------------------------------------------------------

    async def _events(self, scope: Scope, receive: Receive, send: Send) -> None:
        if asgi.header(scope, b"sec-fetch-site") not in ("", "same-origin"):  # another page's <img src>
            await asgi.answer(send, 403, b"the event stream is for the dashboard's own page")
            return
        secret = asgi.cookie(scope, self.passes)
        if self.passes.visit(secret) is None:
            await asgi.answer(send, 401, b"no dashboard session: run mcp-supervisor dashboard")
            return
        logs_of = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("logs", [None])[0]
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"x-accel-buffering", b"no"),
            *asgi.SECURITY_HEADERS,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        with anyio.CancelScope() as stream:
            self._streams.append(stream)
            if len(self._streams) > MAX_STREAMS:
                self._streams.pop(0).cancel()  # the oldest page reconnects (EventSource does)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(asgi.until_gone, receive, tg.cancel_scope)
                    await self._feed(send, secret, logs_of[:200] if logs_of else None)
                    tg.cancel_scope.cancel()
            finally:
                if stream in self._streams:
                    self._streams.remove(stream)
        with anyio.move_on_after(1, shield=True):
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _feed(self, send: Send, secret: str | None, logs_of: str | None) -> None:
        """Send the status and *logs_of*'s tail whenever they change, until the session ends."""
        sent: dict[str, bytes] = {}
        last_sent = time.monotonic()
        while (visit := self.passes.visit(secret)) is not None:
            seen = self._host.changes.version
            read_only = visit.read_only or self._settings().read_only
            events = {
                "session": b'{"read_only":%s}' % (b"true" if read_only else b"false"),
                "status": await self._status(),
            }
            if logs_of is not None:
                events["logs"] = self._logs(logs_of)
            for event, data in events.items():
                if sent.get(event) == data:
                    continue
                if not await asgi.event(send, event, data):
                    return
                sent[event] = data
                last_sent = time.monotonic()
            if time.monotonic() - last_sent > HEARTBEAT:
                if not await asgi.write(send, b": still here\n\n"):
                    return
                last_sent = time.monotonic()
            with anyio.move_on_after(REFRESH):
                await self._host.changes.wait(seen)
            await anyio.sleep(COALESCE)
        await asgi.event(send, "ended", b"{}")  # the page reloads, and says how to get a new session

    async def _status(self) -> bytes:
        """The status reply, computed once for every open page: again on a change, or once stale."""
        version, made, reply = self._last_status
        now = time.monotonic()
        if version != self._host.changes.version or now - made >= STATUS_STALE or not reply:
            version = self._host.changes.version
            reply = (await rpc.handle(self._host, _STATUS) or b"").strip()
            self._last_status = (version, now, reply)
        return reply

    def _logs(self, name: str) -> bytes:
        try:
            record: dict[str, Any] = {"name": name, "lines": self._host.logs(name, LOG_TAIL)}
        except Exception as exc:  # an unknown name: said on the page
            record = {"name": name, "error": str(exc)}
        return json.dumps(record, separators=(",", ":")).encode()

    def _visit(self, scope: Scope) -> Visit | None:
        return self.passes.visit(asgi.cookie(scope, self.passes))


_ROUTES: dict[tuple[str, str], Callable[..., Any]] = {
    ("GET", "/"): Dashboard._index,
    ("GET", PREFIX + "login"): Dashboard._login,
    ("POST", PREFIX + "logout"): Dashboard._logout,
    ("POST", PREFIX + "rpc"): Dashboard._rpc,
    ("GET", PREFIX + "events"): Dashboard._events,
}
