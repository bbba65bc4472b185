"""Process trees read from ``/proc``, and killed through pidfds: the fallback without cgroups.

Standard library only: the guardian process (:mod:`supervisor.process.guardian`) imports it too,
and must start fast and small. Everything here blocks; async callers run it in a thread.

Who belongs to a tree. Seeds: the child itself and every process carrying its marker
(``MCP_SUPERVISOR_MARK``, inherited by descendants). Then, to a fixed point: every process
in a session or process group of a member (only descendants of a session's leader can be in
that session), and every descendant of a member by parent links. A daemon that is a child
subreaper also takes the orphans that were handed to it (a double fork lands there) when
they carry this tree's marker or none. What no rule catches: a process that left the
session, cleared its environment and was orphaned while the daemon was not there to
inherit it; cgroups (:mod:`supervisor.process.cgroups`) have no such gap.

Signals go through pidfds opened after the scan and checked against the scanned start
time, so a pid that was reused in between is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Collection, Iterable

__all__ = (
    "MARKER_ENV",
    "Proc",
    "find_marked",
    "holder_of_socket",
    "kill_tree",
    "members",
    "open_verified",
    "parse_stat",
    "scan",
    "start_time",
    "stat_fields",
)

MARKER_ENV = "MCP_SUPERVISOR_MARK"

_NEEDLE = f"\0{MARKER_ENV}=".encode()


class Proc:
    """One process as ``/proc`` showed it. ``started`` (clock ticks since boot) tells pids apart."""

    # Not a dataclass: the guardian imports this module in a bare interpreter, and dataclasses
    # (with inspect) was a third of its start.
    __slots__ = ("marker", "pgid", "pid", "ppid", "sid", "started", "zombie")

    def __init__(
        self, pid: int, ppid: int, pgid: int, sid: int, started: int, zombie: bool, marker: str | None
    ) -> None:
        self.pid, self.ppid, self.pgid, self.sid = pid, ppid, pgid, sid
        self.started, self.zombie, self.marker = started, zombie, marker


def stat_fields(pid: int, count: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` from the state on (field 3 of proc(5) is ``[0]``), at
    least *count* of them; None when *pid* is gone or the text is not a whole stat line: a
    scan takes that for gone and goes on, never fails on it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return parse_stat(stat.read(), count)
    except OSError:
        return None


def parse_stat(data: bytes, count: int) -> list[bytes] | None:
    """The fields of one ``/proc/PID/stat`` text from the state on, if at least *count*."""
    end = data.rfind(b")")  # the command name before it may contain anything, ")" too
    fields = data[end + 2 :].split() if end >= 0 else []
    return fields if len(fields) >= count else None


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, sid, start time) of *pid*, or None when it is gone."""
    fields = stat_fields(pid, 20)
    if fields is None:
        return None
    try:
        state = fields[0].decode(errors="replace")
        return state, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except ValueError:  # not whole after all
        return None


def start_time(pid: int) -> int | None:
    """When *pid* started (clock ticks since boot): with the pid, it names one process for good."""
    stat = _stat(pid)
    return stat[4] if stat else None


