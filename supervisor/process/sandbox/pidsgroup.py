"""``pids_max`` for a root daemon: a pids cgroup per run, where ``RLIMIT_NPROC`` cannot count.

The kernel exempts root's processes from ``RLIMIT_NPROC``, so a root daemon's runs count their
tasks in a cgroup of the pids controller instead: one per run, under one directory per daemon
(:func:`base`), with ``pids.max`` written before the launcher joins it as its first step, so
that nothing the run starts is outside. Where: cgroup v1's ``pids`` hierarchy (hybrid hosts).
On a unified-only host it is not done yet (the way there: ``pids.max`` in each run's leaf of
the daemon's delegated subtree, :mod:`supervisor.process.cgroups`), and status says so.
Standard library only.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

__all__ = ("available", "base", "create", "remove", "sweep")

PREFIX = "mcp-supervisor-"


def available() -> bool:
    """Whether this host has a pids hierarchy this process may make cgroups in (root only)."""
    return os.getuid() == 0 and any(os.access(path, os.W_OK) for path in _pids_hierarchies())


@functools.cache
def base(name: str) -> Path | None:
    """This daemon's directory of run cgroups, named *name*, made in a pids hierarchy it may
    write to; None where there is none, or the daemon is not root (RLIMIT_NPROC binds then)."""
    if os.getuid() != 0:
        return None
    for hierarchy in _pids_hierarchies():
        directory = hierarchy / f"{PREFIX}{name}"
        try:
            directory.mkdir(mode=0o755, exist_ok=True)
        except OSError:
            continue
        if (directory / "pids.max").exists():
            return directory
    return None


def create(directory: Path, name: str, limit: int) -> Path:
    """A run's cgroup, *name* in *directory*, holding at most *limit* tasks.

    Error handling: ``OSError`` when it cannot be made (the caller runs without it, and says so).
    """
    leaf = directory / name
    leaf.mkdir(mode=0o755)
    try:
        (leaf / "pids.max").write_text(str(limit))
    except OSError:
        remove(leaf)
        raise
    return leaf


def remove(leaf: Path) -> bool:
    """Remove a run's cgroup once its tasks are gone; whether it is gone."""
    try:
        leaf.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def sweep(directory: Path) -> int:
    """Remove the empty run cgroups an earlier daemon of this name left; how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for leaf in directory.iterdir():
            if leaf.is_dir() and remove(leaf):
                removed += 1
    return removed


def _pids_hierarchies() -> list[Path]:
    """This process's own cgroup in each v1 hierarchy that has the pids controller."""
    own: dict[str, str] = {}  # a hierarchy's controllers ("pids", "cpu,cpuacct", ...) -> our path
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own[controllers] = path
    found: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields, _, tail = line.partition(" - ")
            kind, _, options = [*tail.split(), "", "", ""][:3]
            if kind != "cgroup" or "pids" not in options.split(","):
                continue
            path = next((p for c, p in own.items() if "pids" in c.split(",")), None)
            if path is not None:
                found.append(Path(fields.split()[4]) / path.lstrip("/"))
    return found
