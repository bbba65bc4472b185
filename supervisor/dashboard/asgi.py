"""The dashboard's plain ASGI helpers: answers with its security headers, bounded bodies, the
request's headers and cookie, the same-origin test, and an event stream's writes."""

from __future__ import annotations

import anyio
from starlette.types import Receive, Scope, Send

from supervisor.dashboard.passes import Passes

__all__ = (
    "COOKIE",
    "SECURITY_HEADERS",
    "answer",
    "body",
    "cookie",
    "event",
    "header",
    "same_origin",
    "until_gone",
    "write",
)

COOKIE = "mcp_supervisor_dashboard"
SEND_TIMEOUT = 10.0  # an event a browser leaves unread this long ends its stream

SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


async def until_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def event(send: Send, event: str, data: bytes) -> bool:
    return await write(send, b"event: " + event.encode() + b"\ndata: " + data + b"\n\n")


async def write(send: Send, chunk: bytes) -> bool:
    """Send *chunk* of the stream; False once the browser is gone or leaves it unread."""
    with anyio.move_on_after(SEND_TIMEOUT):
        try:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError:
            return False
        return True
    return False


async def body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None past *limit* bytes or once the client is gone."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def answer(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *SECURITY_HEADERS,
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return ""


def cookie(scope: Scope, passes: Passes) -> str | None:
    """Our cookie's value: the one that opens a session, where several are sent under its name
    (another page of this host may set one of its own with a narrower path, to go first)."""
    values = [
        v
        for k, _, v in (p.strip().partition("=") for p in header(scope, b"cookie").split(";"))
        if k == COOKIE
    ]
    return next(
        (value for value in values[:8] if passes.visit(value) is not None), values[0] if values else None
    )


def same_origin(scope: Scope) -> bool:
    """A browser's request from our own page: it names its origin (the listener's Guard checked
    that it is ours), and where it says so, the fetch is same-origin."""
    site = header(scope, b"sec-fetch-site")
    return bool(header(scope, b"origin")) and site in ("", "same-origin")
