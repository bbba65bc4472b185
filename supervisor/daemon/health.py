"""The daemon process's own vital signs, for `health` and the metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from supervisor.process import cgroups

__all__ = ("ProcessStats", "cgroup_of", "process_stats")


@dataclass(frozen=True, slots=True)
class ProcessStats:
    pid: int
    uptime_s: float
    rss_bytes: int
    threads: int
    open_fds: int
    asyncio_tasks: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def process_stats() -> ProcessStats:
    """This process, now. Call it from the event loop's thread: it counts the loop's tasks."""
    me = psutil.Process()
    with me.oneshot():
        return ProcessStats(
            pid=me.pid,
            uptime_s=round(time.time() - me.create_time(), 3),
            rss_bytes=me.memory_info().rss,
            threads=me.num_threads(),
            open_fds=me.num_fds(),
            asyncio_tasks=len(asyncio.all_tasks()),
        )


def cgroup_of(pid: int) -> str | None:
    """The directory of the cgroup *pid* is in (``/sys/fs/cgroup/…``), or None if it is gone."""
    path = cgroups.cgroup_of(pid)
    return str(path) if path is not None else None
