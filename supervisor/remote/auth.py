"""OAuth for remote servers, the client side of the MCP authorization spec, on the SDK's provider.

The MCP SDK's ``OAuthClientProvider`` (an ``httpx2.Auth``) does the protocol: on a 401 it reads
the protected resource metadata (RFC 9728), the authorization server's (RFC 8414, then OpenID
discovery), registers (dynamic registration, RFC 7591, unless a client is configured), runs
the authorization code grant with PKCE S256 and ``resource`` (RFC 8707), refreshes an expired
token, and asks for the union of scopes on ``insufficient_scope``. What it does not do, done
here:

- keep, across daemon restarts, the servers' metadata and the real expiry time (it holds them
  in memory and would refresh at the resource server's origin): :mod:`.tokens` keeps them and
  :class:`StoredAuth` loads them;
- register the way the server authenticates clients: a public client (``none``) where the
  server takes one, else a confidential one with the secret it issues (RFC 7591 2);
- refresh *before* expiry: a token counts as expired :data:`REFRESH_AHEAD` early (a tenth of its
  life for short ones), so no request goes out with a token about to lapse;
- never ask a person from a run: :func:`run_auth`'s provider refreshes, but a 401 (or a 403 for
  a wider scope) to the run's own request raises :class:`LoginRequired` (the extension waits in
  ``needs-login``) instead of registering and redirecting. ``mcp-supervisor login`` runs the
  person's part (:mod:`.login`).

``grant: client_credentials`` uses the SDK's ``ClientCredentialsOAuthProvider`` in the run: no
person at all, a new token whenever the old one is refused.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
import warnings
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import fields
from typing import Any

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import extract_field_from_www_auth, union_scopes
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER

from supervisor.config.extension import OAuthSettings, RemoteConfig
from supervisor.remote.tokens import TokenStore

__all__ = (
    "CALLBACK_PATH",
    "REFRESH_AHEAD",
    "LoginRequired",
    "StoredAuth",
    "client_metadata",
    "configured_client",
    "exposed",
    "exposed_words",
    "redirect_uri",
    "run_auth",
)

REFRESH_AHEAD = 60.0  # seconds before expiry a token is refreshed (at most a tenth of its life)
CALLBACK_PATH = "/callback"
CLIENT_NAME = "mcp-supervisor"


class LoginRequired(Exception):
    """The server wants a person to log in (or to grant a wider scope): ``mcp-supervisor login NAME``."""


def exposed(url: str, config: RemoteConfig) -> bool:
    """Whether *url* (an endpoint a login sends a code, a secret or a token to, or sends a
    person to) is plain ``http://`` off loopback, where *config* does not say ``allow_http``."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https":
        return False
    host = parsed.hostname or ""
    local = host == "localhost" or _is_loopback(host)
    return not (parsed.scheme == "http" and (local or config.allow_http))


def exposed_words(url: str) -> str:
    """Why a login refuses *url* (see :func:`exposed`): its origin and path, not its query."""
    parsed = urllib.parse.urlsplit(url)
    where = f"{parsed.scheme}://{parsed.netloc}{parsed.path}"
    return f"refused: the authorization server uses {where}, plain http:// off loopback"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redirect_uri(port: int) -> str:
    """The loopback redirect URI of a native client (RFC 8252 7.3): an IP literal, not ``localhost``."""
    return f"http://127.0.0.1:{port}{CALLBACK_PATH}"


def client_metadata(settings: OAuthSettings, port: int) -> OAuthClientMetadata:
    """What the daemon registers as: a native public client with a loopback redirect."""
    return OAuthClientMetadata(
        client_name=CLIENT_NAME,
        redirect_uris=[redirect_uri(port)],  # type: ignore[list-item]  # pydantic validates the str
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="client_secret_post" if settings.client_secret else "none",
        scope=" ".join(settings.scopes) if settings.scopes else None,
    )


def configured_client(
    settings: OAuthSettings, secret: str | None, port: int
) -> OAuthClientInformationFull | None:
    """The pre-registered client of the config (*secret*: its ``client_secret``, expanded), if any."""
    if settings.client_id is None:
        return None
    metadata = client_metadata(settings, port).model_dump(exclude_none=True)
    return OAuthClientInformationFull(**metadata, client_id=settings.client_id, client_secret=secret)


