"""One remote extension's OAuth login, kept on disk: its client registration, tokens and servers.

One file per extension, ``<state>/oauth/<daemon instance>/<name>.json`` (0600 in 0700
directories, written whole: :mod:`supervisor.privatefiles`), so a refresh token survives daemon
restarts and every client of the gateway uses the one login. The record is bound to the
server's URL: a file written for another URL (the config changed) is never read, so a token
is only ever sent where it was issued for. Expiry is kept as a time, not the server's
``expires_in``, so a token read after a restart expires when it really does.

It is the MCP SDK's ``TokenStorage`` (``get_tokens``/``set_tokens``/``get_client_info``/
``set_client_info``) plus what the SDK keeps only in memory: the authorization server's
metadata (its token and revocation endpoints, needed to refresh after a restart) and the
protected resource's.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken, ProtectedResourceMetadata
from pydantic import ValidationError

from supervisor.privatefiles import read_private, remove_private, write_private

__all__ = ("MAX_BYTES", "Login", "TokenStore")

log = structlog.get_logger(__name__)

VERSION = 1
MAX_BYTES = 256 * 1024  # one login's record; a larger file is not read (metadata documents are small)


@dataclass(frozen=True, slots=True)
class Login:
    """What ``status`` may show of a login: whether there is one, and when its access token expires."""

    logged_in: bool
    expires_at: float | None = None  # epoch seconds; None: no expiry given, or no login
    refreshable: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"logged_in": self.logged_in, "expires_at": self.expires_at, "refreshable": self.refreshable}


class TokenStore:
    """The login of extension *name* to the server at *url*, in *directory* (see the module).

    *client* is a pre-registered client from the config: it replaces any stored registration.
    Reads are cached after the first; writes go to disk in a thread. Never logs a token.
    """

    def __init__(
        self, directory: Path, name: str, url: str, client: OAuthClientInformationFull | None = None
    ) -> None:
        self.path = directory / f"{name}.json"
        self.name, self.url = name, url
        self.configured = client  # a pre-registered client (its redirect URI is set by a login)
        self._record: dict[str, Any] | None = None
        self.version = 0  # counts changes of the tokens: a run holding older ones reads them again
        self.runs_lock = anyio.Lock()  # held by a run while it signs or refreshes: one refresh at a time

    # The SDK's TokenStorage.

    async def get_tokens(self) -> OAuthToken | None:
        """The tokens, their ``expires_in`` counted from now (0 once expired)."""
        record = await self._load()
        raw = record.get("tokens")
        if not isinstance(raw, dict):
            return None
        try:
            tokens = OAuthToken.model_validate(raw)
        except ValidationError:
            return None
        expires_at = record.get("expires_at")
        if isinstance(expires_at, int | float) and math.isfinite(expires_at):
            tokens.expires_in = max(0, int(expires_at - time.time()))
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        record = await self._load()
        record["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        record["expires_at"] = None if tokens.expires_in is None else time.time() + int(tokens.expires_in)
        self.version += 1
        await self._save(record)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self.configured is not None:
            return self.configured
        raw = (await self._load()).get("client")
        if not isinstance(raw, dict):
            return None
        try:
            return OAuthClientInformationFull.model_validate(raw)
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.configured is not None:
            return  # the config's registration is the one; a server's answer does not replace it
        record = await self._load()
        record["client"] = client_info.model_dump(mode="json", exclude_none=True)
        await self._save(record)

    # What the SDK keeps in memory only.

    async def servers(self) -> tuple[OAuthMetadata | None, ProtectedResourceMetadata | None]:
        """The authorization server's metadata and the protected resource's, as of the last login."""
        record = await self._load()
        found: list[Any] = []
        for key, model in (("server", OAuthMetadata), ("resource", ProtectedResourceMetadata)):
            raw = record.get(key)
            try:
                found.append(model.model_validate(raw) if isinstance(raw, dict) else None)
            except ValidationError:
                found.append(None)
        return found[0], found[1]

    async def set_servers(
        self, server: OAuthMetadata | None, resource: ProtectedResourceMetadata | None
    ) -> None:
        record = await self._load()
        for key, value in (("server", server), ("resource", resource)):
            record[key] = None if value is None else value.model_dump(mode="json", exclude_none=True)
        await self._save(record)

    async def want_scope(self, scope: str) -> None:
        """The server asked for *scope* (``insufficient_scope``): the next login asks for it too."""
        record = await self._load()
        if record.get("wanted_scope") != scope:
            record["wanted_scope"] = scope
            await self._save(record)

    def wanted_scope(self) -> str | None:
        """The scope the server last asked for (see :meth:`want_scope`), once the file was read."""
        wanted = (self._record or {}).get("wanted_scope")
        return wanted if isinstance(wanted, str) else None

    async def forget_tokens(self) -> None:
        """Drop the tokens, keep the registration: the next login registers no new client."""
        record = await self._load()
        self.version += 1
        if record.pop("tokens", None) is not None or record.pop("expires_at", None) is not None:
            await self._save(record)

    async def forget_client(self) -> None:
        """Drop the registration (and the tokens issued to it): the next login registers anew."""
        record = await self._load()
        for key in ("client", "tokens", "expires_at"):
            record.pop(key, None)
        self.version += 1
        await self._save(record)

    async def forget(self) -> bool:
        """Remove the whole login; whether there was one."""
        self._record = {}
        self.version += 1
        return await anyio.to_thread.run_sync(remove_private, self.path)

    async def login(self) -> Login:
        return self._login(await self._load())

    def shown(self) -> Login | None:
        """:meth:`login` without reading the file: None until something read it."""
        return None if self._record is None else self._login(self._record)

    @staticmethod
    def _login(record: dict[str, Any]) -> Login:
        tokens = record.get("tokens")
        if not isinstance(tokens, dict) or not tokens.get("access_token"):
            return Login(False)
        expires_at = record.get("expires_at")
        expires = float(expires_at) if isinstance(expires_at, int | float) else None
        return Login(True, expires, refreshable=bool(tokens.get("refresh_token")))

    # The file.

    async def _load(self) -> dict[str, Any]:
        if self._record is None:
            self._record = await anyio.to_thread.run_sync(self._read)
        return self._record

    def _read(self) -> dict[str, Any]:
        try:
            data = read_private(self.path, MAX_BYTES)
        except OSError as exc:
            log.warning("oauth.login_unreadable", extension=self.name, path=str(self.path), error=str(exc))
            return {}
        if data is None:
            return {}
        try:
            record = json.loads(data)
        except ValueError:
            record = None
        if (
            not isinstance(record, dict)
            or record.get("version") != VERSION
            or record.get("extension") != self.name
        ):
            log.warning(
                "oauth.login_ignored", extension=self.name, path=str(self.path), reason="not a login record"
            )
            return {}
        if record.get("url") != self.url:  # never send a token where it was not issued for
            log.warning(
                "oauth.login_ignored", extension=self.name, path=str(self.path), reason="another URL's"
            )
            return {}
        return record

    async def _save(self, record: dict[str, Any]) -> None:
        record.update(version=VERSION, extension=self.name, url=self.url)
        self._record = record
        data = json.dumps(record, separators=(",", ":")).encode()
        await anyio.to_thread.run_sync(write_private, self.path, data)
