"""Realistic fixture: an OAuth-protected MCP server and its authorization server, the SDK's own.

``oauth.py [OPTIONS]`` serves streamable HTTP on a free loopback port and prints the MCP URL
(``http://127.0.0.1:PORT/mcp``) once it listens. The authorization server is the SDK's
(``/authorize``, ``/token``, ``/register``, ``/revoke`` and both metadata documents) over an
in-memory provider that approves every authorization at once: following the authorization URL
is the person's consent. Options:

- ``--expires N``: access tokens live N seconds (default 3600); refresh tokens never expire.
- ``--preregistered ID:SECRET:PORT``: dynamic registration is off; only this client exists, its
  redirect URI ``http://127.0.0.1:PORT/callback``.
- ``--machine ID:SECRET``: a client that logs in as itself (``grant_type=client_credentials``,
  its secret in the body), no person; tokens issued so are counted as ``client_credentials``.
- ``--device``: the device authorization grant (RFC 8628) too: ``device_authorization_endpoint``
  in the metadata, ``/device_authorization``, and ``/device?user_code=CODE`` where the person
  approves (GET: at once).
- ``--cimd PORT``: Client ID Metadata Documents are advertised; an https client id is taken as
  such a client, its redirect URI ``http://127.0.0.1:PORT/callback`` (the document is not
  fetched: this fixture trusts it).
- ``--register-redirect URL``: a registration is answered with this redirect URI instead.
- ``--deny``: every authorization is refused (``error=access_denied``).
- ``--issuer URL``: the authorization server's metadata names this issuer (a lie).
- ``--authorize-at URL``: its metadata sends the person there to log in.
- ``--token-bytes N``: the token endpoint answers N bytes of padding and no token.
- ``--json``: MCP answers are JSON bodies (their headers come when the tool is done), not
  event streams.

Tools: ``echo(text)``; ``whoami`` (the calling token's client id and scopes); ``stats`` (JSON:
tokens issued by grant, refreshes, revocations, registrations); ``revoke_all`` (every token
issued so far stops working, refresh tokens too: the server "revoked" the login); ``admin``
(its POST is answered 403 ``insufficient_scope`` unless the token has the ``admin`` scope);
``together(count, seconds)`` (waits until COUNT calls of it run at once).
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import sys
import time
import urllib.parse
from typing import Any

import anyio
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

STATS: dict[str, int] = {
    "authorization_code": 0,
    "refresh_token": 0,
    "client_credentials": 0,
    "device_code": 0,
    "revoked": 0,
    "registered": 0,
}


class Provider:
    """An in-memory authorization server that consents at once (see the module)."""

    def __init__(self, expires: int, deny: bool, cimd_port: int | None = None) -> None:
        self.expires, self.deny, self.cimd_port = expires, deny, cimd_port
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        if client_id.startswith("https://") and self.cimd_port is not None:  # a metadata document's
            redirect = f"http://127.0.0.1:{self.cimd_port}/callback"
            return OAuthClientInformationFull(
                client_id=client_id,
                redirect_uris=[redirect],  # type: ignore[list-item]
                token_endpoint_auth_method="none",
                scope="mcp admin",
            )
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        STATS["registered"] += 1
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if self.deny:
            return construct_redirect_uri(
                str(params.redirect_uri),
                error="access_denied",
                error_description="the user said no",
                state=params.state,
            )
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id or "",
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(code.code, None)
        STATS["authorization_code"] += 1
        return self._issue(client.client_id or "", code.scopes, code.resource)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        token = self.refresh.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)
        STATS["refresh_token"] += 1
        return self._issue(client.client_id or "", scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        STATS["revoked"] += 1
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def revoke_all(self) -> None:
        self.access.clear()
        self.refresh.clear()

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        expires_at = int(time.time()) + self.expires
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires_at, resource=resource
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        return OAuthToken(
            access_token=access,
            expires_in=self.expires,
            refresh_token=refresh,
            scope=" ".join(scopes) or None,
        )


def build(base: str, options: argparse.Namespace) -> Any:
    provider = Provider(options.expires, options.deny, options.cimd)
    registration = ClientRegistrationOptions(
        enabled=options.preregistered is None, valid_scopes=["mcp", "admin"], default_scopes=["mcp"]
    )
    if options.preregistered is not None:
        client_id, secret, port = options.preregistered.split(":", 2)
        provider.clients[client_id] = OAuthClientInformationFull(
            client_id=client_id,
            client_secret=secret,
            redirect_uris=[f"http://127.0.0.1:{port}/callback"],  # type: ignore[list-item]
            token_endpoint_auth_method="client_secret_post",
            grant_types=["authorization_code", "refresh_token"],
            scope="mcp admin",
        )
    server = MCPServer(
        "oauth-fixture",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            required_scopes=["mcp"],
            client_registration_options=registration,
            revocation_options=RevocationOptions(enabled=True),
            validate_token_resource=False,
        ),
    )

    @server.tool()
    def echo(text: str) -> str:
        """Return the text."""
        return text

    @server.tool()
    def whoami() -> str:
        """The calling token's client id and scopes."""
        token = get_access_token()
        return json.dumps(
            {"client_id": token.client_id if token else None, "scopes": token.scopes if token else []}
        )

    @server.tool()
    def stats() -> str:
        """Tokens issued by grant, refreshes, revocations, registrations."""
        return json.dumps(STATS)

    @server.tool()
    def admin() -> str:
        """Only with the admin scope (the middleware refuses the call otherwise)."""
        return "admin done"

    gathered = {"now": 0, "most": 0}

    @server.tool()
    async def together(count: int, seconds: float) -> str:
        """Wait until COUNT calls of it run at once (or SECONDS pass); say how many did."""
        gathered["now"] += 1
        gathered["most"] = max(gathered["most"], gathered["now"])
        try:
            with anyio.move_on_after(seconds):
                while gathered["most"] < count:  # noqa: ASYNC110 - a fixture's poll
                    await anyio.sleep(0.05)
        finally:
            gathered["now"] -= 1
        return str(gathered["most"])

    @server.tool()
    def revoke_all() -> str:
        """Every token issued so far stops working."""
        provider.revoke_all()
        return "revoked"

    machine = tuple(options.machine.split(":", 1)) if options.machine else None
    app = server.streamable_http_app(json_response=options.json)
    return _Lies(app, base, options, provider, machine)


