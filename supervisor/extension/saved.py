"""Saved listings of on-demand extensions: what gateway clients see while the child is not running.

One JSON file per extension under ``<state>/catalogs/<daemon instance>/``, where ``<state>`` is
``$STATE_DIRECTORY`` (systemd's ``StateDirectory=``), else ``~/.local/state/mcp-supervisor``.
Directories are 0700 and files 0600; a write goes to a temporary file that replaces the old
one, so a crash leaves the old listing or the new one, never half of one. A file over
:data:`MAX_BYTES`, unreadable, malformed, or written for another command line (a *foreign*
file: the :func:`fingerprint` of command, args, its own env, cwd or grants differs) is ignored
with a warning that names what changed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mcp_types as types
import structlog

from supervisor.config.extension import RemoteConfig
from supervisor.privatefiles import write_private
from supervisor.upstream.listing import Listing

if TYPE_CHECKING:
    from supervisor.config.extension import ExtensionConfig

__all__ = ("MAX_BYTES", "CatalogStore", "changed_parts", "fingerprint", "prune")

log = structlog.get_logger(__name__)

VERSION = 2  # 2: a fingerprint per part of the command line
MAX_BYTES = 8 * 1024 * 1024  # one extension's saved listing; a larger one is not written nor read
STALE_TEMP_SECONDS = 60.0  # a temporary file this old is a crashed write's, not one in progress
_KINDS: tuple[tuple[str, Any], ...] = (
    ("tools", types.Tool),
    ("prompts", types.Prompt),
    ("resources", types.Resource),
    ("templates", types.ResourceTemplate),
)


def fingerprint(config: ExtensionConfig) -> dict[str, str]:
    """What makes a saved listing this extension's: a hash for each part of what it runs with.

    The command, its arguments, its own ``env`` (secrets as their references), ``cwd`` and its
    sandbox grants; not the daemon's environment, which changes with where and how the daemon was
    started (``PWD``, systemd's ``INVOCATION_ID``) and not with what the server offers. One hash
    per part, so an ignored listing can say which part changed; hashes, so no value is written out.
    A remote server's: its URL, transport and header names.
    """
    if isinstance(config, RemoteConfig):  # a server elsewhere: its address and how it is reached
        remote = {"url": config.url, "type": config.type, "headers": sorted(map(str, config.headers))}
        return {part: _digest(value) for part, value in remote.items()}
    parts: dict[str, Any] = {
        "command": config.command,
        "args": config.args,
        "env": sorted((key, str(value)) for key, value in config.env.items()),
        "cwd": config.cwd,
        "sandbox": config.sandbox.model_dump(mode="json"),
    }
    return {part: _digest(value) for part, value in parts.items()}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()


def changed_parts(saved: Any, current: Mapping[str, str]) -> list[str]:
    """The parts of *current* that the fingerprint *saved* (as read from a file) does not match."""
    if not isinstance(saved, Mapping):
        return list(current)
    return [part for part, digest in current.items() if saved.get(part) != digest]


class CatalogStore:
    """The saved listing of one extension (*name*, whose :func:`fingerprint` is *print_*)."""

    def __init__(self, directory: Path, name: str, print_: Mapping[str, str]) -> None:
        self.directory = directory
        self.name = name
        self.fingerprint = print_
        self.path = directory / f"{name}.json"

    def load(self) -> Listing | None:
        """The saved listing, or None (absent; or unusable, with a warning). Blocking, bounded."""
        try:
            with self.path.open("rb") as file:
                data = file.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("catalog.unreadable", extension=self.name, path=str(self.path), error=str(exc))
            return None
        if len(data) > MAX_BYTES:
            log.warning("catalog.ignored", extension=self.name, path=str(self.path), reason="too large")
            return None
        try:
            record = json.loads(data)
            if not isinstance(record, dict) or record.get("version") != VERSION:
                raise ValueError("not a saved catalog of this version")
            if record.get("extension") != self.name:
                raise ValueError("another extension's")
            changed = changed_parts(record.get("fingerprint"), self.fingerprint)
            if changed:
                reason = f"another command line: its {', '.join(changed)} changed"
                log.warning("catalog.ignored", extension=self.name, path=str(self.path), reason=reason)
                return None
            lists = {kind: [model.model_validate(item) for item in record[kind]] for kind, model in _KINDS}
        except Exception as exc:  # JSON, a missing key, a malformed definition: all the same to us
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            log.warning("catalog.ignored", extension=self.name, path=str(self.path), reason=reason)
            return None
        return Listing.of(**lists)

    def save(self, listing: Listing) -> bool:
        """Replace the saved listing atomically; False (with a warning) if it cannot. Blocking."""
        record = {
            "version": VERSION,
            "extension": self.name,
            "fingerprint": dict(self.fingerprint),
            **{kind: [_dump(item) for item in getattr(listing, kind)] for kind, _ in _KINDS},
        }
        data = json.dumps(record, separators=(",", ":")).encode()
        if len(data) > MAX_BYTES:
            log.warning("catalog.not_saved", extension=self.name, reason="too large", bytes=len(data))
            return False
        try:
            write_private(self.path, data)
        except OSError as exc:
            log.warning("catalog.not_saved", extension=self.name, path=str(self.path), error=str(exc))
            return False
        return True


def prune(directory: Path, keep: Collection[str]) -> list[str]:
    """Delete the saved listings in *directory* of extensions not in *keep*. Blocking.

    Those were removed from the config or no longer start on demand: left alone, the directory
    would hold a file for every name the config ever had. A crashed write's temporary file goes
    too, once it is old enough not to be a write in progress. Returns the names removed.
    """
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    removed: list[str] = []
    for entry in entries:
        name = entry.name
        if name.endswith(".json") and not name.startswith("."):
            if name.removesuffix(".json") in keep:
                continue
        elif not (name.startswith(".") and name.endswith(".tmp")):
            continue  # not ours
        try:
            if name.endswith(".tmp") and time.time() - entry.lstat().st_mtime < STALE_TEMP_SECONDS:
                continue
            entry.unlink()
        except OSError:
            continue
        removed.append(name)
    if removed:
        log.info("catalog.pruned", path=str(directory), files=len(removed))
    return removed


def _dump(item: Any) -> Any:
    return item.model_dump(mode="json", by_alias=True, exclude_none=True)
