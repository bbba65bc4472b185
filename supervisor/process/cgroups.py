"""A cgroup v2 sub-tree for the extensions: exact containment where the daemon may write one.

Standard library only (the guardian imports it); everything blocks briefly (small file
writes under ``/sys/fs/cgroup``). Layout, under the cgroup the daemon started in::

    <base>/daemon/                          the daemon and its guardian (delegated base only)
    <base>/extensions/<socket id>-<pid>/    this daemon's sub-tree: one cgroup.kill ends it all
        <extension>-<run id>/               one run of one extension

The daemon moves itself into ``daemon/`` when the base is a delegated cgroup (systemd's
``Delegate=yes``): cgroup v2 lets only leaves hold processes once controllers are enabled
below, so the base must stay empty. In the root cgroup (a container without systemd) it
stays where it is. A cgroup that is neither delegated nor the root belongs to someone else
(a systemd service or session): the daemon leaves it alone and falls back to
:mod:`supervisor.process.tree`.

How a child gets in before it can fork: its first program is a shim that writes ``0``
(itself) to the cgroup's ``cgroup.procs`` and only then execs the extension, so no code of
the extension ever runs outside the cgroup (see :func:`supervisor.process.spawner.spawn_argv`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
from pathlib import Path

__all__ = ("Subtree", "cgroup_of", "locate", "member_of", "populated")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@functools.cache
def _mount_point() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on hybrid hosts)."""
    try:
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                before, _, after = line.partition(" - ")
                if after.split(" ", 1)[0] == "cgroup2":
                    return Path(before.split()[4])
    except OSError:
        pass
    return None


def _own_path() -> str | None:
    try:
        with open("/proc/self/cgroup") as cgroup:
            for line in cgroup:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _delegated(path: Path) -> bool:
    for attr in ("trusted.delegate", "user.delegate"):  # set by systemd for Delegate=yes
        with contextlib.suppress(OSError):
            if os.getxattr(path, attr) == b"1":
                return True
    return False


def locate(*, force: bool = False) -> tuple[Path, bool] | None:
    """Our cgroup, and whether we must move out of it into a leaf, if we may build a sub-tree in it.

    None when there is no cgroup v2 hierarchy, it is read-only to us, or the cgroup is
    someone else's (*force* skips that check). :meth:`Subtree.prepare` checks the rest.
    """
    mount, own = _mount_point(), _own_path()
    if mount is None or own is None or own.endswith(" (deleted)"):
        return None
    path = mount / own.lstrip("/")
    is_root = own == "/"
    if not (is_root or force or _delegated(path)):
        return None
    if not (os.access(path, os.W_OK) and os.access(path / "cgroup.procs", os.W_OK)):
        return None
    return path, not is_root


def populated(path: Path) -> bool:
    """Whether any process is still in *path* or below it (``cgroup.events``)."""
    try:
        return b"populated 1" in (path / "cgroup.events").read_bytes()
    except OSError as exc:  # gone, or going (ENODEV: removed as we read, by its own daemon)
        if exc.errno in (errno.ENOENT, errno.ENODEV):
            return False
        raise


def cgroup_of(pid: int) -> Path | None:
    """The directory of the cgroup (v2) *pid* is in now, or None (gone, or no hierarchy)."""
    mount = _mount_point()
    try:
        with open(f"/proc/{pid}/cgroup") as cgroup:
            where = next((line[3:].strip() for line in cgroup if line.startswith("0::")), None)
    except OSError:
        return None
    return None if mount is None or where is None else mount / where.lstrip("/")


def member_of(path: Path, pid: int) -> bool:
    """Whether *pid* is in the cgroup *path* or below it, now."""
    inside = cgroup_of(pid)
    return inside is not None and (inside == path or path in inside.parents)


class Subtree:
    """One daemon's cgroups: ``<base>/extensions/<key>/<leaf>``. Blocking file operations."""

    def __init__(self, base: Path, key: str) -> None:
        self.base = base
        self.path = base / "extensions" / key

    @classmethod
    def prepare(cls, base: Path, key: str, *, move_self: bool) -> Subtree:
        """Create the sub-tree (moving this process into ``<base>/daemon`` first if asked).

        Error handling: raises ``OSError`` when the hierarchy refuses (the caller falls back).
        """
        if move_self:
            (base / "daemon").mkdir(exist_ok=True)
            (base / "daemon" / "cgroup.procs").write_text("0")
        tree = cls(base, key)
        tree.path.mkdir(parents=True, exist_ok=True)
        if not (tree.path / "cgroup.kill").exists():
            tree.remove_all()
            raise OSError("this kernel has no cgroup.kill (Linux 5.14 or later)")
        return tree

    def leaf(self, name: str) -> Path:
        """A new, empty cgroup for one run (its name made safe for a directory)."""
        path = self.path / _UNSAFE.sub("_", name)[:200]
        path.mkdir()
        return path

    @staticmethod
    def pids(path: Path) -> list[int]:
        """Pids in *path* and every cgroup below it (an extension may create its own)."""
        found: list[int] = []
        for directory, _, _ in os.walk(path):
            with contextlib.suppress(OSError):
                found.extend(int(pid) for pid in Path(directory, "cgroup.procs").read_text().split())
        return found

    @staticmethod
    def kill(path: Path) -> None:
        """SIGKILL everything in *path* and below, atomically with respect to forks."""
        try:
            (path / "cgroup.kill").write_text("1")
        except OSError as exc:  # gone, or going (ENODEV: removed while we wrote, by another's guardian)
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    @staticmethod
    def remove(path: Path) -> bool:
        """Remove *path* and the cgroups below it, deepest first. False if one is still populated."""
        if not path.exists():
            return True
        for directory, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True

    def remove_all(self) -> bool:
        """Remove this daemon's whole sub-tree (and ``extensions/`` if no other daemon uses it)."""
        done = self.remove(self.path)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()
        return done

    def stale(self, prefix: str) -> list[Path]:
        """Sub-trees of earlier daemons on the same socket (names starting with *prefix*), not ours."""
        with contextlib.suppress(OSError):
            return [p for p in self.path.parent.iterdir() if p.name.startswith(prefix) and p != self.path]
        return []

    def remove_abandoned(self) -> list[Path]:
        """Remove the empty sub-trees of daemons (on any socket) that are gone; returns them.

        A daemon killed between creating its sub-tree and starting its guardian leaves one.
        Only what is empty goes: another socket's processes are never touched.
        """
        removed = []
        for entry in self.path.parent.iterdir() if self.path.parent.is_dir() else ():
            owner = entry.name.rpartition("-")[2]
            if entry == self.path or not entry.is_dir() or not owner.isdigit() or populated(entry):
                continue
            try:
                os.kill(int(owner), 0)
                continue  # alive (or its pid reused): leave it
            except ProcessLookupError:
                pass
            except OSError:
                continue
            if self.remove(entry):
                removed.append(entry)
        return removed
