"""A person's login to a remote server: the authorization URL out, the redirect back on loopback.

:func:`log_in` runs the SDK's authorization code flow (:class:`supervisor.remote.auth.StoredAuth`)
for one extension: it hands the authorization URL to *on_url* (``mcp-supervisor login`` prints
and opens it) and waits for the browser's redirect on a loopback port (RFC 8252), served by a
:class:`Receiver`. The tokens go to the extension's :class:`~supervisor.remote.tokens.TokenStore`.

The receiver is a listener anyone on the host can reach, so it trusts nothing: a request must
carry the ``state`` of this login's URL (any other is answered 400 and the login waits on), each
connection has :data:`HEAD_DEADLINE` to send at most :data:`MAX_HEAD` bytes, and at most
:data:`MAX_CONNECTIONS` are served at once, a new one closing the oldest (so that local users
holding silent connections cannot keep the person's redirect out). The page it answers shows
no code and no token.

:func:`log_out` revokes the tokens where the server offers revocation (RFC 7009), then forgets them.
"""

from __future__ import annotations

import contextlib
import html
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import httpx2
import structlog
from mcp.client.auth import OAuthFlowError, OAuthRegistrationError, OAuthTokenError
from mcp.client.auth.oauth2 import OAuthContext
from mcp.shared.auth import AuthorizationCodeResult
from mcp_types import LATEST_PROTOCOL_VERSION

from supervisor.config.extension import OAuthSettings, RemoteConfig
from supervisor.errors import SupervisorError, first_line
from supervisor.remote import http
from supervisor.remote.auth import (
    CALLBACK_PATH,
    StoredAuth,
    client_metadata,
    configured_client,
    exposed,
    exposed_words,
    redirect_uri,
)
from supervisor.remote.tokens import TokenStore

__all__ = (
    "HEAD_DEADLINE",
    "MAX_CONNECTIONS",
    "MAX_HEAD",
    "LoginFailed",
    "Receiver",
    "knock",
    "log_in",
    "log_out",
    "shown",
)

log = structlog.get_logger(__name__)

MAX_HEAD = 8192  # bytes of a redirect's request line and headers
HEAD_DEADLINE = 10.0  # seconds for a connection to send them
MAX_CONNECTIONS = 8  # served at once (a browser opens a few); more are closed at once
MAX_ERROR = 300  # characters of a server's error description shown
REVOKE_DEADLINE = 10.0  # seconds for a revocation request; past it, the login is forgotten anyway


class LoginFailed(SupervisorError):
    """The login did not end with a token: the message says why, in words."""


