"""Where things are by default. Cheap to import: the CLI's client commands need only this."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = (
    "ENV_PREFIX",
    "default_caches_root",
    "default_config_path",
    "default_socket_path",
    "default_spool_root",
    "default_state_root",
    "is_loopback",
)

ENV_PREFIX = "MCP_SUPERVISOR_"


def default_socket_path(environ: Mapping[str, str] | None = None) -> str:
    """``$MCP_SUPERVISOR_SOCKET``, else ``/run/...`` for root, else under ``$XDG_RUNTIME_DIR`` or ``/tmp``."""
    env = os.environ if environ is None else environ
    if env.get(ENV_PREFIX + "SOCKET"):
        return env[ENV_PREFIX + "SOCKET"]
    if os.geteuid() == 0:
        return "/run/mcp-supervisor/control.sock"
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "mcp-supervisor", "control.sock")
    return f"/tmp/mcp-supervisor-{os.geteuid()}/control.sock"


def default_config_path(environ: Mapping[str, str] | None = None) -> str:
    """The config file: ``$MCP_SUPERVISOR_CONFIG``, else ``/etc/mcp-supervisor/config.yaml``."""
    env = os.environ if environ is None else environ
    return env.get(ENV_PREFIX + "CONFIG") or "/etc/mcp-supervisor/config.yaml"


def is_loopback(host: str) -> bool:
    """Whether *host* (an address or ``localhost``) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_state_root(environ: Mapping[str, str]) -> Path:
    """``$STATE_DIRECTORY`` (its first entry), else ``$XDG_STATE_HOME`` or ``~/.local/state``, + our name."""
    given = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return Path(given)
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "mcp-supervisor"


def default_spool_root(environ: Mapping[str, str]) -> Path:
    """``$CACHE_DIRECTORY/spool`` (systemd), else ``<$XDG_CACHE_HOME or ~/.cache>/mcp-supervisor/spool``."""
    if environ.get("CACHE_DIRECTORY"):
        return Path(environ["CACHE_DIRECTORY"].split(":")[0]) / "spool"
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "mcp-supervisor" / "spool"


def default_caches_root(environ: Mapping[str, str]) -> Path:
    """Where confined extensions' private package caches live: beside the spool."""
    return default_spool_root(environ).with_name("extensions")
