"""What each extension's process tree costs: RSS, CPU seconds, process count; and ``memory_max``.

The tree is the run's cgroup when the daemon has a sub-tree (:mod:`supervisor.process.cgroups`), else
the marker scan of :mod:`supervisor.process.tree`. Figures are collected on demand: a status,
health or metrics request reads ``/proc`` once for all extensions, and a :class:`Sampler`
reuses that reading for :data:`CACHE_SECONDS`. RSS is the sum over the tree's processes
(shared pages count once per process). CPU seconds are user + system time of the live
processes plus what their exited children used once reaped inside the tree (``cutime``,
``cstime``); with a cgroup, ``cpu.stat`` counts every process that ever ran in it.

``memory_max`` is enforced by :func:`enforce_memory_max`: cgroup v2 ``memory.max`` where the
run's cgroup has the memory controller (an OOM kill there is reported as the limit; the kernel
charges tmpfs pages to it too), else a check every :data:`MEMORY_CHECK_INTERVAL` seconds, only
while a limit is set, of the tree's RSS plus what its sandbox's private tmpfs mounts hold
(TMPDIR and /dev/shm: files there are memory no process's RSS shows).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.process import cgroups
from supervisor.process import tree as proctree
from supervisor.process.cgroups import Subtree

__all__ = (
    "CACHE_SECONDS",
    "MEMORY_CHECK_INTERVAL",
    "Sampler",
    "TreeUsage",
    "cgroup_memory_limit",
    "enforce_memory_max",
    "mib",
    "run_usage",
    "scratch_bytes",
)

log = structlog.get_logger(__name__)

CACHE_SECONDS = 1.0  # one /proc reading serves every request within this long
MEMORY_CHECK_INTERVAL = 1.0  # the RSS check of memory_max without a cgroup memory controller

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class TreeUsage:
    """One extension's process tree at one moment."""

    processes: int
    rss_bytes: int
    cpu_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


EMPTY = TreeUsage(0, 0, 0.0)


def mib(count: int) -> str:
    """Bytes as MiB for an error message: ``600 MiB``."""
    return f"{count / 1024**2:.0f} MiB"


