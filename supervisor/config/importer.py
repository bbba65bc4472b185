"""``mcp-supervisor import``: MCP clients' config files read, their stdio servers turned into extensions.

Claude Desktop, Cursor, Windsurf, Cline and Claude Code (``.mcp.json``, ``~/.claude.json``) keep servers
under ``mcpServers``; VS Code under ``servers`` (``.vscode/mcp.json``; ``mcp.servers`` in older
``settings.json``), as JSON with comments. :func:`plan` is pure: one :class:`Imported` per stdio server,
one line per server it cannot take and why. The file functions below it back up and rewrite the
client's file (atomically, same mode), leaving every other key as it was.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config import clientkeys, runners
from supervisor.config.file import read_bytes
from supervisor.config.remotes import MAPPED, REMOTE_KEYS, Unmappable, remote_entry, wrapped_remote
from supervisor.config.sandboxes import sandbox_of
from supervisor.errors import ConfigError

__all__ = (
    "MAX_CLIENT_BYTES",
    "ClientFile",
    "Imported",
    "Plan",
    "plan",
    "read_client",
    "sandbox_of",
)

MAX_CLIENT_BYTES = 64 << 20  # ~/.claude.json keeps every project's history: far larger than a config
_NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}|\$")
_OURS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?")  # ${VAR}, ${VAR:-default}: Claude Code's and ours
# VS Code's predefined variables (code.visualstudio.com/docs/reference/variables-reference), which
# Cursor's mcp.json also expands; the ones not mapped above have no meaning for a daemon.
_PREDEFINED = frozenset(
    {
        "cwd",
        "file",
        "fileBasename",
        "fileDirname",
        "lineNumber",
        "selectedText",
        "execPath",
        "defaultBuildTask",
    }
)
_TAKEN = ("command", "args", "env", "cwd", "type")


@dataclass(frozen=True, slots=True)
class ClientFile:
    """A client's config file as read: the whole document and where its server table is."""

    path: Path
    data: dict[str, Any]
    table: tuple[str, ...]  # ("mcpServers",), ("servers",), ("projects", DIR, "mcpServers"), ...
    client: str  # "vscode", "claude-code" or "claude" (any other mcpServers file)
    comments: bool  # JSON with comments or trailing commas: a rewrite cannot keep them
    indent: int | str = 2

    @property
    def servers(self) -> dict[str, Any]:
        node: Any = self.data
        for key in self.table:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}


@dataclass(frozen=True, slots=True)
class Imported:
    """One server taken: its name in the client file, its extension name and entry (plain data)."""

    source: str
    name: str
    entry: dict[str, Any]
    variables: tuple[str, ...] = ()  # ${VAR} it needs from the daemon's environment (no default)
    sandbox: str = ""  # what its sandbox grants, for the report


@dataclass(slots=True)
class Plan:
    imported: list[Imported] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "NAME: why", one per server left in the client
    notes: list[str] = field(default_factory=list)  # what was dropped or changed in imported servers


