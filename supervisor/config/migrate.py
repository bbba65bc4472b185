"""``mcp-supervisor import``, the writing half: the config merged and written, the client's file rewritten.

Every write is atomic (a temporary file beside the target, then a rename) and keeps the target's
mode; the client's file is copied to ``FILE.bak-YYYYmmdd-HHMMSS`` first. The config is written only
once the merged text loads as the daemon would load it, and the client's file only after that.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from supervisor.config import snippets as clientconfig
from supervisor.config.file import add_extensions, extension_names, read_bytes, yaml_error
from supervisor.config.importer import ClientFile, Plan, plan, read_client
from supervisor.errors import ConfigError, SupervisorError

__all__ = (
    "ImportRefused",
    "Request",
    "backup",
    "merged_config",
    "rewrite_client",
    "rewritten",
    "run_import",
    "workspace_of",
    "write_atomic",
)

_CONNECT_NAME = clientconfig.NAME


class ImportRefused(SupervisorError):
    """An import that cannot be done as asked (a name taken without ``--force``, nothing to import)."""


@dataclass(frozen=True, slots=True)
class Request:
    """What ``mcp-supervisor import`` was asked to do."""

    file: str
    config: Path
    force: bool = False
    rewrite_client: bool = False
    dry_run: bool = False
    workspace: str | None = None  # what ${workspaceFolder} means; None: see workspace_of()
    project: str | None = None  # a Claude Code project of ~/.claude.json
    socket: str | None = None  # the daemon's socket, for the connect entry (None: the config's)


def run_import(
    request: Request,
    *,
    load: Callable[[Path, Mapping[str, str]], str],
    say: Callable[[str], None],
    environ: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> int:
    """Import as *request* says; return how many servers were imported. *say* prints one line.

    *load* validates a config file as the daemon would (in the given environment) and returns its
    socket path; it raises :class:`ConfigError`. Variables the imported entries need but *environ*
    lacks are named, and stand in as placeholders for the validation.
    Error handling: :class:`ImportRefused` and :class:`ConfigError` leave every file as it was.
    """
    environ = os.environ if environ is None else environ
    client = read_client(request.file, project=request.project)
    text = _config_text(request.config)
    workspace = request.workspace or workspace_of(client.path, request.project)
    found = plan(client, home=os.path.expanduser("~"), workspace=workspace)
    for line in found.skipped:
        say(f"skipped {line}")
    for line in found.notes:
        say(f"note: {line}")
    if not found.imported:
        raise ImportRefused(f"no server to import from {client.path}")
    stamp = (now or datetime.now()).strftime("%Y-%m-%d %H:%M")
    comment = f"imported from {client.path} by mcp-supervisor import, {stamp}"
    new, kept, replaced = merged_config(text, found, force=request.force, comment=comment)
    if request.rewrite_client:  # what would stop the rewrite stops the import, before anything is written
        rewritten(client, [i.source for i in found.imported], {})
    unset = sorted({v for i in found.imported for v in i.variables if v not in environ})
    for name in unset:
        say(f"note: {name} is not set here: the daemon needs it in its environment")
    for item in found.imported:
        verb = "replaced" if item.name in replaced else "imported"
        entry = item.entry
        runs = entry["url"] if "url" in entry else shlex.join([entry["command"], *entry.get("args", [])])
        say(f"{verb} {item.name}: {runs}")
        say(f"  sandbox: {item.sandbox}")
    if request.dry_run:
        say(f"dry run: {request.config} and {client.path} left as they are")
        return len(found.imported)
    check_env = {**environ, **dict.fromkeys(unset, "placeholder")}
    sockets: list[str] = []

    def check(path: Path) -> None:
        try:
            sockets.append(load(path, check_env))
        except ConfigError as exc:
            shown = [line.replace(str(path), str(request.config)) for line in exc.errors]
            raise ConfigError(
                [f"nothing written, the merged config would not load: {shown[0]}", *shown[1:]]
            ) from None

    request.config.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(request.config, new, check=check)
    say(f"wrote {request.config}" + ("" if kept else " (written anew from its data: its comments are gone)"))
    if request.rewrite_client:
        args = clientconfig.connect_args(request.socket or sockets[0], environ=environ)
        connect = clientconfig.entry(client.client, clientconfig.connect_command(), args)
        saved = rewrite_client(client, found, connect, now)
        lost = " (its comments are only in the backup)" if client.comments else ""
        say(f"rewrote {client.path}: one '{_CONNECT_NAME}' entry runs connect; backup {saved}{lost}")
    return len(found.imported)


def _config_text(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        return read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not valid UTF-8"]) from None


def workspace_of(path: Path, project: str | None = None) -> str | None:
    """What ``${workspaceFolder}`` means for a client file: the project of ``.vscode/``, ``.mcp.json``.

    None for a user-level file (Claude Desktop, ``~/.cursor/mcp.json``): no single workspace.
    """
    if project:
        return os.path.abspath(project)
    folder = path.resolve().parent
    if path.name == ".mcp.json":
        return str(folder)
    if folder.name in (".vscode", ".cursor", ".roo") and folder.parent != Path.home().resolve():
        return str(folder.parent)
    return None


def rewritten(client: ClientFile, sources: Iterable[str], connect: dict[str, Any]) -> str:
    """The client's file with the *sources* entries replaced by one ``supervisor`` entry *connect*.

    Every other key keeps its value and order. Error handling: raises :class:`ConfigError` when a
    ``supervisor`` entry that is not being replaced is in the way.
    """
    data = json.loads(json.dumps(client.data))  # a deep copy; the ClientFile stays as read
    table: dict[str, Any] = data
    for key in client.table:
        table = table.setdefault(key, {})
    gone = set(sources)
    if _CONNECT_NAME in table and _CONNECT_NAME not in gone and table[_CONNECT_NAME] != connect:
        existing = table[_CONNECT_NAME]
        if not (isinstance(existing, dict) and "connect" in existing.get("args", [])):
            raise ConfigError(
                [f"{client.path}: has an entry named '{_CONNECT_NAME}' already; rename it first"]
            )
    kept = {name: value for name, value in table.items() if name not in gone and name != _CONNECT_NAME}
    table.clear()
    table.update(kept)
    table[_CONNECT_NAME] = connect
    return json.dumps(data, indent=client.indent, ensure_ascii=False) + "\n"


def backup(path: Path, now: datetime | None = None) -> Path:
    """Copy *path* to ``PATH.bak-YYYYmmdd-HHMMSS`` beside it (same mode); return the copy's path."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    target, n = path.with_name(f"{path.name}.bak-{stamp}"), 1
    while target.exists():  # two imports within a second
        target, n = path.with_name(f"{path.name}.bak-{stamp}-{n}"), n + 1
    write_atomic(target, path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
    return target


def merged_config(
    text: str | None, found: Plan, *, force: bool, comment: str = ""
) -> tuple[str, bool, list[str]]:
    """The config *text* with *found*'s extensions added: (new text, comments kept, names replaced).

    Error handling: raises :class:`ImportRefused` when a name is taken and not *force*, and
    :class:`ConfigError` when *text* is not YAML.
    """
    try:
        existing = extension_names(text) if text else []
        names = {i.name for i in found.imported}
        clash = [name for name in existing if name in names]
        if clash and not force:
            raise ImportRefused(
                f"{', '.join(repr(n) for n in clash)} already configured: give --force to replace "
                f"{'it' if len(clash) == 1 else 'them'} (nothing was written)"
            )
        entries = {i.name: i.entry for i in found.imported}
        new, kept = add_extensions(text, entries, replace=clash, comment=comment)
    except (yaml_error(), RecursionError) as exc:
        raise ConfigError([f"the config is not valid YAML ({exc})"]) from None
    return new, kept, clash


def rewrite_client(
    client: ClientFile, found: Plan, connect: dict[str, Any], now: datetime | None = None
) -> Path:
    """Back the client's file up, then replace its imported entries by *connect*; return the backup.

    A symlinked file is backed up and rewritten where it really is.
    """
    text = rewritten(client, [i.source for i in found.imported], connect)
    saved = backup(Path(os.path.realpath(client.path)), now)
    write_atomic(client.path, text)
    return saved


def write_atomic(
    path: Path, data: str | bytes, mode: int | None = None, check: Callable[[Path], None] | None = None
) -> None:
    """Write a temporary file beside *path*, then rename it over *path*: readers see old or new, never half.

    *mode* None keeps the mode of an existing *path* (0600 for a new one), and its owner when we
    may (``sudo mcp-supervisor import``). A symlink is followed: its target is replaced, the link
    stays (dotfiles managed with links). *check* runs on the temporary file before the rename;
    what it raises leaves *path* untouched.
    """
    path = Path(os.path.realpath(path))
    old = path.stat() if path.exists() else None
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old else 0o600
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            if old is not None:
                with contextlib.suppress(OSError):  # only root may give a file away
                    os.fchown(out.fileno(), old.st_uid, old.st_gid)
            os.fsync(out.fileno())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
