"""The sandbox an imported server gets, and what the import report says of it. Pure.

A file server (server-filesystem, mcp-server-git, ...) may write the directories it is told
to serve; any other server gets the default sandbox, and the report names the paths it is
given (in its arguments or its environment) and, for a file, the directory to grant.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ("FILE_SERVERS", "sandbox_of")

# Servers whose directory arguments are what they serve: those become write grants.
FILE_SERVERS = (
    "server-filesystem",
    "mcp-server-filesystem",
    "filesystem-mcp",
    "mcp-server-git",
    "server-git",
)
_PATHLIKE = ("/", "~", "${", "./", "../")
_HOMES = ("/home", "/Users")
_DEFAULT_SANDBOX = (
    "the default (the system and its own installation read-only, a package cache of its own, network all)"
)


def sandbox_of(entry: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The sandbox an imported server gets, and the report's words for it. Pure.

    A file server (server-filesystem, mcp-server-git, ...) may write the operands after its
    package name (and ``--repository PATH``); any other server gets the default, and the report
    names the paths it is given, which it may need granted.
    """
    words = [str(entry["command"]), *map(str, entry.get("args", []))]
    where = next((i for i, word in enumerate(words) if any(name in word for name in FILE_SERVERS)), None)
    after = words[where + 1 :] if where is not None else words[1:]
    paths = []
    for i, word in enumerate(after):
        value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        named = i > 0 and after[i - 1] in ("--repository", "-r")
        served = where is not None and not word.startswith("-")  # a file server's operands are its paths
        if value and (value.startswith(_PATHLIKE) or named or served):
            paths.append(value)
    if where is None:
        return None, _DEFAULT_SANDBOX + _hint(paths, entry.get("env") or {})
    if not paths:
        return None, _DEFAULT_SANDBOX + "; it is given no directory to serve"
    return {"write": paths}, f"may write {', '.join(paths)} (the directories it serves), network all"


def _hint(paths: list[str], env: Mapping[str, Any]) -> str:
    """What the report says of the paths a server is given, in its args or its env
    (``MEMORY_FILE_PATH``): the directory to grant for a file (SQLite and others write beside it)."""
    given = [(path, "") for path in paths]
    given += [(str(v), f" (env {k})") for k, v in env.items() if str(v).startswith(_PATHLIKE)]
    if not given:
        return ""
    said = []
    for path, where in given:
        directory = os.path.dirname(path.rstrip("/"))
        broad = directory in ("", "/", "~", "${HOME}", "/root") or os.path.dirname(directory) in _HOMES
        if not os.path.splitext(path)[1]:  # a directory, most likely
            said.append(f"{path}{where}")
        elif broad:
            said.append(f"{path}{where}: a file in a home; move it into a directory of its own to grant that")
        else:
            said.append(f"{path}{where}: grant {directory}, as it may write beside it (a journal)")
    return f"; it is given {'; '.join(said)}. Grant (sandbox.write) what it must write"