class Receiver:
    """The loopback listener a login's redirect comes back to (see the module)."""

    def __init__(self, listener: anyio.abc.SocketListener) -> None:
        self._listener = listener
        self.port: int = listener.extra(anyio.abc.SocketAttribute.local_port)
        self._state: str | None = None
        self._result: AuthorizationCodeResult | None = None
        self._error: str | None = None
        self._arrived = anyio.Event()
        self._serving: list[anyio.CancelScope] = []  # the connections being served, oldest first

    @classmethod
    @asynccontextmanager
    async def open(cls, port: int = 0) -> AsyncIterator[Receiver]:
        """Listen on ``127.0.0.1:PORT`` (0: a free port) until the context ends. OSError: taken."""
        (listener,) = (await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)).listeners
        assert isinstance(listener, anyio.abc.SocketListener)
        receiver = cls(listener)
        async with listener, anyio.create_task_group() as tasks:
            tasks.start_soon(receiver._accept, tasks)
            try:
                yield receiver
            finally:
                tasks.cancel_scope.cancel()

    def expect(self, state: str) -> None:
        """The ``state`` of the authorization URL: only a redirect carrying it is this login's."""
        self._state = state

    async def result(self) -> AuthorizationCodeResult:
        """The redirect's code, once it came. Raises :class:`LoginFailed` if the server refused."""
        await self._arrived.wait()
        if self._result is None:
            raise LoginFailed(self._error or "the authorization server refused the login")
        return self._result

    async def _accept(self, tasks: anyio.abc.TaskGroup) -> None:
        while True:
            connection = await self._listener.accept()
            if len(self._serving) >= MAX_CONNECTIONS:  # the oldest makes room: silent ones block nothing
                self._serving.pop(0).cancel()
            scope = anyio.CancelScope()
            self._serving.append(scope)
            tasks.start_soon(self._serve, connection, scope)

    async def _serve(self, connection: anyio.abc.SocketStream, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                await self._answer_one(connection)
        finally:
            if scope in self._serving:
                self._serving.remove(scope)

    async def _answer_one(self, connection: anyio.abc.SocketStream) -> None:
        try:
            async with connection:
                head = b""
                with anyio.move_on_after(HEAD_DEADLINE):
                    while b"\r\n\r\n" not in head and len(head) <= MAX_HEAD:
                        head += await connection.receive(4096)
                if b"\r\n\r\n" not in head or len(head) > MAX_HEAD:
                    return  # too slow or too large: closed without a word
                status, page = self._answer(head.split(b"\r\n", 1)[0])
                await connection.send(_page(status, page))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass

    def _answer(self, request_line: bytes) -> tuple[str, str]:
        """The status and the words for one request; a redirect of this login settles it."""
        try:
            method, target, _ = request_line.decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            return "400 Bad Request", "This is not a request mcp-supervisor understands."
        parsed = urllib.parse.urlsplit(target)
        if method != "GET" or parsed.path != CALLBACK_PATH:
            return "404 Not Found", "Nothing here."
        query = urllib.parse.parse_qs(parsed.query, max_num_fields=16)
        given = {key: values[0] for key, values in query.items() if values}
        if self._state is None or given.get("state") != self._state or self._arrived.is_set():
            return (
                "400 Bad Request",
                "This is not the login mcp-supervisor is waiting for; nothing was changed.",
            )
        if "error" in given:
            words = given.get("error_description") or given["error"]
            self._error = f"the authorization server refused: {shown(given['error'])} ({shown(words)})"
            self._arrived.set()
            return "200 OK", f"The login was refused: {shown(words)}. You may close this page."
        if not given.get("code"):
            return "400 Bad Request", "The redirect carries no authorization code."
        self._result = AuthorizationCodeResult(code=given["code"], state=given["state"], iss=given.get("iss"))
        self._arrived.set()
        return "200 OK", "mcp-supervisor is logged in. You may close this page."


def shown(text: str) -> str:
    """A server's words, one short line of printable text."""
    return " ".join(text.split())[:MAX_ERROR].encode("ascii", "replace").decode()


def _page(status: str, words: str) -> bytes:
    body = f"<!doctype html><title>mcp-supervisor</title><p>{html.escape(words)}</p>\n".encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Content-Security-Policy: default-src 'none'\r\nReferrer-Policy: no-referrer\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def log_in(
    config: RemoteConfig,
    store: TokenStore,
    *,
    headers: Mapping[str, str],
    client_secret: str | None,
    on_url: Callable[[str], None],
) -> None:
    """Log in to *config*'s server through a person: *on_url* gets the authorization URL (once
    known); returns once the tokens are stored. *headers*: the config's, expanded.

    The caller bounds the wait. Error handling: :class:`LoginFailed`, saying why (the server's
    error, a refused registration, metadata naming another issuer, a server that asks for no
    login, a receiver port taken).
    """
    settings = config.oauth
    await store.forget_tokens()  # a login asks anew; the registration is kept
    registered = await store.get_client_info()
    wanted = set((store.wanted_scope() or "").split())
    if (
        store.configured is None
        and registered is not None
        and not wanted <= set((registered.scope or "").split())
    ):
        await store.forget_client()  # registered for less than the server now asks: register anew
    async with contextlib.AsyncExitStack() as stack:
        receiver = await _listen(stack, settings.callback_port, store)
        store.configured = configured_client(settings, client_secret, receiver.port)

        async def redirect(url: str) -> None:
            server = provider.context.oauth_metadata
            token = str(server.token_endpoint) if server is not None else url
            for endpoint in (url, token):
                if exposed(endpoint, config):
                    raise LoginFailed(exposed_words(endpoint))
            ours = redirect_uri(receiver.port)
            client = provider.context.client_info
            registered = [str(uri) for uri in (client.redirect_uris or [])] if client is not None else []
            if registered and ours not in registered:  # the browser would take the code elsewhere
                raise LoginFailed(
                    f"refused: the client is registered for {', '.join(map(shown, registered))}, not {ours}"
                )
            state = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("state", [""])[0]
            receiver.expect(state)
            on_url(url)

        provider = StoredAuth(
            store,
            config.url,
            client_metadata(settings, receiver.port),
            redirect_handler=redirect,
            callback_handler=receiver.result,
            client_metadata_url=settings.client_metadata_url,
        )
        try:
            status = await knock(config, provider, headers)
        except LoginFailed as exc:  # raised out here, not from inside the receiver's task group
            failed = exc
        else:
            failed = None
    if failed is not None:
        raise failed
    if not (await store.login()).logged_in:
        raise LoginFailed(
            f"the server at {config.url} did not ask for a login (HTTP {status}): nothing to do"
        )
    if status in (401, 403):
        raise LoginFailed(f"the server at {config.url} refused the new token (HTTP {status})")
    await provider.remember_servers()
    log.info("oauth.logged_in", url=config.url)


async def knock(config: RemoteConfig, provider: StoredAuth, headers: Mapping[str, str]) -> int:
    """One request to the MCP endpoint, signed by *provider* (its 401 starts the login); its status.
    Streamable HTTP: an ``initialize``, whose session is ended at once; SSE: the stream's GET."""
    async with http.client(headers, max_message_bytes=config.max_message_bytes, auth=provider) as client:
        try:
            if config.type == "sse":
                async with client.stream(
                    "GET", config.url, headers={"Accept": "text/event-stream"}
                ) as answer:
                    return answer.status_code
            body = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": LATEST_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "mcp-supervisor", "version": "login"},
                },
            }
            accept = {
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": LATEST_PROTOCOL_VERSION,
            }
            async with client.stream("POST", config.url, json=body, headers=accept) as answer:
                status, session = answer.status_code, answer.headers.get("mcp-session-id")
            if session is not None:  # not used: ended, as a polite client does
                with anyio.move_on_after(config.stop_timeout):
                    await client.delete(config.url, headers={"mcp-session-id": session})
            return status
        except (OAuthFlowError, OAuthTokenError, OAuthRegistrationError) as exc:
            raise LoginFailed(shown(first_line(exc, typed=False))) from None
        except httpx2.HTTPError as exc:
            raise LoginFailed(f"cannot reach {config.url}: {shown(first_line(exc, typed=False))}") from None
        except ValueError as exc:  # a metadata or token answer the SDK's models refuse
            raise LoginFailed(
                f"the server's answer is malformed: {shown(first_line(exc, typed=False))}"
            ) from None


