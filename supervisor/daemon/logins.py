"""One OAuth login per remote extension for the whole host: its token store, and the login under way.

Every run of an extension (each per-client instance too) signs with the one
:class:`~supervisor.remote.tokens.TokenStore` kept here, so all the gateway's clients share one
login and one refresh. ``mcp-supervisor login NAME`` starts an :class:`Attempt` (at most one per
extension: a second ``login`` while one waits gets the same URL), which runs in the daemon's
task group within :data:`LOGIN_TIMEOUT`; on success the extension starts again with the tokens.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc
import structlog

from supervisor.config import secrets as secretrefs
from supervisor.config.extension import ExtensionConfig, RemoteConfig
from supervisor.errors import SpawnError, SupervisorError
from supervisor.extension.remoterun import oauth_secrets
from supervisor.remote.device import DeviceCode, log_in_device
from supervisor.remote.login import LoginFailed, log_in, log_out
from supervisor.remote.tokens import TokenStore

__all__ = ("LOGIN_TIMEOUT", "Attempt", "Logins")

log = structlog.get_logger(__name__)

LOGIN_TIMEOUT = 600.0  # seconds a login waits for its person before it is given up
URL_DEADLINE = 60.0  # seconds for the servers' metadata and a registration, before the URL is known


class Attempt:
    """One login under way: its authorization URL once known, its end and why it failed."""

    def __init__(self, device: bool) -> None:
        self.device = device  # by a device code (RFC 8628), not a redirect
        self.url: str | None = None
        self.user_code: str | None = None
        self.error: str | None = None
        self.known = anyio.Event()  # the URL is known, or the attempt ended without one
        self.done = anyio.Event()
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + LOGIN_TIMEOUT)

    def show(self, url: str) -> None:
        self.url = url
        self.known.set()

    def show_code(self, code: DeviceCode) -> None:
        self.user_code = code.user_code
        self.show(code.verification_uri_complete or code.verification_uri)


class Logins:
    """The token stores of the remote extensions, under *directory*, and their logins under way."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stores: dict[str, TokenStore] = {}
        self._attempts: dict[str, Attempt] = {}

    def store(self, name: str, config: ExtensionConfig) -> TokenStore | None:
        """The store of extension *name* (kept while its URL stays), or None: it logs in to nothing."""
        if not isinstance(config, RemoteConfig) or not config.logs_in:
            self._stores.pop(name, None)
            return None
        store = self._stores.get(name)
        if store is None or store.url != config.url:
            store = self._stores[name] = TokenStore(self.directory, name, config.url)
        return store

    def forget(self, names: set[str]) -> None:
        """Drop the stores of extensions no longer configured (their files stay: a login is the user's)."""
        for name in set(self._stores) - names:
            del self._stores[name]

    def attempt(self, name: str) -> Attempt | None:
        return self._attempts.get(name)

    async def begin(
        self,
        tg: anyio.abc.TaskGroup,
        name: str,
        config: ExtensionConfig,
        credentials: str | None,
        on_success: Callable[[], Awaitable[None]],
        *,
        device: bool = False,
    ) -> Attempt:
        """Start a login of *name* (or join the one under way) and return it once its URL (and
        with *device*, its user code) is known or it ended. *on_success* runs once the tokens
        are stored. A login of the other kind under way is cancelled first.

        Error handling: :class:`SupervisorError` for an extension that logs in to nothing.
        """
        store = self.store(name, config)
        if store is None or not isinstance(config, RemoteConfig):
            why = "is not a remote server" if not isinstance(config, RemoteConfig) else "does not use OAuth"
            raise SupervisorError(f"extension {name!r} {why}: there is nothing to log in to")
        attempt = self._attempts.get(name)
        if attempt is not None and attempt.device != device:
            attempt.error = "replaced by a login of the other kind"
            attempt.scope.cancel()
            await attempt.done.wait()
            attempt = None
        if attempt is None:
            attempt = self._attempts[name] = Attempt(device)
            tg.start_soon(self._run, name, config, store, credentials, attempt, on_success)
        with anyio.move_on_after(URL_DEADLINE):
            await attempt.known.wait()
        return attempt

    async def _run(
        self,
        name: str,
        config: RemoteConfig,
        store: TokenStore,
        credentials: str | None,
        attempt: Attempt,
        on_success: Callable[[], Awaitable[None]],
    ) -> None:
        bound = structlog.contextvars.bound_contextvars(extension=name)
        try:
            with bound, attempt.scope:
                headers = await secretrefs.resolve(config.headers, credentials, field="headers")
                secret = (await oauth_secrets(config, credentials)).get("client_secret")
                if attempt.device:
                    await log_in_device(
                        config, store, headers=headers, client_secret=secret, on_code=attempt.show_code
                    )
                else:
                    await log_in(config, store, headers=headers, client_secret=secret, on_url=attempt.show)
            if attempt.scope.cancelled_caught and attempt.error is None:
                attempt.error = (
                    f"no login came within {LOGIN_TIMEOUT:g}s; run `mcp-supervisor login {name}` again"
                )
            if attempt.error is None:
                await on_success()  # before done: a waiting `login` then sees the run it starts
        except (LoginFailed, SpawnError) as exc:
            attempt.error = str(exc)
        except Exception as exc:  # a bug of ours: this login fails, the daemon goes on
            log.exception("oauth.login_crashed", extension=name)
            attempt.error = f"internal error: {exc}"
        finally:
            self._attempts.pop(name, None)
            attempt.known.set()
            attempt.done.set()
        if attempt.error is not None:
            log.warning("oauth.login_failed", extension=name, error=attempt.error)

    async def log_out(self, name: str, config: ExtensionConfig) -> bool:
        """Cancel a login under way, revoke and forget the tokens; whether the server confirmed."""
        if (attempt := self._attempts.get(name)) is not None:
            attempt.error = "cancelled by `mcp-supervisor logout`"
            attempt.scope.cancel()
        store = self.store(name, config)
        if store is None:
            raise SupervisorError(f"extension {name!r} has no login to forget")
        return await log_out(store, max_message_bytes=config.max_message_bytes)
