"""Where things are by default. Cheap to import: the CLI's client commands need only this."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

__all__ = ("ENV_PREFIX", "default_config_path", "default_socket_path", "is_loopback")

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