async def _listen(stack: contextlib.AsyncExitStack, configured: int | None, store: TokenStore) -> Receiver:
    """The receiver, on the configured port, else on the one the stored registration names (a
    server may hold a client to its redirect URI), else on any free one (registering anew)."""
    port = configured
    if port is None and store.configured is None:
        client = await store.get_client_info()
        if client is not None and client.redirect_uris:
            port = urllib.parse.urlsplit(str(client.redirect_uris[0])).port
    if port == 0 and configured is None:  # registered for no port of its own (a device login)
        await store.forget_client()
        port = None
    try:
        return await stack.enter_async_context(Receiver.open(port or 0))
    except OSError as exc:
        if configured is not None or not port:
            raise LoginFailed(
                f"cannot listen for the redirect on 127.0.0.1:{port or 0}: {exc.strerror or exc}"
            ) from None
    await store.forget_client()  # its port is taken now: a new registration names a free one
    return await stack.enter_async_context(Receiver.open(0))


async def log_out(store: TokenStore, *, max_message_bytes: int) -> bool:
    """Revoke the login's tokens where the server offers it (RFC 7009), then forget the login.
    Returns whether the server confirmed a revocation; a server that fails it is not waited on."""
    tokens, client = await store.get_tokens(), await store.get_client_info()
    server, _ = await store.servers()
    revoked = False
    endpoint = server.revocation_endpoint if server is not None else None
    if tokens is not None and client is not None and endpoint is not None:
        context = OAuthContext(store.url, client_metadata(OAuthSettings(), 0), store, None, None)
        context.client_info = client
        async with http.client({}, max_message_bytes=max_message_bytes) as http_client:
            for token, hint in (
                (tokens.refresh_token, "refresh_token"),
                (tokens.access_token, "access_token"),
            ):
                if not token:
                    continue
                data, headers = context.prepare_token_auth({"token": token, "token_type_hint": hint}, {})
                data.setdefault("client_id", client.client_id)
                try:
                    with anyio.fail_after(REVOKE_DEADLINE):
                        answer = await http_client.post(str(endpoint), data=data, headers=headers)
                    if answer.status_code != 200:
                        log.warning("oauth.revoke_refused", status=answer.status_code, hint=hint)
                    revoked = revoked or answer.status_code == 200
                except (httpx2.HTTPError, TimeoutError, OAuthTokenError) as exc:
                    log.warning("oauth.revoke_failed", error=first_line(exc, typed=False))
    await store.forget()
    log.info("oauth.logged_out", revoked=revoked)
    return revoked