def _proc_usage(pid: int) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds incl. reaped children) of one process, or None when it is gone."""
    fields = proctree.stat_fields(pid, 22)
    if fields is None:
        return None
    try:
        ticks = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        return int(fields[21]) * _PAGE, ticks / _TICK
    except ValueError:  # not whole after all
        return None


def _cgroup_cpu(path: Path) -> float | None:
    """``usage_usec`` of ``cpu.stat`` (present without the cpu controller too), in seconds."""
    with contextlib.suppress(OSError, ValueError):
        for line in (path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    return None


def _run_cgroup(pid: int, subtree: Path | None) -> Path | None:
    """The cgroup of the run *pid* leads, when the daemon has a *subtree* and *pid* is in it."""
    inside = cgroups.cgroup_of(pid) if subtree is not None else None
    if subtree is None or inside is None or subtree not in inside.parents:
        return None
    while inside.parent != subtree:  # the extension may have made cgroups of its own below
        inside = inside.parent
    return inside


def _sum(pids: set[int] | list[int], cpu: float | None = None) -> TreeUsage:
    count, rss, seconds = 0, 0, 0.0
    for pid in pids:
        found = _proc_usage(pid)
        if found is not None:
            count, rss, seconds = count + 1, rss + found[0], seconds + found[1]
    return TreeUsage(count, rss, round(cpu if cpu is not None else seconds, 3))


def _usage(procs: dict[int, proctree.Proc] | None, pid: int, prefix: str, cgroup: Path | None) -> TreeUsage:
    """The tree of the run led by *pid* (in *cgroup*, if any) whose marker starts with *prefix*. Blocking."""
    if cgroup is not None:
        return _sum(Subtree.pids(cgroup), _cgroup_cpu(cgroup))
    procs = procs if procs is not None else proctree.scan()
    return _sum(proctree.members(procs, prefix=prefix, roots=(pid,) if pid in procs else ()))


def run_usage(pid: int, marker: str, cgroup: Path | None = None) -> TreeUsage:
    """The tree of one run (its child's *pid*, *marker* and cgroup), now. Blocking: one ``/proc`` scan."""
    return _usage(None, pid, marker, cgroup)


class Sampler:
    """Each extension's :class:`TreeUsage`, from one ``/proc`` reading per :data:`CACHE_SECONDS`.

    Sync and blocking (a few milliseconds on a busy host); called from the event loop by the
    status, health and metrics handlers, so the cache bounds what a flood of requests costs.
    """

    def __init__(
        self,
        marker_prefix: str,
        subtree: Callable[[], Path | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prefix = marker_prefix
        self._subtree = subtree  # the daemon's cgroup sub-tree, once it has one
        self._clock = clock
        self._taken = -CACHE_SECONDS
        self._cache: dict[tuple[str, int], TreeUsage] = {}
        self._procs: dict[int, proctree.Proc] | None = None
        self.scans = 0  # /proc readings so far (tests check the bound)

    def usage(self, name: str, pid: int | None, marker: str | None = None) -> TreeUsage:
        """The tree of extension *name* whose child is *pid* (None: not running, nothing), of the
        run marked *marker* when given (else any run of *name*: per-client instances share it)."""
        if pid is None:
            return EMPTY
        now = self._clock()
        if now - self._taken >= CACHE_SECONDS:
            self._taken, self._cache, self._procs = now, {}, None
        key = (name, pid)
        if key not in self._cache:
            try:
                cgroup = _run_cgroup(pid, self._subtree())
                if self._procs is None and cgroup is None:
                    self._procs = proctree.scan()
                    self.scans += 1
                # Markers are "<prefix><name>:<run id>": this prefix matches this extension's runs only.
                self._cache[key] = _usage(self._procs, pid, marker or f"{self._prefix}{name}:", cgroup)
            except OSError:  # out of fds, say: `status` still answers, without the figures
                return EMPTY
        return self._cache[key]


def cgroup_memory_limit(cgroup: Path, limit: int) -> bool:
    """Write ``memory.max`` (and ``memory.oom.group``) of a run's cgroup; False without the controller.

    With ``memory.oom.group`` the kernel kills the whole tree at once when it is over the limit.
    """
    try:
        (cgroup / "memory.max").write_text(str(limit))
    except OSError:  # no memory controller delegated here: the file does not exist
        return False
    with contextlib.suppress(OSError):
        (cgroup / "memory.oom.group").write_text("1")
    return True


def _oom_kills(cgroup: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in (cgroup / "memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def scratch_bytes(pid: int, mounts: tuple[str, ...]) -> int:
    """Bytes held in the tmpfs *mounts* of the root *pid* sees (0 for any it cannot reach)."""
    held = 0
    for mount in mounts:
        with contextlib.suppress(OSError):
            fs = os.statvfs(f"/proc/{pid}/root{mount}")
            held += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return held


def _held(pid: int, marker: str, cgroup: Path | None, scratch: tuple[str, ...]) -> tuple[int, int]:
    """(RSS of the tree, bytes in its *scratch* mounts). Blocking."""
    return run_usage(pid, marker, cgroup).rss_bytes, scratch_bytes(pid, scratch) if scratch else 0


async def enforce_memory_max(
    pid: int,
    marker: str,
    cgroup: Path | None,
    limit: int,
    exceeded: Callable[[str], None],
    *,
    scratch: tuple[str, ...] = (),
    interval: float = MEMORY_CHECK_INTERVAL,
) -> None:
    """Call *exceeded* with the error once the run's tree is over *limit* bytes, then return.

    Runs until then or until cancelled (the run's helper task group). With a cgroup memory
    controller the kernel enforces the limit and this only reads ``memory.events``; otherwise
    it sums the tree's RSS and the bytes in its private tmpfs mounts *scratch* (paths inside
    its root, read through ``/proc/PID/root``) every *interval* seconds, in a thread.
    """
    kernel = cgroup is not None and await anyio.to_thread.run_sync(cgroup_memory_limit, cgroup, limit)
    while True:
        await anyio.sleep(interval)
        if kernel:
            assert cgroup is not None
            if await anyio.to_thread.run_sync(_oom_kills, cgroup):
                exceeded(f"memory_max {mib(limit)} exceeded: killed by the kernel's OOM killer")
                return
            continue
        rss, files = await anyio.to_thread.run_sync(_held, pid, marker, cgroup, scratch)
        if rss + files > limit:
            held = f" ({mib(files)} of it files in its TMPDIR and /dev/shm)" if files >= 1024**2 else ""
            exceeded(f"memory_max {mib(limit)} exceeded: {mib(rss + files)}{held}")
            return
