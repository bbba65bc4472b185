"""The media spool: oversized image, audio and blob content moves to disk, a link stays.

Results are rewritten as plain JSON dicts, straight off an extension's stdout, before any
MCP model holds them: a payload is decoded in chunks into a file and never sits in memory
twice. Layout::

    <root>/<instance>-<daemon pid>/<extension>.<n>/<random>.<ext>     dirs 0700, files 0600

One directory per Extension object (``n`` counts them, so the object a reload replaces and
its successor never share one), created on first use and removed when that extension is
stopped (kept across a crash-restart, so links already handed out stay valid). The daemon's
directory goes at daemon exit, and a daemon start removes those of earlier daemons on the
same socket that are no longer running. ``max_total_bytes`` and ``max_files`` bound the
whole spool, oldest files evicted first, once the new file is written; never a file of the
result being rewritten nor one younger than ``min_age`` (its link was just handed out): when
no room can be made that way, the item stays inline.

Thread safety: rewrites run in worker threads; the index is guarded by a lock.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import itertools
import mimetypes
import os
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from supervisor.upstream import media
from supervisor.upstream.diverted import Diversion, Diversions
from supervisor.upstream.media import OutputSchemas

__all__ = (
    "ExtensionSpool",
    "Spool",
    "SpoolStats",
    "decoded_size",
    "filesystem_type",
    "write_decoded",
)

log = structlog.get_logger(__name__)

DECODE_CHUNK = 4 << 20  # base64 characters per step (a multiple of 4)
VOLATILE_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MIN_AGE = 1.0  # seconds a spooled file is safe from eviction: its link was just handed out
SUFFIXES = {  # where the mimetypes table has no answer or an odd one
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/mpeg": ".mp3",
    "audio/ogg": ".ogg",
    "audio/webm": ".webm",
    "image/webp": ".webp",
    "image/jpeg": ".jpg",
}


@dataclass(frozen=True, slots=True)
class SpoolStats:
    files: int
    bytes: int


def decoded_size(data: str) -> int | None:
    """The byte count *data* decodes to, without decoding; None if it cannot be base64."""
    if len(data) % 4:
        return None
    padding = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
    return len(data) // 4 * 3 - padding


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem *path* lives on (from /proc/self/mountinfo), if known."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    target = str(path.resolve())
    for line in mounts:
        fields = line.split(" - ")
        mount_point = fields[0].split()[4]
        if (target == mount_point or target.startswith(mount_point.rstrip("/") + "/")) and len(
            mount_point
        ) >= len(best):
            best, kind = mount_point, fields[1].split()[0]
    return kind


class Spool:
    """One daemon's spool.

    Args:
        root: the directory holding every daemon's spool (created 0700 if missing).
        instance: names this daemon's run directory, with its pid; see :meth:`sweep`.
        max_inline_bytes: a payload decoding to more than this is spooled; exactly this stays inline.
        max_total_bytes, max_files: bounds on the whole spool, oldest files evicted first.
        min_age: files younger than this (seconds) are never evicted.
    """

    def __init__(
        self,
        root: Path,
        *,
        instance: str,
        max_inline_bytes: int,
        max_total_bytes: int,
        max_files: int = 10_000,
        min_age: float = MIN_AGE,
    ) -> None:
        self.root = root
        self.instance = instance
        self.run_dir = root / f"{instance}-{os.getpid()}"
        self.max_inline_bytes = max_inline_bytes
        self.max_total_bytes = max_total_bytes
        self.max_files = max_files
        self.min_age = min_age
        self._lock = threading.Lock()
        self._files: OrderedDict[Path, tuple[int, float]] = OrderedDict()  # oldest first: size, written at
        self._total = 0
        self._generations = itertools.count(1)

    def stats(self) -> SpoolStats:
        with self._lock:
            return SpoolStats(len(self._files), self._total)

    def sweep(self) -> int:
        """Remove run directories of earlier daemons on this socket that are not running. Blocking."""
        removed = 0
        try:
            entries = list(self.root.iterdir())
        except OSError:
            return 0
        for entry in entries:
            name, _, pid = entry.name.rpartition("-")
            if name != self.instance or not pid.isdigit() or entry == self.run_dir:
                continue
            if _pid_alive(int(pid)):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
        return removed

    def check_filesystem(self) -> None:
        kind = filesystem_type(self.root if self.root.exists() else self.root.parent)
        if kind in VOLATILE_FILESYSTEMS:
            log.warning("spool.in_memory_filesystem", path=str(self.root), filesystem=kind)

    def for_extension(self, extension: str) -> ExtensionSpool:
        """A spool for one Extension object, in a directory of its own (``<extension>.<n>``)."""
        return ExtensionSpool(self, extension, f"{extension}.{next(self._generations)}")

    def remove_extension(self, directory_name: str) -> None:
        """Forget and delete one extension's spooled files (it was stopped). Blocking."""
        directory = self.run_dir / directory_name
        with self._lock:
            for path in [p for p in self._files if p.parent == directory]:
                self._total -= self._files.pop(path)[0]
        shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        """Delete this daemon's whole spool (daemon exit). Blocking."""
        with self._lock:
            self._files.clear()
            self._total = 0
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def needs_look(self, line_length: int) -> bool:
        """Whether a message line this long can hold a payload over the inline limit."""
        return line_length > self.max_inline_bytes

    def rewrite(
        self,
        message: Any,
        extension: str,
        *,
        directory: str | None = None,
        schemas: OutputSchemas | None = None,
        diverted: Mapping[str, Diversion] | None = None,
    ) -> int:
        """Spool the oversized media of a tool result in place; return how many payloads were replaced.

        *message* is a parsed JSON-RPC message; only results with a ``content`` list or a
        ``structuredContent`` are looked at (see :mod:`supervisor.upstream.media` for what counts as
        media where). A content item is replaced by a ``resource_link``; elsewhere only the
        base64 string is, by the file's URI. The same base64 text anywhere in the result goes
        to one file. A rewrite of ``structuredContent`` that *schemas* says a client would
        reject is undone as a whole (``spool.kept_inline``). Never raises for bad input or a
        failed write: the payload stays inline and a warning is logged. Files go to
        *directory* (a name in the run directory; default: *extension*). A payload still on
        disk (*diverted*: its placeholder in the result) is decoded from there.
        """
        diverted = diverted or {}
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict) or not (
            isinstance(result.get("content"), list) or "structuredContent" in result
        ):
            return 0
        found = media.find(result, self.max_inline_bytes, diverted)
        if not found.spots:
            return 0
        payloads: dict[str, list[media.Spot]] = {}  # base64 text -> where it occurs: one file each
        for spot in found.spots:
            data = spot.holder[spot.key]
            size = diverted[data].decoded_size() if data in diverted else decoded_size(data)
            if size is None:
                log.warning(
                    "spool.not_base64",
                    extension=extension,
                    type=spot.kind,
                    reason="length is not a multiple of 4",
                )
            elif size > self.max_inline_bytes:
                payloads.setdefault(data, []).append(spot)
        written: set[Path] = set()  # this result's files: never evicted to make room for its next one
        stored: dict[str, media.Stored] = {}
        for data, spots in payloads.items():
            source = diverted.get(data, data)
            size = (source.decoded_size() if isinstance(source, Diversion) else decoded_size(data)) or 0
            mime = next((spot.mime for spot in spots if spot.mime), None)
            saved = self._store(source, size, mime, extension, spots[0].kind, directory or extension, written)
            if saved is not None:
                stored[data] = media.Stored(*saved, size)
        applied = media.apply(result, found, payloads, stored, schemas, message.get("id"))
        if applied.rejection is not None:
            log.warning(
                "spool.kept_inline", extension=extension, payloads=applied.undone, reason=applied.rejection
            )
        replaced = {id(spot) for spot in applied.replaced}
        for data, saved in stored.items():
            if not any(id(spot) in replaced for spot in payloads[data]):  # its only places were undone
                self._forget(saved.path)
        return len(applied.replaced)

    def _forget(self, path: Path) -> None:
        """Delete a file of this result that nothing links to after all."""
        with self._lock:
            entry = self._files.pop(path, None)
            if entry is not None:
                self._total -= entry[0]
        with contextlib.suppress(OSError):
            path.unlink()

    def _store(
        self,
        data: str | Diversion,
        size: int,
        mime: str | None,
        extension: str,
        kind: str,
        directory_name: str,
        written: set[Path],
    ) -> tuple[Path, str] | None:
        """Write the decoded payload; None (with a warning) when it cannot be spooled."""
        if size > self.max_total_bytes:
            log.warning("spool.over_quota", extension=extension, size=size, limit=self.max_total_bytes)
            return None
        with self._lock:
            room = self._victims(size, written) is not None
        if not room:
            log.warning("spool.no_room", extension=extension, size=size, reason="the other files are too new")
            return None
        suffix = (SUFFIXES.get(mime) or mimetypes.guess_extension(mime) if mime else None) or ".bin"
        directory = self.run_dir / directory_name
        path = directory / f"{secrets.token_urlsafe(16)}{suffix}"
        try:
            _make_private_dirs(self.root, self.run_dir, directory)
            digest = data.decode_into(path) if isinstance(data, Diversion) else write_decoded(path, data)
        except (OSError, binascii.Error, ValueError) as exc:
            with contextlib.suppress(OSError):
                path.unlink()
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            event = (
                "spool.not_base64" if isinstance(exc, binascii.Error | ValueError) else "spool.write_failed"
            )
            log.warning(event, extension=extension, type=kind, reason=reason, path=str(path))
            return None
        with self._lock:  # evict only now that the write succeeded
            victims = self._victims(size, written)
            if victims is not None:
                for victim in victims:
                    self._total -= self._files.pop(victim)[0]
                self._files[path] = (size, time.monotonic())
                self._total += size
        if victims is None:  # other writers took the room meanwhile
            with contextlib.suppress(OSError):
                path.unlink()
            log.warning("spool.no_room", extension=extension, size=size, reason="the other files are too new")
            return None
        written.add(path)
        for victim in victims:
            with contextlib.suppress(OSError):
                victim.unlink()
        if victims:
            log.info("spool.evicted", files=len(victims))
        return path, digest

    def _victims(self, size: int, keep: set[Path]) -> list[Path] | None:
        """The oldest files to evict so that *size* more bytes and one more file fit; None if impossible.

        Never a file in *keep*, nor one younger than ``min_age``. Call with the lock held.
        """
        excess_bytes = self._total + size - self.max_total_bytes
        excess_files = len(self._files) + 1 - self.max_files
        victims: list[Path] = []
        young = time.monotonic() - self.min_age
        for path, (old, written_at) in self._files.items():
            if excess_bytes <= 0 and excess_files <= 0:
                break
            if written_at > young:  # oldest first: every file from here on is younger still
                break
            if path not in keep:
                victims.append(path)
                excess_bytes -= old
                excess_files -= 1
        return victims if excess_bytes <= 0 and excess_files <= 0 else None


