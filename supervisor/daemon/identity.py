"""What names one daemon: its instance (by socket), its children's marker, what they must not see.

Light on purpose: the head start (:mod:`.headstart`) needs these before the MCP SDK is imported.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from supervisor import paths
from supervisor.config.settings import Settings
from supervisor.process import sandbox

__all__ = ("SANDBOX_ABI", "child_environ", "instance_key", "marker_prefix", "sandbox_context", "spool_root")

SANDBOX_ABI = "MCP_SUPERVISOR_SANDBOX_ABI"

_NOT_FOR_CHILDREN = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})  # systemd talks to us only
# The daemon's own settings and knobs: a gateway token, the socket, the config's path. (The
# credentials directory is left out at each spawn, once the secrets it holds are read.)
_OWN_PREFIXES = ("MCP_SUPERVISOR_",)


def instance_key(socket_path: str) -> str:
    """Names this daemon's children by its socket, so a successor finds what it left behind."""
    return hashlib.sha256(os.path.abspath(socket_path).encode()).hexdigest()[:12]


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The daemon's environment as its children inherit it (each extension's ``env`` merged over):
    without the daemon's own settings and secrets (``MCP_SUPERVISOR_*``)."""
    return {
        k: v for k, v in environ.items() if k not in _NOT_FOR_CHILDREN and not k.startswith(_OWN_PREFIXES)
    }


def marker_prefix(instance: str) -> str:
    """What every child of this daemon process carries in its marker (see :mod:`supervisor.process.tree`)."""
    return f"{instance}:{os.getpid()}:"


def sandbox_context(
    settings: Settings, *, config_path: str | None, environ: Mapping[str, str]
) -> sandbox.Context:
    """What the extensions of a daemon on *settings* must never see: its config, sockets, state,
    spool, and one another's private package caches.

    ``MCP_SUPERVISOR_SANDBOX_ABI=N`` in the daemon's own environment caps the Landlock ABI its
    sandboxes use: what a host with an older kernel gets, seen on this one.
    """
    cap = os.environ.get(SANDBOX_ABI, "")
    return sandbox.daemon_context(
        environ=environ,
        config_path=config_path,
        socket=settings.socket,
        state=str(paths.default_state_root(environ)),
        spool=str(spool_root(settings, environ)),
        instance=instance_key(settings.socket),
        max_abi=int(cap) if cap.isdigit() else None,
        caches=str(paths.default_caches_root(environ)),
    )


def spool_root(settings: Settings, environ: Mapping[str, str]) -> Path:
    """Where the spool of a daemon on *settings* lives: ``spool.dir``, else the default."""
    return Path(settings.spool.dir) if settings.spool.dir else paths.default_spool_root(environ)
