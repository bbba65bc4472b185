"""Files of this user's alone: written whole or not at all, read only when nobody else could write them.

The daemon keeps its state (saved listings, pinned definitions, OAuth tokens) in 0600 files
under 0700 directories. A write goes to a temporary file that replaces the old one, so a crash
leaves the old file or the new one, never half of one. A read opens without following a
symbolic link and checks the file it opened (by fd): a regular file, owned by this user, that
no one else may read or write, no larger than asked.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ("NotPrivate", "private_dirs", "read_private", "remove_private", "write_private")


class NotPrivate(OSError):
    """A file that is not this user's alone (or not a regular file, or too large): not read."""


def write_private(path: Path, data: bytes) -> None:
    """Replace *path* with *data* atomically: a 0600 file in 0700 directories. Blocking.

    A crash leaves the old file or the new one, never half of one (the temporary file it may
    leave is ``.NAME.*.tmp``). Error handling: raises OSError.
    """
    private_dirs(path.parent)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:  # mkstemp: mode 0600
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def read_private(path: Path, limit: int) -> bytes | None:
    """The bytes of *path*, or None when it does not exist. Blocking.

    Error handling: :class:`NotPrivate` for a file another user owns or may read or write, a
    symbolic link, not a regular file, or over *limit* bytes; OSError for the rest.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symbolic link where the file should be
            raise NotPrivate(f"{path} is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise NotPrivate(f"{path} must be a file of this user's alone (mode 0600)")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise NotPrivate(f"{path} is over {limit} bytes")
    return data


def remove_private(path: Path) -> bool:
    """Remove *path*; whether it was there. Blocking; OSError but for a missing file."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def private_dirs(directory: Path) -> None:
    """Create *directory* and its missing parents, each 0700; an existing leaf is narrowed to 0700."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for level in reversed(missing):
        with contextlib.suppress(FileExistsError):
            level.mkdir(mode=0o700)
    if directory.stat().st_mode & 0o077:
        os.chmod(directory, 0o700)
