"""The daemon process's own vital signs, for `health` and the metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio.to_thread
import psutil

from supervisor.process import cgroups

__all__ = ("ProcessStats", "cgroup_of", "process_stats")

# How anyio names the threads of its pool; a worker stays while it is used at least every 10 s,
# so the pool is as large as the most blocking calls that overlapped lately (at most its limiter's 40).
_WORKER_NAME = "AnyIO worker thread"


@dataclass(frozen=True, slots=True)
class ProcessStats:
    pid: int
    uptime_s: float
    rss_bytes: int
    threads: int
    worker_threads: int  # of them, the pool that runs blocking calls (anyio's); idle ones retire
    blocking_calls: int  # running in it now (the shared limiter's): one that never ends is stuck
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
            worker_threads=sum(1 for thread in threading.enumerate() if thread.name == _WORKER_NAME),
            blocking_calls=int(anyio.to_thread.current_default_thread_limiter().borrowed_tokens),
            open_fds=me.num_fds(),
            asyncio_tasks=len(asyncio.all_tasks()),
        )


def cgroup_of(pid: int) -> str | None:
    """The directory of the cgroup *pid* is in (``/sys/fs/cgroup/…``), or None if it is gone."""
    path = cgroups.cgroup_of(pid)
    return str(path) if path is not None else None
