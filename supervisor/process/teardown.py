"""Killing a child's whole process tree: through its cgroup, or by scanning ``/proc``.

With a cgroup (see :mod:`supervisor.process.cgroups`) the tree is exactly the cgroup's members:
SIGTERM, then ``cgroup.kill``, which the kernel applies atomically with respect to forks,
waiting on ``cgroup.events`` (an epoll event, no polling), then the cgroup is removed.
Without one, :mod:`supervisor.process.tree` finds the tree and kills it by pidfd, stopping what
it finds until a scan finds nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import anyio
import structlog

from supervisor.process import reaper
from supervisor.process import tree as proctree
from supervisor.process.cgroups import Subtree, member_of, populated

__all__ = ("Child", "terminate_tree", "wait_until")

log = structlog.get_logger(__name__)


class Child(Protocol):
    """What a teardown needs of a child (:class:`supervisor.process.children.ChildProcess`)."""

    pid: int
    marker: str
    exited: anyio.Event
    cgroup: Path | None
    started: int | None
    returncode: int | None
    terminated: bool

    @property
    def pgid(self) -> int: ...

    def signal(self, sig: int) -> None: ...

    def close_stdin(self) -> None: ...

    def close_pipes(self) -> None: ...


async def terminate_tree(
    child: Child, *, grace: float, term_grace: float = 3.0, hurry: anyio.Event | None = None
) -> None:
    """Close stdin, wait up to *grace* s, SIGTERM the tree, wait, SIGKILL what is left.

    Shielded and bounded: returns within about ``grace + term_grace + 5`` seconds even if
    the caller is cancelled. Once *hurry* is set (a forced shutdown), the graces are skipped
    and what is left is SIGKILLed at once. Never raises. Afterwards no process of the tree
    is alive (zombies aside: dead, and only waiting for their parent to reap them), and the
    child's cgroup is gone.
    """
    hurry = hurry or anyio.Event()
    with anyio.CancelScope(shield=True):
        child.close_stdin()
        await wait_until(child.exited, hurry, within=grace)
        try:
            if child.cgroup is not None:
                await _end_cgroup(child, child.cgroup, term_grace, hurry)
            else:
                await _end_scanned(child, term_grace, hurry)
        except Exception:  # a bug of ours: what we can still kill dies, and the caller goes on
            log.exception("process.teardown_failed", marker=child.marker)
            child.signal(signal.SIGKILL)
            if child.cgroup is not None:
                with contextlib.suppress(OSError):  # out of fds, maybe: what failed the step
                    Subtree.kill(child.cgroup)
            if child.returncode is None:
                _killpg_quietly(child.pgid, signal.SIGKILL)
        with anyio.move_on_after(2.0):
            await child.exited.wait()
        child.close_pipes()
        child.terminated = True


async def _end_cgroup(child: Child, cgroup: Path, term_grace: float, hurry: anyio.Event) -> None:
    """SIGTERM the cgroup's members, wait, then ``cgroup.kill`` until it is empty, and remove it."""
    with _CgroupEvents(cgroup) as events:
        if not hurry.is_set() and (populated(cgroup) or child.returncode is None):
            child.signal(signal.SIGTERM)  # maybe not in its cgroup yet: still in the shim
            _signal_members(cgroup, signal.SIGTERM)
            await wait_until(events.empty, hurry, within=term_grace)
        for _ in range(3):  # a shim that joins after the kill makes the removal fail: again
            child.signal(signal.SIGKILL)
            Subtree.kill(cgroup)
            with anyio.move_on_after(2.0):
                await events.empty.wait()
                await child.exited.wait()
            if Subtree.remove(cgroup):
                return
            events.refresh()
    log.warning("process.cgroup_busy", cgroup=str(cgroup))


def _signal_members(cgroup: Path, sig: int) -> None:
    """Signal each process in *cgroup* through a pidfd, checked to still be a member after opening."""
    for pid in Subtree.pids(cgroup):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if member_of(cgroup, pid):  # checked after opening: the pidfd is that member
                signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)


