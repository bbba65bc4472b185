"""The ``mcp-supervisor connect`` entry each MCP client needs, as it goes in that client's file. Pure.

The command is the absolute path of the ``mcp-supervisor`` script: editors start servers with a
minimal ``PATH`` (Claude Desktop launched from a dock or menu does not read the shell's profile), so
a bare ``mcp-supervisor`` would often not be found. ``--socket`` is added only when the daemon's
socket is not the one ``connect`` finds by itself in a client's environment.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from supervisor.paths import ENV_PREFIX, default_socket_path

__all__ = ("CLIENTS", "connect_args", "connect_command", "entry", "http_snippet", "snippet")

# client -> (its file, the key of its server table); claude-code is configured by a command
CLIENTS: dict[str, tuple[str, str]] = {
    "claude": ("claude_desktop_config.json", "mcpServers"),
    "cursor": ("~/.cursor/mcp.json", "mcpServers"),
    "windsurf": ("~/.codeium/windsurf/mcp_config.json", "mcpServers"),
    "vscode": (".vscode/mcp.json", "servers"),
    "claude-code": ("claude mcp add", "mcpServers"),
}
NAME = "supervisor"  # the entry's name in the client: its tools appear as supervisor's


def connect_command() -> str:
    """The absolute path of the ``mcp-supervisor`` script of this installation.

    The one beside the running interpreter (a venv's ``bin``) first, as it is this very install;
    else the one on ``PATH``; else the bare name (then the client needs it on its own ``PATH``).
    """
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "mcp-supervisor")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mcp-supervisor")
    return os.path.abspath(found) if found else "mcp-supervisor"


def connect_args(
    socket: str | None = None, profile: str | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """``connect`` with ``--socket`` when *socket* is not the default, and ``--profile`` when given.

    The default is computed without ``$MCP_SUPERVISOR_SOCKET``: a client does not start ``connect``
    with the shell's variables, so a socket named only there must be named on the command line.
    """
    env = dict(os.environ if environ is None else environ)
    env.pop(f"{ENV_PREFIX}SOCKET", None)
    args = ["connect"]
    if socket and os.path.abspath(socket) != os.path.abspath(default_socket_path(env)):
        args += ["--socket", os.path.abspath(socket)]
    if profile:
        args += ["--profile", profile]
    return args


def entry(client: str, command: str, args: list[str]) -> dict[str, Any]:
    """The server entry for *client*'s file: VS Code and Claude Code write ``type: stdio``."""
    if client in ("vscode", "claude-code"):
        return {"type": "stdio", "command": command, "args": args}
    return {"command": command, "args": args}


def snippet(client: str, command: str, args: list[str]) -> str:
    """What to paste: JSON for a file-based client, the ``claude mcp add`` command for Claude Code."""
    if client == "claude-code":
        return shlex.join(["claude", "mcp", "add", "--scope", "user", NAME, "--", command, *args])
    table = CLIENTS[client][1]
    inner = json.dumps(entry(client, command, args))
    return f'{{\n  "{table}": {{\n    "{NAME}": {inner}\n  }}\n}}'


def http_snippet(client: str, url: str, headers: dict[str, str]) -> str:
    """What to paste for a client of the HTTP gateway: each client's spelling of a URL with headers
    (Windsurf says ``serverUrl``, VS Code ``type: http``), or ``claude mcp add --transport http``."""
    if client == "claude-code":
        sent = [arg for name, value in headers.items() for arg in ("--header", f"{name}: {value}")]
        add = ["claude", "mcp", "add", "--transport", "http", "--scope", "user", NAME, url]
        return shlex.join([*add, *sent])
    fields: dict[str, Any] = {"serverUrl": url} if client == "windsurf" else {"url": url}
    if client == "vscode":
        fields = {"type": "http", **fields}
    table = CLIENTS[client][1]
    inner = json.dumps({**fields, "headers": headers})
    return f'{{\n  "{table}": {{\n    "{NAME}": {inner}\n  }}\n}}'
