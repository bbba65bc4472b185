"""The keys MCP clients' config files put beside ``command``/``args``/``env``, and what they mean here.

Pure: used by :mod:`supervisor.config.settings` (a client file loaded as the daemon's config) and by
:mod:`supervisor.config.importer` (``mcp-supervisor import``), so that both read a client entry the same way.
"""

from __future__ import annotations

import glob
import math
from collections.abc import Mapping
from typing import Any

__all__ = ("IGNORED", "ClientKeyError", "fold", "seconds")

# Keys that mean nothing to a supervisor: dropped, and named in one warning per extension.
IGNORED = frozenset(
    {
        "autoApprove",  # Cline: tools run without asking; the client decides that, not us
        "alwaysAllow",  # Roo Code: same
        "alwaysAllowResources",  # Roo Code
        "watchPaths",  # Roo Code: restart the server when these files change
        "envFile",  # VS Code, Cursor: a .env file the client reads; not read here (copy its variables to env)
        "description",  # Gemini CLI, display only
        "trust",  # Gemini CLI: skip confirmations
        "dev",  # VS Code: {watch, debug} for server development
        "gallery",  # VS Code: where the entry was installed from
        "version",  # VS Code
        "auth",  # Cursor: OAuth for remote servers
        "oauth",  # Gemini CLI
        "headers",  # HTTP servers only
    }
)
_LONGEST_SECONDS = (
    3600.0  # Roo Code's maximum for `timeout` in seconds; above it, only milliseconds make sense
)
_CALL_TIMEOUT_MAX = 600.0  # ExtensionConfig's default absolute cap per call


class ClientKeyError(ValueError):
    """A client key whose value cannot be read (the message says why)."""


def seconds(timeout: Any) -> float | None:
    """A client's per-server ``timeout`` in seconds, or None when it is not a positive finite number.

    The unit differs between clients: Cline (``src/services/mcp/schemas.ts``: ``timeout: z.number()
    .min(MIN_MCP_TIMEOUT_SECONDS).default(DEFAULT_MCP_TIMEOUT_SECONDS)``, 60) and Roo Code (``McpHub.ts``:
    ``z.number().min(1).max(3600).default(60)``) give seconds; Gemini CLI (docs/configuration.md:
    "Timeout in milliseconds for requests to this MCP server", default 600000) gives milliseconds.
    Claude Desktop, Cursor, Windsurf, Claude Code and VS Code have no such key. So a value up to 3600
    is seconds and a larger one milliseconds (Gemini's 30000 is 30 s; nobody means 8 hours per call).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return None
    if not math.isfinite(timeout) or timeout <= 0:
        return None
    return float(timeout) if timeout <= _LONGEST_SECONDS else timeout / 1000.0


def fold(entry: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Map the client keys of *entry* to settings; return the new entry and the keys dropped unused.

    ``disabled`` becomes ``autostart`` (negated); ``transportType: stdio`` (Cline's older spelling of
    ``type``) is dropped; ``timeout`` becomes ``call_timeout`` (see :func:`seconds`), raising
    ``call_timeout_max`` when it is longer; ``disabledTools`` (Roo Code, Windsurf) and ``excludeTools``
    (Gemini CLI) become ``tools.deny``, ``includeTools`` (Gemini CLI) ``tools.allow``, as exact names.
    The :data:`IGNORED` keys are dropped, as is a key our own setting overrides. Other keys stay.

    Error handling: raises :class:`ClientKeyError` for ``disabled`` that is not a boolean, or given
    together with ``autostart``, and for ``transportType`` other than ``stdio``.
    """
    data = dict(entry)
    dropped: list[str] = [key for key in entry if key in IGNORED]
    for key in dropped:
        del data[key]
    if "transportType" in data:
        kind = data.pop("transportType")
        if kind != "stdio":
            raise ClientKeyError(f"only stdio servers can be supervised, not transportType '{kind}'")
    if "disabled" in data:
        disabled = data.pop("disabled")
        if "autostart" in data:
            raise ClientKeyError("give 'autostart' or 'disabled', not both")
        if not isinstance(disabled, bool):
            raise ClientKeyError("'disabled' should be true or false")
        data["autostart"] = not disabled
    if "timeout" in data:
        timeout = seconds(data.pop("timeout"))
        if timeout is None or "call_timeout" in data:
            dropped.append("timeout")
        else:
            data["call_timeout"] = timeout
            if timeout > _CALL_TIMEOUT_MAX and "call_timeout_max" not in data:
                data["call_timeout_max"] = timeout
    for key, field in (("disabledTools", "deny"), ("excludeTools", "deny"), ("includeTools", "allow")):
        if key not in data:
            continue
        names = data.pop(key)
        tools = data.get("tools", {})
        if not _names(names) or not isinstance(tools, Mapping):
            dropped.append(key)
            continue
        patterns = [glob.escape(name) for name in names]  # names, not globs: `[`, `*`, `?` match themselves
        base = list(tools.get(field, [])) if field == "deny" or "allow" in tools else []
        data["tools"] = {**tools, field: base + patterns}
    return data, dropped


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) for name in value)
