"""The daemon as a child subreaper: orphans of its trees come back to it and are reaped.

Without it, a double-forked descendant is handed to PID 1, which in a container started
without an init may never reap it; and it is out of the daemon's reach. With it, such a
process becomes a child of the daemon (a "stranger": we did not spawn it), which the
teardown scan can find (:func:`supervisor.process.tree.members`) and which :func:`reap_strangers`
reaps when it exits.

Our own children are reaped by whoever spawned them (:mod:`supervisor.process.children`, through
their pidfd), never here: they are registered with :func:`track` under :data:`lock` in the
same step as the fork, so a reaping in between cannot take one for a stranger.
Children in the daemon's own session are never taken either (every tree lives in sessions
of its own): a subprocess started by other code, e.g. asyncio's, stays its owner's to wait for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from supervisor.process import tree as proctree

__all__ = ("become_subreaper", "is_subreaper", "lock", "reap_strangers", "track", "tracked", "untrack")

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_libc = ctypes.CDLL(None, use_errno=True)

lock = threading.Lock()  # held across fork + track(), and by reap_strangers()
_tracked: set[int] = set()  # process-wide by nature: children are a property of the process


def become_subreaper() -> bool:
    """Make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``). False if refused."""
    return _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def is_subreaper() -> bool:
    value = ctypes.c_int(0)
    return _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0 and value.value != 0


def track(pid: int) -> None:
    """Register a child we spawned and will reap ourselves. Call with :data:`lock` held."""
    _tracked.add(pid)


def untrack(pid: int) -> None:
    _tracked.discard(pid)


def tracked() -> frozenset[int]:
    return frozenset(_tracked)


def reap_strangers() -> list[int]:
    """Reap every exited child that we did not spawn; returns their pids. Never blocks for long.

    Peeks with ``waitid(WNOWAIT)`` and reaps strangers one by one; when the first exited
    child is one of ours (its owner reaps it soon), a ``/proc`` scan finds the strangers
    behind it. Blocking (the lock, the scan): run it in a thread.
    """
    reaped: list[int] = []
    me, session = os.getpid(), os.getsid(0)
    with lock:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped
            if info is None:
                return reaped
            if info.si_pid in _tracked or info.si_pid in reaped or _session(info.si_pid) in (session, None):
                break
            _reap(info.si_pid, reaped)
    # One of ours (or of our session) is first in line: find the strangers behind it, without
    # holding the lock (spawns wait for it) during the scan.
    behind = [
        p.pid
        for p in proctree.scan(markers=False).values()
        if p.ppid == me and p.zombie and p.pid not in _tracked and p.sid != session
    ]
    with lock:
        for pid in behind:
            if pid not in _tracked and _session(pid) not in (session, None):
                _reap(pid, reaped)
    return reaped


def _reap(pid: int, reaped: list[int]) -> None:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            reaped.append(pid)


def _session(pid: int) -> int | None:
    with contextlib.suppress(OSError, ProcessLookupError):
        return os.getsid(pid)
    return None