def read_client(path: str | os.PathLike[str], *, project: str | None = None) -> ClientFile:
    """Read a client's config file; *project* picks a Claude Code project in ``~/.claude.json``.

    Error handling: raises :class:`ConfigError` naming the file when it cannot be read, is not JSON
    (comments and trailing commas are fine) or has no server table.
    """
    where = Path(path)
    raw = read_bytes(where, MAX_CLIENT_BYTES)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError([f"{where}: not UTF-8"]) from None
    comments = False
    try:
        data = json.loads(text)
    except ValueError:
        comments = True
        try:
            data = json.loads(_strip_jsonc(text))
        except (ValueError, RecursionError) as exc:
            raise ConfigError([f"{where}: not valid JSON ({exc})"]) from None
    except RecursionError:
        raise ConfigError([f"{where}: nested too deeply"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{where}: the top level must be an object"])
    table = _table(where, data, project)
    client = "vscode" if table[-1] == "servers" else "claude"
    if where.name in (".claude.json", ".mcp.json"):
        client = "claude-code"
    indent = re.search(r"\n([ \t]+)\S", text)
    width: int | str = 2 if indent is None else "\t" if "\t" in indent.group(1) else len(indent.group(1))
    return ClientFile(where, data, table, client, comments, width)


def _table(where: Path, data: dict[str, Any], project: str | None) -> tuple[str, ...]:
    if project is not None:
        projects = data.get("projects")
        for key in (project, os.path.abspath(project)):
            if isinstance(projects, dict) and isinstance(projects.get(key), dict):
                return ("projects", key, "mcpServers")
        raise ConfigError([f"{where}: has no project {project!r} (Claude Code's per-project servers)"])
    if isinstance(data.get("mcpServers"), dict):
        return ("mcpServers",)
    if isinstance(data.get("servers"), dict):
        return ("servers",)
    if isinstance(data.get("mcp"), dict) and isinstance(data["mcp"].get("servers"), dict):
        return ("mcp", "servers")
    if isinstance(data.get("projects"), dict):  # ~/.claude.json without user-scope servers
        return ("mcpServers",)
    raise ConfigError([f"{where}: has no 'mcpServers' (or VS Code 'servers') object"])


def plan(client: ClientFile, *, home: str, workspace: str | None = None, taken: Iterable[str] = ()) -> Plan:
    """What importing *client* means: the servers taken, those left and why, and notes. Pure.

    *workspace* is what ``${workspaceFolder}`` means (None: not mappable); *home* ``${userHome}``.
    *taken* are names already used, for the renaming of names that are not valid extension names.
    """
    result = Plan()
    used = set(taken)
    listed = client.data.get("inputs")
    inputs = {i.get("id"): i for i in listed if isinstance(i, dict)} if isinstance(listed, list) else {}
    for source, raw in client.servers.items():
        try:
            entry, notes = _convert(raw, home=home, workspace=workspace, inputs=inputs)
        except Unmappable as exc:
            result.skipped.append(f"{source}: {exc}")
            continue
        if "command" in entry:
            notes += _first_start_allowance(entry)
        name = _extension_name(source, used)
        used.add(name)
        if name != source:
            result.notes.append(f"{source}: renamed to '{name}' (letters, digits, '_' and '-' only, no '__')")
        result.notes += [f"{name}: {note}" for note in notes]
        granted, report = (
            sandbox_of(entry) if "command" in entry else ({}, "a remote server: nothing runs here")
        )
        if granted:
            entry["sandbox"] = granted
        result.imported.append(Imported(source, name, entry, _variables(entry), report))
    if client.table == ("mcpServers",) and isinstance(client.data.get("projects"), dict):
        for directory, settings in client.data["projects"].items():
            servers = settings.get("mcpServers") if isinstance(settings, dict) else None
            if servers:
                result.notes.append(
                    f"not imported: {len(servers)} server(s) of project {directory} (Claude Code's local "
                    f"scope); import them with --project {directory}"
                )
    return result


def _convert(
    raw: Any, *, home: str, workspace: str | None, inputs: Mapping[Any, Any]
) -> tuple[dict[str, Any], list[str]]:
    """One client entry as an extension entry, with notes; raises Unmappable saying why not.

    A remote server (``url``, ``serverUrl``, ``httpUrl``, or the ``mcp-remote`` / ``mcp-proxy``
    stdio wrappers around one) comes in as a remote extension."""
    if not isinstance(raw, dict):
        raise Unmappable("not an object")

    def mapped(text: Any) -> str:
        return _map_variables(str(text), home=home, workspace=workspace, inputs=inputs)

    if (
        any(key in raw for key in REMOTE_KEYS)
        or raw.get("type", raw.get("transportType", "stdio")) != "stdio"
    ):
        return remote_entry(raw, mapped)
    if (wrapped := wrapped_remote(raw)) is not None:
        entry, notes = remote_entry(wrapped, mapped)
        return entry, [
            f"{raw['command']} {raw['args'][0] if raw.get('args') else ''}".strip()
            + " wraps a remote server: imported as that server",
            *notes,
        ]
    return _stdio_entry(raw, mapped)


def _stdio_entry(raw: dict[str, Any], mapped: Callable[[Any], str]) -> tuple[dict[str, Any], list[str]]:
    """A client's stdio entry: its command line and environment mapped, its client keys folded."""
    command, args = raw.get("command"), raw.get("args", [])
    if not isinstance(command, str) or not command.strip():
        raise Unmappable("has no 'command'")
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise Unmappable("'args' is not a list of strings")
    if os.path.basename(command) == "mcp-supervisor" and "connect" in args:
        raise Unmappable("it is mcp-supervisor's own connect entry")
    folded, notes = _client_keys(raw)
    entry: dict[str, Any] = {"command": mapped(command)}
    if args:
        entry["args"] = [mapped(arg) for arg in args]
    if env := _environment(raw, mapped, notes):
        entry["env"] = env
    if isinstance(raw.get("cwd"), str):
        entry["cwd"] = mapped(raw["cwd"])
    for key in MAPPED:
        value = folded.get(key)
        if key == "autostart" and value is True:  # `disabled: false`: the default says it
            continue
        if value is not None:
            entry[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return entry, notes


def _environment(raw: dict[str, Any], mapped: Callable[[Any], str], notes: list[str]) -> dict[str, str]:
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise Unmappable("'env' is not an object")
    unset = [key for key, value in env.items() if value is None]  # VS Code: remove from the environment
    if unset:
        notes.append(f"env {', '.join(unset)}: null (unset) is not supported, left out")
    return {str(key): mapped(value) for key, value in env.items() if value is not None}


def _client_keys(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The entry's client keys folded into settings (:func:`clientkeys.fold`), and a note on each
    one that changed meaning or was dropped."""
    try:
        folded, dropped = clientkeys.fold({k: v for k, v in raw.items() if k not in _TAKEN})
    except clientkeys.ClientKeyError as exc:
        raise Unmappable(str(exc)) from None
    dropped += [key for key in folded if key not in MAPPED]
    notes = []
    if "envFile" in dropped:
        dropped.remove("envFile")
        notes.append(f"envFile {raw['envFile']!r} is not read: copy its variables into env")
    if dropped:
        notes.append(f"ignored {', '.join(dropped)} (client settings mcp-supervisor does not use)")
    if folded.get("autostart") is False:
        notes.append("disabled in the client: autostart: false (start it with `mcp-supervisor start`)")
    if "call_timeout" in folded:
        notes.append(f"timeout {raw['timeout']!r} taken as call_timeout: {folded['call_timeout']:g} s")
    if "tools" in folded:
        notes.append(f"tools: {folded['tools']} (from the client's tool lists)")
    return folded, notes


def _first_start_allowance(entry: dict[str, Any]) -> list[str]:
    """A package runner's entry (npx -y, uvx, ...) gets first_start_timeout: its first start downloads."""
    runner = runners.downloads_first(entry["command"], entry.get("args", []))
    if runner is None:
        return []
    entry["first_start_timeout"] = runners.FIRST_START_TIMEOUT
    return [
        f"{runner} may download the server when first started: first_start_timeout: "
        f"{runners.FIRST_START_TIMEOUT} (start_timeout once it has started)"
    ]


def _map_variables(text: str, *, home: str, workspace: str | None, inputs: Mapping[Any, Any]) -> str:
    """Client placeholders as ours: ``${env:X}`` is ``${X}``, ``${userHome}`` the home, ``$`` else ``$$``.

    VS Code and Cursor expand ``${env:NAME}``, ``${userHome}``, ``${workspaceFolder}``,
    ``${workspaceFolderBasename}`` and ``${pathSeparator}`` (``${/}``); Claude Code ``${VAR}`` and
    ``${VAR:-default}``, as we do. Any other ``$`` is literal text there, so it is written ``$$``.
    """

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner is None:
            return "$$"
        if inner.startswith("env:") and _OURS.fullmatch(inner[4:]) and ":-" not in inner:
            return "${" + inner[4:] + "}"
        if inner in ("pathSeparator", "/"):
            return "/"
        if inner == "userHome":
            return home.replace("$", "$$")
        if inner in ("workspaceFolder", "workspaceFolderBasename") and workspace is not None:
            value = workspace if inner == "workspaceFolder" else os.path.basename(workspace)
            return value.replace("$", "$$")
        if inner.startswith("workspaceFolder"):
            raise Unmappable(f"${{{inner}}} has no meaning outside a workspace: give --workspace DIR")
        if inner.startswith("input:"):
            described = inputs.get(inner[6:], {}).get("description")
            asked = f" ({described})" if described else ""
            raise Unmappable(
                f"${{{inner}}}{asked} is asked by VS Code when the server starts, and a daemon cannot ask: "
                "add this server by hand, with the value in its env"
            )
        if _OURS.fullmatch(inner) and inner not in _PREDEFINED:
            return match.group(0)
        raise Unmappable(f"${{{inner}}} cannot be mapped to a daemon setting")

    return _PLACEHOLDER.sub(replace, text)


def _variables(entry: Mapping[str, Any]) -> tuple[str, ...]:
    texts = [
        entry.get("command", entry.get("url", "")),
        *entry.get("args", []),
        *entry.get("env", {}).values(),
        *entry.get("headers", {}).values(),
        entry.get("cwd", ""),
    ]
    found = re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", " ".join(texts).replace("$$", ""))
    return tuple(dict.fromkeys(found))


def _extension_name(source: str, used: set[str]) -> str:
    """*source* when it is a valid extension name, else a close one; never one in *used*."""
    name = source
    if not _NAME_OK.fullmatch(name) or "__" in name:
        name = re.sub(r"[^A-Za-z0-9_-]+", "-", source)
        name = re.sub(r"_{2,}", "_", name).strip("-_")[:64].strip("-_") or "server"
    base, n = name, 2
    while name in used:
        name = f"{base[:60]}-{n}"
        n += 1
    return name


def _strip_jsonc(text: str) -> str:
    """JSON with comments (VS Code's mcp.json): ``//`` and ``/* */`` comments and trailing commas removed."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        else:
            if c in "}]":
                spaces: list[str] = []
                while out and out[-1].isspace():
                    spaces.append(out.pop())
                if out and out[-1] == ",":
                    out.pop()
                out += reversed(spaces)
            out.append(c)
            i += 1
    return "".join(out)
