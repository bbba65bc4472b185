"""The size of an extension's private package cache, bounded by its ``cache_max``.

The cache is on disk (it must outlive a run to be one), where no tmpfs can size it: it is
measured instead. At each start a cache over its limit is emptied (the next ``npx -y`` or
``uvx`` downloads again); while the extension runs, a cache that grows past the limit ends the
run like ``memory_max`` does, and the next start empties it. (Between two measurements a run
may write past the limit: the bound is on what stays, not on a burst.) A measurement stops counting
once past the limit, and at :data:`MAX_ENTRIES` entries (a tree of millions of empty files
costs inodes, not bytes, and counts as over).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable

import anyio
import structlog

__all__ = ("CACHE_CHECK_INTERVAL", "CACHE_CHECK_SHARE", "MAX_ENTRIES", "enforce", "size", "trim")

log = structlog.get_logger(__name__)

CACHE_CHECK_INTERVAL = 1.0  # seconds between measurements, at least: a small cache costs nothing
CACHE_CHECK_SHARE = 0.02  # at most this share of a core: a big cache is measured less often
MAX_ENTRIES = 1_000_000


def size(path: str, limit: int) -> int:
    """The bytes the files under *path* take on disk (``st_blocks``), counted until past
    *limit* (then some number over it); 0 for a path that does not exist. Symlinks are not
    followed. Blocking."""
    total, entries, pending = 0, 0, [path]
    while pending and total <= limit:
        directory = pending.pop()
        try:
            with os.scandir(directory) as found:
                for entry in found:
                    entries += 1
                    if entries > MAX_ENTRIES:
                        return limit + 1
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError:  # gone meanwhile, or a directory it made unreadable: what it holds is not ours to see
            continue
    return total


def trim(path: str | None, limit: int | None, extension: str) -> bool:
    """Empty the cache at *path* if it is over *limit* (before a start); whether it was."""
    if path is None or limit is None or not os.path.isdir(path):
        return False
    held = size(path, limit)
    if held <= limit:
        return False
    log.warning("sandbox.cache_cleared", extension=extension, over=limit)
    _empty(path)
    return True


async def enforce(
    path: str, limit: int, exceeded: Callable[[str], None], *, interval: float = CACHE_CHECK_INTERVAL
) -> None:
    """Call *exceeded* with the error once the cache at *path* is over *limit*, then return.
    Runs until then or until cancelled (the run's helper task group). Measures every *interval*
    seconds, or less often where a measurement takes long (:data:`CACHE_CHECK_SHARE`)."""
    wait = interval
    while True:
        await anyio.sleep(wait)
        started = time.monotonic()
        held = await anyio.to_thread.run_sync(size, path, limit)
        wait = max(interval, (time.monotonic() - started) / CACHE_CHECK_SHARE)
        if held > limit:
            mib = limit // 1024**2
            exceeded(f"its package cache grew past cache_max ({mib} MiB): emptied before its next start")
            return


def _empty(path: str) -> None:
    for entry in os.listdir(path):
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, onerror=_writable)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)


def _writable(function: Callable[[str], object], failed: str, _: object) -> None:
    """A directory the extension made unwritable (npm's 0555 ones): open it up, then again."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(failed), 0o700)
        function(failed)
