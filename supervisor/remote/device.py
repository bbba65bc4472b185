"""The device authorization grant (RFC 8628): a login for a host whose browser is elsewhere.

``mcp-supervisor login NAME --device`` on a host reached over SSH: the daemon finds the servers
and registers as a browser login does (the SDK's provider, stopped where it would redirect),
asks the authorization server's ``device_authorization_endpoint`` for a user code, hands it to
*on_code* (the command prints it: "open URL, enter CODE"), and polls the token endpoint at the
interval the server asks for until the person approved, refused, or the code expired.

Every answer is bounded (:mod:`supervisor.remote.http`); the server's interval is kept within
:data:`MIN_INTERVAL`..:data:`MAX_INTERVAL` and its ``slow_down`` honoured (RFC 8628 3.5).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import structlog
from mcp.client.auth.utils import build_oauth_authorization_server_metadata_discovery_urls
from mcp.shared.auth import OAuthClientMetadata, OAuthToken
from pydantic import ValidationError

from supervisor.config.extension import RemoteConfig
from supervisor.errors import first_line
from supervisor.remote import http
from supervisor.remote.auth import StoredAuth, client_metadata, configured_client, exposed, exposed_words
from supervisor.remote.login import LoginFailed, knock, shown
from supervisor.remote.tokens import TokenStore

__all__ = ("DEVICE_GRANT", "DeviceCode", "log_in_device")

log = structlog.get_logger(__name__)

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
MIN_INTERVAL, MAX_INTERVAL = 1.0, 60.0  # seconds between two polls, whatever the server says
MAX_FIELD = 2048  # characters of a user code or a verification URI


@dataclass(frozen=True, slots=True)
class DeviceCode:
    """What the person needs: where to go, and the code to enter there (or a URL carrying it)."""

    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: float


class _Discovered(Exception):
    """The SDK's flow reached the redirect: servers known, client registered. Raised to stop it."""


async def log_in_device(
    config: RemoteConfig,
    store: TokenStore,
    *,
    headers: Mapping[str, str],
    client_secret: str | None,
    on_code: Callable[[DeviceCode], None],
) -> None:
    """Log in to *config*'s server by a device code: *on_code* gets it; returns once the tokens
    are stored. The caller bounds the wait. Error handling: :class:`LoginFailed`, saying why."""
    settings = config.oauth
    await store.forget_tokens()
    store.configured = configured_client(settings, client_secret, settings.callback_port or 0)

    async def stop(url: str) -> None:
        raise _Discovered

    metadata = _device_metadata(client_metadata(settings, settings.callback_port or 0))
    provider = StoredAuth(store, config.url, metadata, redirect_handler=stop, callback_handler=_never)
    try:
        status = await knock(config, provider, headers)
    except _Discovered:
        pass
    else:
        raise LoginFailed(
            f"the server at {config.url} did not ask for a login (HTTP {status}): nothing to do"
        )
    context = provider.context
    if context.client_info is None or context.oauth_metadata is None:
        raise LoginFailed("the authorization server's metadata or the client's registration is missing")
    for endpoint in (str(context.oauth_metadata.token_endpoint),):
        if exposed(endpoint, config):
            raise LoginFailed(exposed_words(endpoint))
    limit = config.max_message_bytes
    async with http.client(headers, max_message_bytes=limit) as client:
        endpoint = await _device_endpoint(client, provider, config)
        form = {"client_id": context.client_info.client_id}
        if context.client_metadata.scope:
            form["scope"] = context.client_metadata.scope
        if context.should_include_resource_param(context.protocol_version):
            form["resource"] = context.get_resource_url()
        code, device_code, interval = await _ask_code(client, provider, endpoint, form)
        on_code(code)
        token = await _poll(client, provider, device_code, interval, code.expires_in, form)
    context.current_tokens = token
    await store.set_tokens(token)
    await provider.remember_servers()
    log.info("oauth.logged_in", url=config.url, grant="device_code")


async def _never() -> Any:
    raise AssertionError("the device flow never takes a redirect")


def _device_metadata(metadata: OAuthClientMetadata) -> OAuthClientMetadata:
    """The browser login's registration, able to use device codes too (a server wants the code
    grant listed; the SDK's refuses a registration without it)."""
    return metadata.model_copy(update={"grant_types": [*metadata.grant_types, DEVICE_GRANT]})