class _CgroupEvents:
    """``empty`` is set once ``cgroup.events`` says nobody is left (an epoll on its PRI events)."""

    def __init__(self, cgroup: Path) -> None:
        self._cgroup = cgroup
        self._fd = -1
        self._epoll: select.epoll | None = None
        self.empty = anyio.Event()

    def __enter__(self) -> _CgroupEvents:
        with contextlib.suppress(OSError):
            self._fd = os.open(self._cgroup / "cgroup.events", os.O_RDONLY)
            self._epoll = select.epoll()
            self._epoll.register(self._fd, select.EPOLLPRI)
            asyncio.get_running_loop().add_reader(self._epoll.fileno(), self.refresh)
        self.refresh()
        return self

    def refresh(self) -> None:
        if self._epoll is not None:
            self._epoll.poll(0)  # consume the event; reading the file below re-arms it
        try:
            still = b"populated 1" in os.pread(self._fd, 256, 0)
        except OSError:  # removed, or never opened
            still = populated(self._cgroup)
        if not still:
            self.empty.set()
        elif self.empty.is_set():
            self.empty = anyio.Event()

    def __exit__(self, *exc: object) -> None:
        if self._epoll is not None:
            asyncio.get_running_loop().remove_reader(self._epoll.fileno())
            self._epoll.close()
        if self._fd >= 0:
            os.close(self._fd)


async def _end_scanned(child: Child, term_grace: float, hurry: anyio.Event) -> None:
    """The fallback: SIGTERM what a scan finds, wait, then stop-scan-kill until nothing is new."""
    find = _tree_of(child)
    if not hurry.is_set():
        if child.returncode is None:  # on the loop, where it is reaped: the group id is still ours
            _killpg_quietly(child.pgid, signal.SIGTERM)
        fds = await anyio.to_thread.run_sync(_open_tree, find)
        if not fds and child.returncode is not None and not await anyio.to_thread.run_sync(_rescan, find):
            return  # twice nothing (once may miss a process inside execve): nothing grows back
        for fd in fds:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, signal.SIGTERM)
        await _wait_closed(fds, term_grace, hurry=hurry)
    for _ in range(3):
        if child.returncode is None:
            _killpg_quietly(child.pgid, signal.SIGKILL)  # atomic against forks in the group
        if not await anyio.to_thread.run_sync(functools.partial(proctree.kill_tree, find)):
            return  # a scan found nobody
    log.warning("process.tree_survivors", marker=child.marker)


def _tree_of(child: Child) -> Callable[[dict[int, proctree.Proc]], set[int]]:
    """A finder for *child*'s tree in a scan."""
    adopter = os.getpid() if reaper.is_subreaper() else None

    def find(procs: dict[int, proctree.Proc]) -> set[int]:
        me = procs.get(child.pid)  # reaped meanwhile on the loop, its pid may name another process now
        roots = (child.pid,) if me is not None and me.started == child.started else ()
        tracked = reaper.tracked()
        return proctree.members(procs, prefix=child.marker, roots=roots, adopter=adopter, tracked=tracked)

    return find


def _rescan(find: Callable[[dict[int, proctree.Proc]], set[int]]) -> set[int]:
    return find(proctree.scan())


def _open_tree(find: Callable[[dict[int, proctree.Proc]], set[int]]) -> list[int]:
    """Pidfds of the tree's members, from one scan."""
    procs = proctree.scan()
    return [fd for pid in find(procs) if (fd := proctree.open_verified(procs[pid])) is not None]


async def wait_until(event: anyio.Event, hurry: anyio.Event, *, within: float) -> None:
    """Wait for *event*, at most *within* s, and no longer once *hurry* is set."""
    with anyio.move_on_after(within):
        async with anyio.create_task_group() as tg:

            async def wait_then_stop(which: anyio.Event) -> None:
                await which.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait_then_stop, event)
            tg.start_soon(wait_then_stop, hurry)


def _killpg_quietly(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _wait_closed(pidfds: list[int], within: float, *, hurry: anyio.Event | None = None) -> None:
    """Wait until every pidfd reports an exit (events, no polling), at most *within* s; closes them."""
    loop = asyncio.get_running_loop()
    all_gone = anyio.Event()
    remaining = len(pidfds)

    def gone(fd: int) -> None:
        nonlocal remaining
        loop.remove_reader(fd)
        remaining -= 1
        if remaining == 0:
            all_gone.set()

    try:
        for fd in pidfds:
            loop.add_reader(fd, gone, fd)
        if remaining:
            await wait_until(all_gone, hurry or anyio.Event(), within=within)
    finally:
        for fd in pidfds:
            loop.remove_reader(fd)
            os.close(fd)
