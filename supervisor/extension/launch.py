"""One run's launch: its marker, its environment with secrets filled in, its sandbox run, its child.

The watcher launches every run of its extension here. The daemon's head start
(:mod:`supervisor.daemon.headstart`) launches a first run the same way before it imports the MCP
SDK, and the watcher adopts that run instead of launching its own. Light on purpose: nothing
here imports the SDK.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor.config import secrets as secretrefs
from supervisor.config.extension import ExtensionConfig, StdioConfig
from supervisor.process import children as process
from supervisor.process import sandbox

if TYPE_CHECKING:
    from supervisor.extension.startup import Ticket

__all__ = ("Launched", "discard", "environment", "launch", "run_marker")

Environment = Mapping[str, "str | secretrefs.EnvTemplate"]


@dataclass(eq=False, slots=True)
class Launched:
    """A spawned run: its marker, its process, and its sandbox run (its private directory).

    Resource handling: its owner hands *child* to a connection, which ends the tree, and then
    removes *jail*; or it calls :func:`discard`. Whoever holds *ticket* releases it.
    """

    marker: str
    child: process.ChildProcess
    jail: sandbox.Run | None
    ticket: Ticket | None = None  # the start slot it was launched in, when not its watcher's


def run_marker(prefix: str, name: str) -> str:
    """A new run's marker. Fixed-length and unique, so no run's is a prefix of another's (:1 vs :12)."""
    return f"{prefix}{name}:{secrets.token_hex(6)}"


def environment(
    environ: Mapping[str, str], config: ExtensionConfig
) -> tuple[dict[str, str | secretrefs.EnvTemplate], str | None]:
    """The environment a child of *config* starts with (secrets still references), and the
    daemon's credentials directory they are read from.

    The credentials directory is the daemon's own: a child gets what its ``env`` names, not the
    way to read every other credential.
    """
    inherited = {k: v for k, v in environ.items() if k != secretrefs.CREDENTIALS}
    own = config.env if isinstance(config, StdioConfig) else {}  # a remote server: the directory only
    return {**inherited, **own}, environ.get(secretrefs.CREDENTIALS)


async def launch(
    config: StdioConfig,
    *,
    env: Environment,
    credentials: str | None,
    confinement: sandbox.Sandbox | None,
    marker: str,
) -> Launched:
    """Spawn a run of *config* as *marker*, inside *confinement* (None: unconfined).

    Error handling: raises :class:`~supervisor.errors.SpawnError`, ``permanent`` for a missing
    secret, a sandbox the kernel cannot enforce, or a command that cannot be found; nothing is
    left behind.
    """
    filled = await secretrefs.resolve(env, credentials)
    jail = await confinement.prepare() if confinement is not None else None
    try:
        child = await process.spawn(
            [config.command, *config.args],
            env=filled,
            cwd=config.cwd,
            marker=marker,
            wrap=jail.wrap if jail is not None else None,
        )
    except BaseException:
        if jail is not None:
            await jail.remove()
        raise
    return Launched(marker, child, jail)


async def discard(launched: Launched) -> None:
    """End a run: its tree, unless a connection took it over and ended it, then its private
    directory, and give back the start slot it still holds. Idempotent. A run no connection
    served has nothing to save: it is killed at once."""
    try:
        if not launched.child.terminated:
            await process.terminate_tree(launched.child, grace=0, term_grace=0)
    finally:
        jail, launched.jail = launched.jail, None
        try:
            if jail is not None:
                await jail.remove()
        finally:
            if launched.ticket is not None:
                launched.ticket.release()
