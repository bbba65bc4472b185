"""On-demand extensions: the saved listing, the start hook and the idle timer of one extension.

Every configured :class:`~supervisor.extension.Extension` gets one :class:`Demand`: its listing
is saved for all (the gateway keeps its names while it does not run, across daemon restarts
too); only with ``on_demand`` or ``idle_stop`` does the saved listing stand in for the child's
in lists, and does a call start it. Its owner writes it; the idle timer runs inside the run's
helper task group (the watcher owns it), one timer per run, so it dies with the child and is
never orphaned.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from supervisor.extension.saved import CatalogStore
from supervisor.upstream.listing import Listing

if TYPE_CHECKING:
    from supervisor.extension.upstream import Upstream

__all__ = ("BUSY_RECHECK", "Demand", "StartHook", "idle_wait", "tasks_working")

log = structlog.get_logger(__name__)

StartHook = Callable[[Any], Awaitable[None]]  # starts the Extension given in the daemon's task group
BUSY_RECHECK = 1.0  # a busy extension is looked at again after max(idle_stop, this) seconds
TASKS_QUESTION_TIMEOUT = 5.0  # seconds for a child to say whether a task of its works
MAX_TASK_PAGES = 8  # of its tasks/list, read for that
WORKING = ("working", "input_required")  # a task in these states is not finished


def idle_wait(now: float, last_active: float, idle: float, busy: bool) -> float | None:
    """Seconds until the idle timer should look again, or None: stop now. Pure.

    *busy*: a call, a subscription or a task is in flight, so it is not idle whatever the clock.
    """
    if busy:
        return max(idle, BUSY_RECHECK)
    remaining = last_active + idle - now
    return remaining if remaining > 0 else None


async def _none_working() -> bool:
    return False


async def tasks_working(connection: Upstream) -> bool:
    """Whether the child says a task of its own still works (2025-11-25 ``tasks/list``).

    An idle stop would lose it: a server's tasks live in its process. The question is not a
    call (it neither counts in flight nor renews the idle period). A child that cannot say (no
    ``tasks.list`` capability, an error, no answer within :data:`TASKS_QUESTION_TIMEOUT`) is
    taken to have none, as before tasks existed; at most :data:`MAX_TASK_PAGES` pages are read.
    """
    tasks = connection.capabilities.tasks
    if tasks is None or tasks.list is None:
        return False
    params: dict[str, Any] = {}
    try:
        with anyio.fail_after(TASKS_QUESTION_TIMEOUT):
            for _ in range(MAX_TASK_PAGES):
                page = await connection.request_raw("tasks/list", params, progress=_ignore_progress)
                listed = page.get("tasks")
                if isinstance(listed, list) and any(
                    isinstance(task, dict) and task.get("status") in WORKING for task in listed
                ):
                    return True
                cursor = page.get("nextCursor")
                if not isinstance(cursor, str) or not cursor:
                    return False
                params = {"cursor": cursor}
    except Exception as exc:  # TimeoutError, the child's error, a broken pipe: it cannot say
        log.info("extension.tasks_unknown", error=str(exc)[:200] or type(exc).__name__)
    return False


async def _ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


class Demand:
    """One extension's on-demand bookkeeping.

    Args:
        idle_stop: seconds without calls before the child is stopped; None: never (but a run
            that only learns the listing stops as soon as it is idle).
        store: where its listing is saved; None: not saved.
        start: the daemon's hook that starts the extension (under its per-name lock).
        holds: whether a gateway client holds a subscription to one of its resources.
        stands_in: whether the saved listing is what clients see while the child does not run
            (``on_demand``, ``idle_stop``); else it only keeps the extension's gateway names.
    """

    def __init__(
        self,
        *,
        idle_stop: float | None,
        store: CatalogStore | None,
        start: StartHook,
        holds: Callable[[], bool] = lambda: False,
        stands_in: bool = True,
    ) -> None:
        self.idle_stop = idle_stop
        self.store = store
        self.start = start
        self.holds = holds
        self.stands_in = stands_in
        self.saved: Listing | None = store.load() if store is not None else None  # bounded read
        self.learning = False  # this run was started only to learn the listing
        self.last_active = time.monotonic()

    def touch(self) -> None:
        """A call began or ended: the idle period starts again."""
        self.last_active = time.monotonic()

    @property
    def idle_after(self) -> float | None:
        if self.idle_stop is not None:
            return self.idle_stop
        return 0.0 if self.learning else None

    def same(self, listing: Listing) -> Listing:
        """The saved listing if *listing* equals it: clients hear of no change when it starts."""
        return self.saved if self.saved is not None and self.saved == listing else listing

    async def save(self, listing: Listing) -> None:
        """Remember *listing* (at once) and write it (in a thread) unless it is the one saved:
        :meth:`same` hands that back, so a restart with an unchanged listing writes nothing."""
        unchanged, self.saved = listing is self.saved, listing
        if self.store is not None and not unchanged:
            await anyio.to_thread.run_sync(self.store.save, listing)

    async def serve(
        self,
        listing: Listing,
        in_flight: Callable[[], int],
        stop: Callable[[], None],
        tasks_working: Callable[[], Awaitable[bool]] = _none_working,
    ) -> None:
        """For one run: save its listing, then call *stop* once idle (never while busy).

        *tasks_working* asks the child whether a task of its own still works (it would be lost):
        asked only once the run looks idle otherwise, and then that look is taken again.
        """
        self.touch()
        await self.save(listing)
        idle = self.idle_after
        if idle is None:
            return

        def wait() -> float | None:
            busy = in_flight() > 0 or self.holds()
            return idle_wait(time.monotonic(), self.last_active, idle, busy)

        while True:
            if (seconds := wait()) is None:
                if await tasks_working():
                    seconds = max(idle, BUSY_RECHECK)
                elif (seconds := wait()) is None:  # again: a call may have come during the question
                    log.info("extension.idle_stop", idle=idle, learning=self.learning)
                    stop()  # sync, right after the check: no call can slip in between
                    return
            await anyio.sleep(seconds)
