"""A client's remote server entries as extension entries: ``url`` (``serverUrl``, ``httpUrl``),
and the stdio wrappers of one (``mcp-remote``, ``mcp-proxy``) as the server they wrap. Pure; used
by :mod:`supervisor.config.importer`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from supervisor.config import clientkeys

__all__ = ("MAPPED", "REMOTE_KEYS", "Unmappable", "remote_entry", "wrapped_remote")

REMOTE_KEYS = ("url", "serverUrl", "httpUrl")  # serverUrl: Windsurf; httpUrl: Gemini CLI
MAPPED = ("autostart", "call_timeout", "call_timeout_max", "tools")  # what clientkeys.fold produces


class Unmappable(Exception):
    """A client entry that cannot come in (the message says why; it stays in the client)."""


_TRANSPORT_SPELLINGS = {"sse": "sse", "http": "http", "streamable-http": "http", "streamableHttp": "http"}


def remote_entry(raw: dict[str, Any], mapped: Callable[[Any], str]) -> tuple[dict[str, Any], list[str]]:
    """A remote server's entry: its URL, transport and headers (values copied as they are)."""
    url = next((raw[key] for key in REMOTE_KEYS if key in raw), None)
    if not isinstance(url, str) or not url.strip():
        raise Unmappable(f"type '{raw.get('type', raw.get('transportType'))}' without a 'url'")
    entry: dict[str, Any] = {"url": mapped(url)}
    kind = raw.get("type", raw.get("transportType", "http" if "httpUrl" in raw else None))
    if kind is not None:
        if kind not in _TRANSPORT_SPELLINGS:
            raise Unmappable(f"type '{kind}' is no transport mcp-supervisor knows (http, sse)")
        entry["type"] = _TRANSPORT_SPELLINGS[kind]
    notes = []
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict):
        raise Unmappable("'headers' is not an object")
    if headers:
        entry["headers"] = {str(name): mapped(value) for name, value in headers.items()}
        notes.append(
            f"headers {', '.join(map(str, headers))} copied as they are: a secret in one is better "
            "kept as ${credential:NAME} (systemd credentials) or ${file:PATH}"
        )
    try:
        folded, dropped = clientkeys.fold(
            {k: v for k, v in raw.items() if k not in (*REMOTE_KEYS, "type", "transportType", "headers")}
        )
    except clientkeys.ClientKeyError as exc:
        raise Unmappable(str(exc)) from None
    dropped += [key for key in folded if key not in MAPPED]
    if dropped:
        notes.append(f"ignored {', '.join(dropped)} (client settings mcp-supervisor does not use)")
    for key in MAPPED:
        if (value := folded.get(key)) is not None and not (key == "autostart" and value is True):
            entry[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return entry, notes


def wrapped_remote(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The remote server an ``mcp-remote`` (npm) or ``mcp-proxy`` (PyPI) stdio entry wraps, as a
    client's url entry; None for any other command."""
    command, args = raw.get("command"), raw.get("args", [])
    if (
        not isinstance(command, str)
        or not isinstance(args, list)
        or not all(isinstance(a, str) for a in args)
    ):
        return None
    argv = [os.path.basename(command), *args]
    tool = next((a for a in argv if a.split("@")[0] in ("mcp-remote", "mcp-proxy")), None)
    if tool is None:
        return None
    rest = argv[argv.index(tool) + 1 :]
    url = next((a for a in rest if a.startswith(("http://", "https://"))), None)
    if url is None:
        return None  # mcp-proxy serving a stdio server over HTTP, not a client of one
    found: dict[str, Any] = {"url": url, "headers": {}}
    pairs = iter(rest)
    for arg in pairs:
        if arg in ("--header", "-H", "--headers"):
            value = next(pairs, "")
            if tool.startswith("mcp-remote") and ":" in value:
                name, _, text = value.partition(":")
                found["headers"][name.strip()] = text.strip()
            elif not tool.startswith("mcp-remote"):
                found["headers"][value] = next(pairs, "")
        elif arg.startswith("--transport"):
            value = arg.partition("=")[2] or next(pairs, "")
            if value in ("http-only", "streamablehttp"):
                found["type"] = "http"
            elif value in ("sse-only", "sse"):
                found["type"] = "sse"
    if tool.startswith("mcp-proxy") and "type" not in found:
        found["type"] = "sse"  # its client mode's default transport
    if not found["headers"]:
        del found["headers"]
    return found
