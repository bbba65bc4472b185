"""How a start storm converges: start slots, and a start deadline that tells slow from stuck.

A start (spawn, ``initialize``, the first listings) is the costly part of a child's life: an
SDK-based Python server burns a second of CPU before it answers, a wrapper (``npx -y``, ``uvx``)
may download for minutes. A hundred of them at once on two cores starve each other, every one
misses its deadline, is killed half-started and tried again, and the herd never gets through.

:class:`StartSlots` bounds how many starts run at once: a watcher takes a slot before it
spawns and gives it back once the handshake is done or has failed; the rest wait in a fair
FIFO queue (``queued`` in ``status``). A wait in the queue is cancellable at once (a stop).

:func:`within_start_limit` runs the handshake against the deadline, counted from the slot's
grant. A child that is still using CPU when the deadline passes is slow, not stuck: it gets
up to :data:`SLOW_START_FACTOR` times the deadline in all, and is ended once it goes idle or
that hard limit passes. A child that sits idle at the deadline is ended at once, as before.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio

from supervisor.process import usage as resources

__all__ = (
    "BUSY_SHARE",
    "BUSY_WINDOW",
    "MAX_QUEUED",
    "SLOW_START_FACTOR",
    "StartSlots",
    "StartTimeout",
    "Ticket",
    "default_slots",
    "slow_detail",
    "timeout_error",
    "tree_cpu",
    "within_start_limit",
)

SLOW_START_FACTOR = 3.0  # a start still busy at its deadline gets up to this many times it in all
BUSY_WINDOW = 1.0  # seconds of CPU use looked at to call a child busy
BUSY_SHARE = 0.02  # of one core over BUSY_WINDOW: busy (a sleeping or blocked child uses ~0)
MAX_QUEUED = 100_000  # watchers waiting at once; each extension or instance has at most one

ResultT = TypeVar("ResultT")


def default_slots(cpus: int | None = None) -> int:
    """``start_slots: null``: two per core this process may run on, at least two."""
    count = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return max(2, 2 * count)


class Ticket:
    """One start's place: queued, then holding a slot until :meth:`release` (idempotent)."""

    __slots__ = ("_granted", "_owner", "_released", "_wake", "queued_at")

    def __init__(self, owner: StartSlots | None) -> None:
        self._owner = owner
        self._wake = anyio.Event()
        self._granted = owner is None  # no slots: every start runs at once
        self._released = False
        self.queued_at = time.monotonic()

    @property
    def granted(self) -> bool:
        return self._granted

    def release(self) -> None:
        """Give the slot back (the start is over, either way); the next queued start gets it."""
        if self._owner is not None and self._granted and not self._released:
            self._released = True
            self._owner._give_back()


class StartSlots:
    """At most *count* starts at once; the others wait in arrival order.

    Bounds: one ticket per watcher (each extension and per-client instance has at most one
    watcher); over :data:`MAX_QUEUED` waiting at once, :meth:`acquire` raises ``RuntimeError``.
    A cancelled wait leaves the queue at once.
    """

    def __init__(self, count: int) -> None:
        self._count = count
        self._in_use = 0
        self._queue: deque[Ticket] = deque()

    @property
    def count(self) -> int:
        return self._count

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def queued(self) -> int:
        return len(self._queue)

    def resize(self, count: int) -> None:
        """A reload's new ``start_slots``: more slots serve the queue at once; fewer take effect
        as the starts in progress end."""
        self._count = count
        self._grant()

    def ticket(self) -> Ticket:
        return Ticket(self)

    async def acquire(self, ticket: Ticket) -> float:
        """Wait for a slot for *ticket*, in arrival order; return how long it waited (0: not at all).

        Cancellable: a cancelled wait leaves the queue (or passes on a slot granted meanwhile).
        """
        if not self._queue and self._in_use < self._count:
            ticket._granted = True
            self._in_use += 1
            return 0.0
        if len(self._queue) >= MAX_QUEUED:
            raise RuntimeError(f"more than {MAX_QUEUED} starts queued")
        ticket.queued_at = time.monotonic()
        self._queue.append(ticket)
        try:
            await ticket._wake.wait()
        except BaseException:  # cancelled (a stop): out of the queue, or pass the slot on
            if ticket._granted:
                ticket.release()
            else:
                self._queue.remove(ticket)
            raise
        return max(time.monotonic() - ticket.queued_at, 1e-6)

    def position(self, ticket: Ticket) -> int | None:
        """*ticket*'s place in the queue, 1 for the next to start; None once it has a slot."""
        if ticket._granted:
            return None
        try:
            return self._queue.index(ticket) + 1
        except ValueError:
            return None

    def _give_back(self) -> None:
        self._in_use -= 1
        self._grant()

    def _grant(self) -> None:
        while self._queue and self._in_use < self._count:
            ticket = self._queue.popleft()
            ticket._granted = True
            self._in_use += 1
            ticket._wake.set()

    def stats(self) -> dict[str, int]:
        return {"slots": self._count, "in_use": self._in_use, "queued": len(self._queue)}