def _marker(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            data = b"\0" + environ.read()
    except OSError:  # gone, or not ours to read
        return None
    start = data.find(_NEEDLE)
    if start < 0:
        return None
    start += len(_NEEDLE)
    end = data.find(b"\0", start)
    return data[start : end if end >= 0 else None].decode(errors="replace")


def scan(*, markers: bool = True) -> dict[int, Proc]:
    """Every process but kernel threads and this one, now. One read of stat (and environ) each."""
    me = os.getpid()
    found: dict[int, Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if pid == me or stat is None or stat[1] == 2 or pid == 2:  # kthreadd and its threads
            continue
        state, ppid, pgid, sid, started = stat
        zombie = state in ("Z", "X")
        marker = _marker(pid) if markers and not zombie else None
        found[pid] = Proc(pid, ppid, pgid, sid, started, zombie, marker)
    return found


def find_marked(prefix: str, keep: str | None = None) -> set[int]:
    """Pids of live processes whose marker starts with *prefix* (and not with *keep*)."""
    return {
        p.pid
        for p in scan().values()
        if p.marker is not None and p.marker.startswith(prefix) and not (keep and p.marker.startswith(keep))
    }


def holder_of_socket(inode: int, root: int) -> list[int] | None:
    """The descendant of *root* holding the socket *inode* and its ancestors up to *root*'s child
    (``[holder, parent, ..., child of root]``); None when no descendant of *root* holds it.

    Reads only *root*'s subtree: each process's children (``/proc/PID/task/TID/children``) and
    fd links.
    """
    wanted = f"socket:[{inode}]"
    parent_of: dict[int, int] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        if pid != root and _holds(pid, wanted):
            chain = [pid]
            while parent_of[chain[-1]] != root:
                chain.append(parent_of[chain[-1]])
            return chain
        for child in _children(pid):
            if child not in parent_of and child != root:
                parent_of[child] = pid
                pending.append(child)
    return None


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as listed:
                found += [int(c) for c in listed.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _holds(pid: int, link: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                return True
        except OSError:
            continue
    return False


def members(
    procs: dict[int, Proc],
    *,
    prefix: str,
    keep: str | None = None,
    roots: Collection[int] = (),
    adopter: int | None = None,
    tracked: Collection[int] = (),
) -> set[int]:
    """The pids of the tree whose marker starts with *prefix*, by the rules in the module doc.

    *roots* are seeds known by pid (the child itself, which may have rewritten its
    environment). *adopter* is our own pid when we are a child subreaper: its children that
    are not *tracked* (spawned by us) and not in its own session (every tree has sessions
    of its own; other code's subprocesses stay in ours) are orphans of some tree. A process
    marked for another tree (or with a marker starting with *keep*) never belongs to this one.
    """
    own_session = os.getsid(adopter) if adopter is not None else None

    def marked(p: Proc) -> bool:
        return (
            p.marker is not None and p.marker.startswith(prefix) and not (keep and p.marker.startswith(keep))
        )

    def ours(p: Proc) -> bool:
        return p.marker is None or marked(p)

    found = {
        p.pid
        for p in procs.values()
        if marked(p)
        or p.pid in roots
        or (p.ppid == adopter and p.sid != own_session and p.pid not in tracked and ours(p))
    }
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    while True:
        groups = {procs[pid].pgid for pid in found} | {procs[pid].sid for pid in found}
        groups.discard(0)
        grown = {p.pid for p in procs.values() if (p.sid in groups or p.pgid in groups) and ours(p)}
        grown.update(c for pid in found for c in children.get(pid, ()) if ours(procs[c]))
        grown -= set(tracked) - set(roots)
        if grown <= found:
            return {pid for pid in found if not procs[pid].zombie}
        found |= grown


def open_verified(proc: Proc) -> int | None:
    """A pidfd for *proc*, or None if it is gone (or its pid now names another process)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return None
    stat = _stat(proc.pid)  # read after the open: if it still matches, the pidfd is that process
    if stat is None or stat[4] != proc.started:
        os.close(fd)
        return None
    return fd


def _send(fd: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        signal.pidfd_send_signal(fd, sig)


def kill_tree(
    find: Callable[[dict[int, Proc]], set[int]],
    *,
    within: float = 2.0,
    sig: int = signal.SIGKILL,
    groups: Iterable[int] = (),
) -> int:
    """Stop, rescan and kill until a scan finds nothing new; wait up to *within* s for the dead.

    *find* picks the tree's pids from a scan. Each round SIGSTOPs what it found (a stopped
    process cannot fork), then scans again, until nothing new appears; then everything is
    sent *sig* (SIGKILL, or SIGTERM for the polite phase, which skips the stopping); "nothing
    new" takes two scans in a row, as a process in the middle of an exec has no readable
    environment for a moment. *groups*
    are process groups whose leader we hold unreaped, killed first and atomically by the
    kernel (a fork in flight is killed too). Returns how many processes were signalled.
    Blocking: run it in a thread.
    """
    deadline = time.monotonic() + within
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    held: dict[tuple[int, int], int] = {}  # (pid, start time) -> pidfd
    quiet = 0
    try:
        while time.monotonic() < deadline:
            procs = scan()
            fresh = [procs[pid] for pid in find(procs) if (pid, procs[pid].started) not in held]
            quiet = 0 if fresh else quiet + 1
            if quiet == 2:  # twice: a process caught inside execve() shows no environment
                break
            for proc in fresh:
                fd = open_verified(proc)
                if fd is not None:
                    held[proc.pid, proc.started] = fd
                    if sig == signal.SIGKILL:
                        _send(fd, signal.SIGSTOP)
        for fd in held.values():
            _send(fd, sig)
        if sig == signal.SIGKILL:
            _wait_closed(list(held.values()), max(0.0, deadline - time.monotonic()) + 1.0)
        return len(held)
    finally:
        for fd in held.values():
            os.close(fd)


def _wait_closed(pidfds: list[int], within: float) -> None:
    """Wait until every pidfd reports its process exited, at most *within* s."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    pending = len(pidfds)
    deadline = time.monotonic() + within
    while pending and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            poller.unregister(fd)
            pending -= 1