class _Context(OAuthContext):
    """The SDK's context, with a token's expiry moved ahead of its real one, and a registration
    that asks for a way of authenticating the server offers (see the module)."""

    wanted_scope: str | None = None  # a scope a run was refused for: asked for on top of the rest

    @property  # type: ignore[override]
    def client_metadata(self) -> OAuthClientMetadata:
        metadata: OAuthClientMetadata = self.__dict__["_metadata"]
        if self.wanted_scope:  # the flow sets the scope it discovered; this is read after
            metadata.scope = union_scopes(metadata.scope, self.wanted_scope)
        offered = self.oauth_metadata.token_endpoint_auth_methods_supported if self.oauth_metadata else None
        if metadata.token_endpoint_auth_method == "none" and offered and "none" not in offered:
            # A public client the server does not take: a confidential one, issued a secret.
            basic_only = "client_secret_post" not in offered and "client_secret_basic" in offered
            metadata.token_endpoint_auth_method = (
                "client_secret_basic" if basic_only else "client_secret_post"
            )
        return metadata

    @client_metadata.setter
    def client_metadata(self, metadata: OAuthClientMetadata) -> None:
        self.__dict__["_metadata"] = metadata

    def update_token_expiry(self, token: OAuthToken) -> None:
        super().update_token_expiry(token)
        if self.token_expiry_time is not None and token.expires_in is not None:
            self.token_expiry_time -= min(REFRESH_AHEAD, int(token.expires_in) / 10)


class StoredAuth(OAuthClientProvider):
    """The SDK's provider over a :class:`TokenStore`: servers and expiry as of the last login."""

    def __init__(self, store: TokenStore, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, storage=store, **kwargs)
        self.store = store
        context = self.context
        self.context = _Context(**{field.name: getattr(context, field.name) for field in fields(context)})

    async def _initialize(self) -> None:
        await super()._initialize()
        server, resource = await self.store.servers()
        context = self.context
        context.oauth_metadata, context.protected_resource_metadata = server, resource
        if resource is not None and resource.authorization_servers:
            context.auth_server_url = str(resource.authorization_servers[0])
        if context.current_tokens is not None and context.current_tokens.expires_in is not None:
            context.update_token_expiry(context.current_tokens)  # the SDK leaves a stored token unexpiring
        if isinstance(context, _Context):
            context.wanted_scope = self.store.wanted_scope()

    async def remember_servers(self) -> None:
        """Keep what this login discovered, for the runs after a restart to refresh with."""
        await self.store.set_servers(self.context.oauth_metadata, self.context.protected_resource_metadata)


class _RunAuth(StoredAuth):
    """A run's provider: refreshes, never asks a person (see the module)."""

    def __init__(
        self, store: TokenStore, url: str, settings: OAuthSettings, on_required: Callable[[str], None]
    ) -> None:
        port = settings.callback_port or 0
        super().__init__(
            store, url, client_metadata(settings, port), client_metadata_url=settings.client_metadata_url
        )
        self._on_required = on_required
        self._refused: str | None = None  # the access token a 401 just refused
        self._loaded = -1  # the store's version this run's tokens are
        self.context.lock = store.runs_lock  # the runs of one login refresh one at a time

    @property  # type: ignore[override]
    def _initialized(self) -> bool:
        """Read under the lock by the SDK's flow: False once another run of the same login (a
        per-client instance) changed the tokens, so this one reads them again, not refreshing
        with a refresh token already rotated away."""
        return bool(self.__dict__.get("_ready")) and self._loaded == self.store.version

    @_initialized.setter
    def _initialized(self, ready: bool) -> None:
        self.__dict__["_ready"] = ready

    async def _initialize(self) -> None:
        self._loaded = self.store.version
        await super()._initialize()
        tokens = self.context.current_tokens
        if tokens is not None and self._refused is not None and tokens.access_token == self._refused:
            self.context.token_expiry_time = 1.0  # the one refused: refresh it (0 means "never expires")
        self._refused = None

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """The SDK's flow, its lock held only while the request is signed (:func:`_refresh_due`); a
        refusal of the request itself is a login to wait for, after one more round: with the
        login's tokens as the store has them now (another run of the same login, a per-client
        instance, may have refreshed them), refreshed first if they are the ones refused (the
        server's clock, a revocation of the access token alone)."""
        for last in (False, True):
            async with self.context.lock:  # held only while signing: see _refresh_due
                if (refresh := await _refresh_due(self, request)) is not None:
                    await _refreshed(self, (yield refresh))
                _sign(self, request)
            response = yield request
            why = _needs_person(response)
            if why is None:
                return
            if not last and response.status_code == 401:
                sent = request.headers.get("Authorization", "")
                async with self.context.lock:  # the next round reads the store again
                    self._refused = sent.removeprefix("Bearer ") or None
                    self._initialized = False
                continue
            if response.status_code == 403:  # what it has and what it lacks, asked for next
                await self._want_scope(response)
            self._on_required(why)
            raise LoginRequired(why)

    async def _want_scope(self, response: httpx2.Response) -> None:
        tokens = self.context.current_tokens
        held = union_scopes(tokens.scope if tokens else None, self.context.client_metadata.scope)
        wanted = union_scopes(held, extract_field_from_www_auth(response, "scope"))
        if wanted:
            await self.store.want_scope(wanted)