class StartTimeout(Exception):
    """The handshake did not complete in time.

    *busy*: the child was still using CPU when it was ended (the hard limit passed); *slow*: it
    was busy at the deadline and got the slow-start allowance.
    """

    def __init__(self, elapsed: float, *, busy: bool, slow: bool) -> None:
        super().__init__(f"no handshake within {elapsed:.1f}s")
        self.elapsed, self.busy, self.slow = elapsed, busy, slow


async def within_start_limit(
    handshake: Callable[[], Awaitable[ResultT]],
    *,
    limit: float,
    cpu_seconds: Callable[[], Awaitable[float | None]],
    on_slow: Callable[[], None],
    window: float = BUSY_WINDOW,
    clock: Callable[[], float] = time.monotonic,
) -> ResultT:
    """Run *handshake* within *limit* s, or up to ``SLOW_START_FACTOR * limit`` while busy.

    *cpu_seconds* reads the child tree's CPU time so far (None: unknown, taken as idle); it is
    read only around the deadline and once per *window* s after it: busy means it used at least
    :data:`BUSY_SHARE` of a core over the last *window*. *on_slow* is called once, when the
    deadline passes with the child busy.

    Error handling: raises :class:`StartTimeout` when the start is ended; whatever *handshake*
    raises passes through unchanged.
    """
    started = clock()
    deadline, hard = started + limit, started + limit * SLOW_START_FACTOR
    verdict: list[StartTimeout] = []
    result: list[ResultT] = []
    failure: list[Exception] = []

    async def sleep_until(moment: float) -> None:
        # Until *clock* says so: uvloop's timers count whole milliseconds and may wake a little early.
        while (left := moment - clock()) > 0:  # noqa: ASYNC110 - a wait for a moment, not a poll
            await anyio.sleep(left)

    # Busy is judged over this span at least, also when the loop wakes late (a loaded machine):
    # a span of microseconds, clamped, read a busy child as idle.
    least_span = min(window, limit / 2)

    async def judge(scope: anyio.CancelScope) -> None:
        await sleep_until(deadline - least_span)  # not the child's own startup
        measured_at, before = clock(), await cpu_seconds()
        await sleep_until(max(deadline, measured_at + least_span))
        slow = False
        while True:
            now, after = clock(), await cpu_seconds()
            span = max(now - measured_at, 1e-3)
            busy = before is not None and after is not None and (after - before) / span >= BUSY_SHARE
            if not busy or now >= hard:
                verdict.append(StartTimeout(now - started, busy=busy, slow=slow))
                scope.cancel()
                return
            if not slow:
                slow = True
                on_slow()
            measured_at, before = now, after
            await sleep_until(max(min(hard, now + window), now + least_span))

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(judge, scope)
            try:
                result.append(await handshake())
            except Exception as exc:  # kept out of the task group, which would wrap it in a group
                failure.append(exc)
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if result:
        return result[0]
    raise verdict[0] if verdict else StartTimeout(clock() - started, busy=False, slow=False)


async def tree_cpu(pid: int, marker: str, cgroup: Path | None) -> float | None:
    """CPU seconds the run's tree has used (see :func:`resources.run_usage`); None once it is gone."""
    usage = await anyio.to_thread.run_sync(resources.run_usage, pid, marker, cgroup)
    return usage.cpu_seconds if usage.processes else None


def slow_detail(limit: float) -> str:
    """The status ``detail`` of a start past its deadline *limit* but busy."""
    hard = limit * SLOW_START_FACTOR
    return f"slow start: no handshake within {limit:g}s, still busy (given up to {hard:g}s)"


def timeout_error(exc: StartTimeout, limit: float, setting: str, waiting: str) -> str:
    """The ``last_error`` of a start ended by *exc*: its deadline *limit* (from *setting*,
    ``start_timeout`` or ``first_start_timeout``), whether it was busy, the request unanswered."""
    which = "" if setting == "start_timeout" else f"{setting}; "
    unanswered = f"{which}no answer to {waiting}"
    if exc.busy:  # the hard limit
        hard = limit * SLOW_START_FACTOR
        return f"slow start: still busy, but no MCP handshake within {hard:g}s ({unanswered})"
    if exc.slow:
        return f"slow start: busy past {limit:g}s, then idle without an MCP handshake ({unanswered})"
    return f"no MCP handshake within {limit:g}s ({unanswered})"