class _Lies:
    """ASGI middleware for what the SDK's server does not do: another issuer in the metadata, a
    huge or tokenless token answer, and the client_credentials grant of ``--machine``."""

    def __init__(
        self,
        app: Any,
        base: str,
        options: argparse.Namespace,
        provider: Provider,
        machine: tuple[str, ...] | None,
    ) -> None:
        self.app, self.base, self.provider, self.machine = app, base, provider, machine
        self.issuer, self.token_bytes, self.device = options.issuer, options.token_bytes, options.device
        self.authorize_at = options.authorize_at
        self.register_redirect = options.register_redirect
        self.cimd = options.cimd
        self.devices: dict[str, dict[str, Any]] = {}  # device code -> its user code, client, approval

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        lie = self.issuer or self.authorize_at
        if scope["type"] == "http" and lie and path == "/.well-known/oauth-authorization-server":
            body = json.dumps(
                {
                    "issuer": self.issuer or self.base,
                    "authorization_endpoint": self.authorize_at or f"{self.base}/authorize",
                    "token_endpoint": f"{self.base}/token",
                    "registration_endpoint": f"{self.base}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                }
            ).encode()
            await _answer(send, 200, body)
            return
        if scope["type"] == "http" and self.token_bytes and path == "/token":
            await _answer(send, 200, b'{"padding": "' + b"x" * self.token_bytes + b'"}')
            return
        if scope["type"] == "http" and self.device and await self._device(scope, receive, send):
            return
        if scope["type"] == "http" and self.cimd and path == "/.well-known/oauth-authorization-server":
            await self._patched(scope, receive, send, {"client_id_metadata_document_supported": True})
            return
        if scope["type"] == "http" and self.register_redirect and path == "/register":
            await self._patched(scope, receive, send, {"redirect_uris": [self.register_redirect]})
            return
        if scope["type"] == "http" and self.machine and path == "/token":
            body = await _read(receive)
            form = {key: values[0] for key, values in urllib.parse.parse_qs(body.decode()).items()}
            if form.get("grant_type") == "client_credentials":
                if (form.get("client_id"), form.get("client_secret")) != self.machine:
                    await _answer(send, 401, b'{"error": "invalid_client"}')
                    return
                STATS["client_credentials"] += 1
                token = self.provider._issue(self.machine[0], ["mcp"], form.get("resource"))
                token.refresh_token = None
                await _answer(send, 200, token.model_dump_json(exclude_none=True).encode())
                return
            await self.app(scope, _replay(body), send)
            return
        if scope["type"] == "http" and path == "/mcp" and scope.get("method") == "POST":
            body = await _read(receive)
            if b'"admin"' in body and b'"tools/call"' in body and not self._has_admin(scope):
                challenge = b'Bearer error="insufficient_scope", scope="mcp admin"'
                await _answer(send, 403, b'{"error": "insufficient_scope"}', challenge)
                return
            receive = _replay(body)
        await self.app(scope, receive, send)

    async def _device(self, scope: dict[str, Any], receive: Any, send: Any) -> bool:
        """The device grant's endpoints; whether this request was one of them (else untouched)."""
        path, query = scope.get("path", ""), scope.get("query_string", b"").decode()
        if path == "/.well-known/oauth-authorization-server":
            extra = {"device_authorization_endpoint": f"{self.base}/device_authorization"}
            await self._patched(scope, receive, send, extra)
            return True
        if path == "/device":
            user_code = urllib.parse.parse_qs(query).get("user_code", [""])[0]
            for pending in self.devices.values():
                if pending["user_code"] == user_code:
                    pending["approved"] = True
                    await _answer(send, 200, b'{"approved": true}')
                    return True
            await _answer(send, 404, b'{"error": "no such code"}')
            return True
        if path not in ("/device_authorization", "/token"):
            return False
        body = await _read(receive)
        form = {key: values[0] for key, values in urllib.parse.parse_qs(body.decode()).items()}
        client = self.provider.clients.get(form.get("client_id", ""))
        if path == "/device_authorization":
            if client is None:
                await _answer(send, 401, b'{"error": "invalid_client"}')
                return True
            device_code, user_code = secrets.token_urlsafe(16), secrets.token_hex(4).upper()
            scopes = form.get("scope", "mcp").split()
            self.devices[device_code] = {
                "user_code": user_code,
                "client": client.client_id,
                "approved": False,
            }
            self.devices[device_code].update(scopes=scopes, resource=form.get("resource"))
            answer = {
                "device_code": device_code,
                "user_code": user_code,
                "verification_uri": f"{self.base}/device",
                "verification_uri_complete": f"{self.base}/device?user_code={user_code}",
                "expires_in": 300,
                "interval": 1,
            }
            await _answer(send, 200, json.dumps(answer).encode())
            return True
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:device_code":
            await self.app(scope, _replay(body), send)
            return True
        pending = self.devices.get(form.get("device_code", ""))
        if pending is None or client is None or client.client_id != pending["client"]:
            await _answer(send, 400, b'{"error": "invalid_grant"}')
        elif client.client_secret and form.get("client_secret") != client.client_secret:
            await _answer(send, 401, b'{"error": "invalid_client"}')
        elif not pending["approved"]:
            await _answer(send, 400, b'{"error": "authorization_pending"}')
        else:
            del self.devices[form["device_code"]]
            STATS["device_code"] += 1
            token = self.provider._issue(pending["client"], pending["scopes"], pending["resource"])
            await _answer(send, 200, token.model_dump_json(exclude_none=True).encode())
        return True

    async def _patched(self, scope: dict[str, Any], receive: Any, send: Any, extra: dict[str, Any]) -> None:
        """The app's JSON answer with *extra* members."""
        parts: list[bytes] = []

        async def keep(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        await self.app(scope, receive, keep)
        document = json.loads(b"".join(parts))
        await _answer(send, 200, json.dumps({**document, **extra}).encode())

    def _has_admin(self, scope: dict[str, Any]) -> bool:
        headers = dict(scope.get("headers") or [])
        token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
        found = self.provider.access.get(token)
        return found is not None and "admin" in found.scopes


async def _read(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def _replay(body: bytes) -> Any:
    """A receive callable that hands the app *body* again (this middleware read it)."""
    replay = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def again() -> Any:
        message = next(replay, None)
        if message is None:
            await anyio.sleep_forever()  # the app waits for a disconnect that the server reports
        return message

    return again


async def _answer(send: Any, status: int, body: bytes, challenge: bytes | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if challenge is not None:
        headers.append((b"www-authenticate", challenge))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def main(options: argparse.Namespace) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{listener.getsockname()[1]}"
    config = uvicorn.Config(build(base, options), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    print(f"{base}/mcp", flush=True)
    await server.serve(sockets=[listener])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--expires", type=int, default=3600)
    parser.add_argument("--preregistered", metavar="ID:SECRET")
    parser.add_argument("--machine", metavar="ID:SECRET")
    parser.add_argument("--device", action="store_true")
    parser.add_argument("--cimd", type=int, metavar="PORT")
    parser.add_argument("--register-redirect", metavar="URL")
    parser.add_argument("--deny", action="store_true")
    parser.add_argument("--issuer")
    parser.add_argument("--authorize-at")
    parser.add_argument("--token-bytes", type=int)
    parser.add_argument("--json", action="store_true")
    try:
        anyio.run(main, parser.parse_args())
    except KeyboardInterrupt:
        sys.exit(0)