async def _device_endpoint(client: httpx2.AsyncClient, provider: StoredAuth, config: RemoteConfig) -> str:
    """The ``device_authorization_endpoint`` of the authorization server's metadata (the SDK's
    model drops it): the same documents, read again, from the same issuer only."""
    context = provider.context
    assert context.oauth_metadata is not None
    issuer = str(context.oauth_metadata.issuer)
    for url in build_oauth_authorization_server_metadata_discovery_urls(
        context.auth_server_url, context.server_url
    ):
        document = await _json(client, "GET", url, None)
        if isinstance(document, dict) and document.get("issuer") in (issuer, issuer.rstrip("/")):
            endpoint = document.get("device_authorization_endpoint")
            if isinstance(endpoint, str) and endpoint.startswith(("https://", "http://")):
                if exposed(endpoint, config):
                    raise LoginFailed(exposed_words(endpoint))
                return endpoint
            break
    raise LoginFailed(
        "the authorization server offers no device login (RFC 8628); log in without --device, on a "
        "machine whose browser reaches this host's loopback"
    )


async def _ask_code(
    client: httpx2.AsyncClient, provider: StoredAuth, endpoint: str, form: dict[str, str]
) -> tuple[DeviceCode, str, float]:
    answer = await _json(client, "POST", endpoint, _signed(provider, form))
    if not isinstance(answer, dict):
        raise LoginFailed("the authorization server's device answer is malformed")
    fields = [answer.get(key) for key in ("device_code", "user_code", "verification_uri")]
    if not all(isinstance(value, str) and 0 < len(value) <= MAX_FIELD for value in fields):
        raise LoginFailed(_refusal(answer, "the authorization server gave no device code"))
    device_code, user_code, uri = fields
    complete = answer.get("verification_uri_complete")
    complete = complete if isinstance(complete, str) and len(complete) <= MAX_FIELD else None
    expires = _number(answer.get("expires_in"), 600.0)
    interval = min(MAX_INTERVAL, max(MIN_INTERVAL, _number(answer.get("interval"), 5.0)))
    return (
        DeviceCode(shown(user_code), shown(uri), complete and shown(complete), expires),
        device_code,
        interval,
    )


async def _poll(
    client: httpx2.AsyncClient,
    provider: StoredAuth,
    device_code: str,
    interval: float,
    expires_in: float,
    form: dict[str, str],
) -> OAuthToken:
    """Ask for the token every *interval* until the person decided (RFC 8628 3.4, 3.5)."""
    token_endpoint = str(provider.context.oauth_metadata.token_endpoint)  # type: ignore[union-attr]
    request = _signed(provider, {**form, "grant_type": DEVICE_GRANT, "device_code": device_code})
    with anyio.move_on_after(expires_in):
        while True:
            await anyio.sleep(interval)
            answer = await _json(client, "POST", token_endpoint, request, errors_too=True)
            if not isinstance(answer, dict):
                raise LoginFailed("the authorization server's token answer is malformed")
            error = answer.get("error")
            if error == "authorization_pending":
                continue
            if error == "slow_down":
                interval = min(MAX_INTERVAL, interval + 5)
                continue
            if error is not None:
                raise LoginFailed(_refusal(answer, "the authorization server refused the device login"))
            try:
                return OAuthToken.model_validate(answer)
            except ValidationError:
                raise LoginFailed("the authorization server's token answer is malformed") from None
    raise LoginFailed("the device code expired before anyone approved it")


def _signed(provider: StoredAuth, form: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """*form* with the client's authentication, as the SDK signs its token requests."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    return provider.context.prepare_token_auth(dict(form), headers)


async def _json(
    client: httpx2.AsyncClient,
    method: str,
    url: str,
    signed: tuple[dict[str, str], dict[str, str]] | None,
    *,
    errors_too: bool = False,
) -> Any:
    """The JSON of one bounded answer (None for a 404 or a non-JSON one)."""
    try:
        if signed is None:
            answer = await client.request(method, url, headers={"Accept": "application/json"})
        else:
            answer = await client.request(method, url, data=signed[0], headers=signed[1])
    except httpx2.HTTPError as exc:
        raise LoginFailed(
            f"the device login failed at {url}: {shown(first_line(exc, typed=False))}"
        ) from None
    if answer.status_code >= 400 and not (errors_too and answer.status_code in (400, 401)):
        if answer.status_code == 404 and signed is None:
            return None
        raise LoginFailed(f"the authorization server answered HTTP {answer.status_code} at {url}")
    try:
        return json.loads(answer.content)
    except ValueError:
        return None


def _number(value: Any, default: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        return default
    return float(value)


def _refusal(answer: dict[str, Any], default: str) -> str:
    error = answer.get("error")
    if not isinstance(error, str):
        return default
    words = answer.get("error_description")
    words = f" ({shown(words)})" if isinstance(words, str) and words else ""
    return f"the authorization server refused: {shown(error)}{words}"