@dataclass(frozen=True, slots=True)
class ExtensionSpool:
    """What one extension's transport sees of the spool."""

    spool: Spool
    extension: str
    directory: str  # its own directory's name in the run directory
    schemas: OutputSchemas = field(default_factory=OutputSchemas)  # the owner points it at its tools

    def needs_look(self, line_length: int) -> bool:
        return self.spool.needs_look(line_length)

    def sent(self, request_id: Any, method: str, params: Any) -> None:
        """A request went to the child: its answer's structured output is checked against its tool."""
        self.schemas.sent(request_id, method, params)

    def rewrite(self, message: Any, diverted: Mapping[str, Diversion] | None = None) -> int:
        return self.spool.rewrite(
            message, self.extension, directory=self.directory, schemas=self.schemas, diverted=diverted
        )

    def diversions(self) -> Diversions:
        """A run's long strings kept on disk as its answers stream (:mod:`.diverted`), in this
        extension's directory, for strings longer than the inline limit; its tool results'
        media spooled here."""
        return Diversions(self.spool.run_dir / self.directory, self.spool.max_inline_bytes, self.rewrite)

    def remove(self) -> None:
        self.spool.remove_extension(self.directory)


def write_decoded(path: Path, data: str) -> str:
    """Decode base64 *data* into a new 0600 file in chunks; return the sha256 of the bytes."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        for start in range(0, len(data), DECODE_CHUNK):
            chunk = base64.b64decode(data[start : start + DECODE_CHUNK], validate=True)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _make_private_dirs(*levels: Path) -> None:
    """Create each level 0700 if missing; existing directories keep their mode."""
    for level in levels:
        level.mkdir(mode=0o700, parents=True, exist_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
