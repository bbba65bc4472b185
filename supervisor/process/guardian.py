"""The guardian: a small process that ends the daemon's process trees when the daemon dies.

A SIGKILLed daemon runs no cleanup, and ``PR_SET_PDEATHSIG`` reaches only its direct
children. So each daemon starts one guardian (a fresh ``python -I -S`` importing only this
module and the standard library: about 12 MiB RSS, see docs/operations.md) that holds a pidfd of the
daemon. When that pidfd says the daemon exited, however it exited, the guardian

* with cgroups: writes ``cgroup.kill`` of the daemon's sub-tree (every extension's cgroup
  at once), waits on ``cgroup.events`` until it is empty, and removes the cgroups;
* always: stops and kills every process carrying the daemon's marker prefix, with their
  sessions, groups and descendants (:mod:`supervisor.process.tree`), until a scan finds none;

then exits. A clean shutdown closes the guardian's stdin instead: it makes the same pass
(finding nothing) and exits, and the daemon reaps it. Race-free start: it opens the
pidfd of its parent and then checks that its parent is still that pid (if the daemon died
before, it was re-parented, and it cleans up at once). The daemon waits for its ``ready``
line before starting any extension, so no extension runs unguarded.

It ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C or ``systemctl stop`` reaches the daemon, and
the guardian then follows it), and it runs in a session of its own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import sys
import time
from collections.abc import Collection
from pathlib import Path

from supervisor.process import tree as proctree
from supervisor.process.cgroups import Subtree, populated

__all__ = ("argv", "clean_up", "main")


def argv(*, daemon: int, prefix: str, subtree: Path | None) -> list[str]:
    """The command line that starts a guardian for *daemon* (whose markers start with *prefix*)."""
    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the supervisor package
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import supervisor.process.guardian as g; g.main(sys.argv[2:])"
    )
    return [sys.executable, "-I", "-S", "-c", code, root, str(daemon), prefix, str(subtree or "")]


def _say(event: str, **fields: object) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(json.dumps({"event": event, "level": "info", **fields}), file=sys.stderr, flush=True)


def _wait_empty(cgroup: Path, within: float) -> bool:
    """Wait (POLLPRI on ``cgroup.events``) until *cgroup* is unpopulated, at most *within* s."""
    try:
        fd = os.open(cgroup / "cgroup.events", os.O_RDONLY)
    except OSError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        deadline = time.monotonic() + within
        while b"populated 1" in os.pread(fd, 256, 0):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(left * 1000)
        return True
    finally:
        os.close(fd)


def clean_up(
    prefix: str, subtree: Path | None, *, adopter: int | None = None, tracked: Collection[int] = ()
) -> int:
    """Kill everything the daemon started; returns how many processes the scan had to kill.

    *adopter* and *tracked*: the daemon's own pid and live children, when the daemon itself
    cleans up as a subreaper (its unmarked orphans are then found too). Blocking.
    """
    if subtree is not None:
        for _ in range(5):
            Subtree.kill(subtree)
            _wait_empty(subtree, 2.0)
            if Subtree.remove(subtree):
                break
    find = functools.partial(proctree.members, prefix=prefix, adopter=adopter, tracked=tracked)
    return proctree.kill_tree(find, within=3.0)


def main(args: list[str]) -> None:
    """``guardian DAEMON_PID PREFIX [SUBTREE]``: wait for the daemon to exit, then clean up."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    daemon, prefix, subtree = int(args[0]), args[1], Path(args[2]) if len(args) > 2 and args[2] else None
    try:
        pidfd = os.pidfd_open(daemon)
    except OSError:
        pidfd = -1
    if pidfd >= 0 and os.getppid() == daemon:  # still our parent after the open: the pidfd is the daemon
        try:
            os.write(1, b"ready\n")
            os.close(1)
        except OSError:
            pass
        select.select([pidfd, 0], [], [])  # the daemon exited, or closed our stdin
    started = time.monotonic()
    left_over = subtree is not None and populated(subtree)
    killed = clean_up(prefix, subtree)
    if left_over or killed:
        _say(
            "guardian.cleaned_up", daemon=daemon, killed=killed, seconds=round(time.monotonic() - started, 3)
        )