class _MachineAuth(ClientCredentialsOAuthProvider):
    """The SDK's client_credentials provider, its lock held only while a request is signed
    (as :class:`_RunAuth`'s); a refusal goes through the SDK's flow, which gets a new token
    and sends the request again."""

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        async with self.context.lock:  # held only while signing: see _refresh_due
            if (refresh := await _refresh_due(self, request)) is not None:
                await _refreshed(self, (yield refresh))
            _sign(self, request)
        response = yield request
        if _needs_person(response) is None:
            return
        flow = super()._auth_flow(request)  # its own lock, on this rare path
        try:
            outgoing = await flow.__anext__()
            while True:
                outgoing = await flow.asend((yield outgoing))
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()


async def _refresh_due(provider: OAuthClientProvider, request: httpx2.Request) -> httpx2.Request | None:
    """The SDK's steps before a request, taken under the login's lock: the tokens read (again,
    once they changed), and the refresh request if one is due (its answer goes to
    :func:`_refreshed`, then :func:`_sign`). The SDK holds the lock on until the request is
    answered (its headers): a call answered in a JSON body, or one waiting for a connection,
    then held every other request of the login back, pings included."""
    if not provider._initialized:
        await provider._initialize()
    provider.context.protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if not provider.context.is_token_valid() and provider.context.can_refresh_token():
        return await provider._refresh_token()
    return None


async def _refreshed(provider: OAuthClientProvider, response: httpx2.Response) -> None:
    if not await provider._handle_refresh_response(response):
        provider._initialized = False


def _sign(provider: OAuthClientProvider, request: httpx2.Request) -> None:
    if provider.context.is_token_valid():
        provider._add_auth_header(request)


def _needs_person(response: httpx2.Response) -> str | None:
    if response.status_code == 401:
        return "the server wants a login"
    if response.status_code == 403 and extract_field_from_www_auth(response, "error") == "insufficient_scope":
        scope = extract_field_from_www_auth(response, "scope")
        return f"the server wants a wider scope{f' ({scope})' if scope else ''}"
    return None


def run_auth(
    config: RemoteConfig,
    store: TokenStore | None,
    secrets: Mapping[str, str],
    on_required: Callable[[str], None],
) -> httpx2.Auth | None:
    """The OAuth of one run of *config* (None: it logs in to nothing). *secrets*: the config's
    expanded values (``client_secret``); *on_required* hears why a person must log in, before
    the request fails."""
    if store is None or not config.logs_in:
        return None
    settings = config.oauth
    if settings.grant == "client_credentials":
        assert settings.client_id is not None
        with warnings.catch_warnings():  # the issuer is discovered; the SDK will want it named in 3.0
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            return _MachineAuth(
                config.url,
                store,
                settings.client_id,
                secrets["client_secret"],
                token_endpoint_auth_method="client_secret_post",
                scope=" ".join(settings.scopes) if settings.scopes else None,
            )
    return _RunAuth(store, config.url, settings, on_required)
