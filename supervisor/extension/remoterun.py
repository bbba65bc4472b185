"""One run of a remote server, as the watcher serves it: connected, judged by why it ended.

:func:`open_remote` reads the headers' secrets and opens the transport; :class:`RemoteRun` says
what the watcher needs of that kind. It has no pid and no tree: a start past its deadline has
nothing to be busy with, and every end of a run (a refused connection, a broken stream, a lost
session, a guard) is a crash the restart policy backs off from, never a clean exit.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from anyio.abc import TaskGroup

from supervisor.config import secrets as secretrefs
from supervisor.config.extension import RemoteConfig
from supervisor.errors import first_line
from supervisor.extension.backoff import Outcome, OutcomeKind
from supervisor.remote.auth import configured_client, run_auth
from supervisor.remote.connection import connect
from supervisor.remote.deadlines import AnswerTimes
from supervisor.remote.tokens import TokenStore
from supervisor.remote.upstream import RemoteConnection

__all__ = ("RemoteRun", "oauth_secrets", "open_remote")


class RemoteRun:
    """A connected remote run (see the module)."""

    pid: int | None = None

    def __init__(self, name: str, connection: RemoteConnection) -> None:
        self.name = name
        self.upstream = connection

    async def cpu_seconds(self) -> float | None:
        return None  # nothing of it runs here: past the deadline, the start ends

    async def start_failed(self, exc: Exception) -> Outcome:
        """A handshake that failed: the transport's reason first (a refused connection, a 4xx)."""
        if (login := self._login_outcome(0.0)) is not None:
            return login
        error = self.upstream.failure or first_line(exc, typed=False)
        return Outcome(OutcomeKind.START_FAILED, error=f"{error} ({self.upstream.url})")

    def ended(self, uptime: float) -> Outcome:
        if (login := self._login_outcome(uptime)) is not None:
            return login
        return Outcome(OutcomeKind.CRASHED, uptime, error=self.upstream.failure or "the connection ended")

    def _login_outcome(self, uptime: float) -> Outcome | None:
        """The server refused the run's credentials: it waits for ``mcp-supervisor login``."""
        why = self.upstream.needs_login
        if why is None:
            return None
        return Outcome(
            OutcomeKind.NEEDS_LOGIN, uptime, error=f"{why}; run `mcp-supervisor login {self.name}`"
        )

    def guard(self, helpers: TaskGroup, config: Any, exceeded: Any) -> None:
        """No guard of its own: liveness (``ping_interval``) is every kind's."""


ANSWER_GRACE = 2.0  # seconds an answer may go on past the longest wait for it


@asynccontextmanager
async def open_remote(
    name: str,
    config: RemoteConfig,
    *,
    credentials: str | None,
    tokens: TokenStore | None = None,
    **connect_options: Any,
) -> AsyncIterator[RemoteRun]:
    """Open a run of *config* (extension *name*) and yield its :class:`RemoteRun`;
    *connect_options* go to :func:`supervisor.remote.connection.connect`. *tokens*: its OAuth
    login, refreshed by the run (:func:`supervisor.remote.auth.run_auth`).

    Error handling: :class:`~supervisor.errors.SpawnError` (permanent) for a header or a
    ``client_secret`` whose secret cannot be read.
    """
    headers: Mapping[str, str] = await secretrefs.resolve(config.headers, credentials, field="headers")
    secrets = await oauth_secrets(config, credentials)
    if tokens is not None:
        tokens.configured = configured_client(
            config.oauth, secrets.get("client_secret"), config.oauth.callback_port or 0
        )
    async with connect(
        config.url,
        kind=config.type,
        headers=headers,
        max_message_bytes=config.max_message_bytes,
        stop_timeout=config.stop_timeout,
        answer_times=_answer_times(config),
        auth=functools.partial(run_auth, config, tokens, secrets),
        **connect_options,
    ) as connection:
        yield RemoteRun(name, connection)


def _answer_times(config: RemoteConfig) -> AnswerTimes:
    """No one waits longer for an answer: a stalled or endless one is cut then (a request's
    at once when it is cancelled). A call renewed by progress, or held while its client is
    asked, may wait up to ``call_timeout_max``."""
    start = max(config.start_timeout, config.first_start_timeout or 0)
    return AnswerTimes(
        request=max(config.call_timeout_max, start) + ANSWER_GRACE,
        other=max(config.call_timeout, start) + ANSWER_GRACE,
    )


async def oauth_secrets(config: RemoteConfig, credentials: str | None) -> Mapping[str, str]:
    """The config's OAuth secrets, expanded (``client_secret``: ``${credential:NAME}``, ...)."""
    secret = config.oauth.client_secret
    if secret is None:
        return {}
    return await secretrefs.resolve({"client_secret": secret}, credentials, field="oauth")
