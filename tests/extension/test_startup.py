"""Start slots and the start deadline (supervisor/startup.py), driven without child processes."""

from __future__ import annotations

import time

import anyio
import pytest

from supervisor.extension import startup
from supervisor.extension.startup import StartSlots, StartTimeout, default_slots, within_start_limit

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _take(slots: StartSlots, name: str, granted: list[str], hold: anyio.Event) -> None:
    ticket = slots.ticket()
    await slots.acquire(ticket)
    granted.append(name)
    await hold.wait()
    ticket.release()


class TestStartSlots:
    def test_default_is_two_per_core_and_at_least_two(self) -> None:
        """null means two slots per core this process may use, never fewer than two."""
        assert (default_slots(1), default_slots(2), default_slots(8)) == (2, 4, 16)
        assert default_slots() >= 2

    async def test_grants_in_arrival_order(self) -> None:
        """Two slots, five starts: two at once, the others in the order they asked."""
        slots, granted, hold = StartSlots(2), [], anyio.Event()
        async with anyio.create_task_group() as tg:
            for name in "abcde":
                tg.start_soon(_take, slots, name, granted, hold)
                await anyio.wait_all_tasks_blocked()
            assert granted == ["a", "b"] and slots.stats() == {"slots": 2, "in_use": 2, "queued": 3}
            hold.set()
        assert granted == list("abcde") and slots.stats() == {"slots": 2, "in_use": 0, "queued": 0}

    async def test_position_and_release_pass_the_slot_on(self) -> None:
        """A queued ticket knows its place; a release hands the slot to the first in line."""
        slots = StartSlots(1)
        first, second, third = slots.ticket(), slots.ticket(), slots.ticket()
        assert await slots.acquire(first) == 0.0 and slots.position(first) is None
        async with anyio.create_task_group() as tg:
            tg.start_soon(slots.acquire, second)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(slots.acquire, third)
            await anyio.wait_all_tasks_blocked()
            assert (slots.position(second), slots.position(third)) == (1, 2)
            first.release()
            first.release()  # idempotent: one slot back, not two
            await anyio.wait_all_tasks_blocked()
            assert second.granted and not third.granted and slots.position(third) == 1
            second.release()
        assert third.granted and slots.in_use == 1

    async def test_a_cancelled_wait_leaves_the_queue(self) -> None:
        """A stop of a queued start is immediate and leaves nothing behind in the queue."""
        slots = StartSlots(1)
        holder = slots.ticket()
        await slots.acquire(holder)
        for _ in range(1000):  # the queue does not grow with cancelled waits
            with anyio.move_on_after(0):
                await slots.acquire(slots.ticket())
        assert slots.stats() == {"slots": 1, "in_use": 1, "queued": 0}
        holder.release()
        assert slots.in_use == 0

    async def test_a_slot_granted_to_a_cancelled_wait_goes_to_the_next(self) -> None:
        """Granted, then cancelled before it resumed: the slot is passed on, not lost."""
        slots = StartSlots(1)
        holder, late, after = slots.ticket(), slots.ticket(), slots.ticket()
        await slots.acquire(holder)
        scope = anyio.CancelScope()

        async def wait_late() -> None:
            with scope:
                await slots.acquire(late)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_late)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(slots.acquire, after)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()  # delivered on the next loop pass, before late resumes
            holder.release()  # late's turn: granted, then cancelled
        assert after.granted and slots.in_use == 1 and slots.queued == 0

    async def test_resize_serves_the_queue_at_once(self) -> None:
        """A reload raising start_slots grants queued starts without waiting for a release."""
        slots, granted, hold = StartSlots(1), [], anyio.Event()
        async with anyio.create_task_group() as tg:
            for name in "abc":
                tg.start_soon(_take, slots, name, granted, hold)
                await anyio.wait_all_tasks_blocked()
            assert granted == ["a"]
            slots.resize(3)
            await anyio.wait_all_tasks_blocked()
            assert granted == ["a", "b", "c"]
            slots.resize(1)  # fewer: takes effect as starts end
            assert slots.in_use == 3
            hold.set()
        assert slots.stats() == {"slots": 1, "in_use": 0, "queued": 0}

    async def test_the_queue_is_bounded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past MAX_QUEUED waiting at once, a start is refused rather than queued."""
        monkeypatch.setattr(startup, "MAX_QUEUED", 3)
        slots = StartSlots(1)
        await slots.acquire(slots.ticket())
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(slots.acquire, slots.ticket())
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(RuntimeError, match="more than 3 starts queued"):
                await slots.acquire(slots.ticket())
            assert slots.queued == 3
            tg.cancel_scope.cancel()
        assert slots.queued == 0


class _Cpu:
    """A child's CPU time: growing like a busy child's while *busy*, else standing still."""

    def __init__(self) -> None:
        self.busy = True
        self.reads = 0
        self._total = 0.0
        self._at = time.monotonic()

    async def __call__(self) -> float:
        now = time.monotonic()
        if self.busy:
            self._total += now - self._at
        self._at = now
        self.reads += 1
        return self._total


class TestWithinStartLimit:
    async def test_an_idle_child_ends_at_the_deadline(self) -> None:
        """No CPU used: the start ends at the deadline, neither busy nor slow."""
        cpu, slowed = _Cpu(), []
        cpu.busy = False
        started = time.monotonic()
        with pytest.raises(StartTimeout) as caught:
            await within_start_limit(
                anyio.sleep_forever, limit=0.3, cpu_seconds=cpu, on_slow=lambda: slowed.append(1), window=0.1
            )
        assert (caught.value.busy, caught.value.slow, slowed) == (False, False, [])
        assert 0.3 <= time.monotonic() - started < 2 and cpu.reads == 2

    async def test_a_busy_child_is_slow_until_the_hard_limit(self) -> None:
        """Busy at the deadline: told once, and ended at SLOW_START_FACTOR times the limit."""
        cpu, slowed = _Cpu(), []
        started = time.monotonic()
        with pytest.raises(StartTimeout) as caught:
            await within_start_limit(
                anyio.sleep_forever, limit=0.3, cpu_seconds=cpu, on_slow=lambda: slowed.append(1), window=0.1
            )
        elapsed = time.monotonic() - started
        assert (caught.value.busy, caught.value.slow, slowed) == (True, True, [1])
        assert 0.3 * startup.SLOW_START_FACTOR <= elapsed < 0.3 * startup.SLOW_START_FACTOR + 1.5

    async def test_timers_that_wake_early_do_not_make_a_busy_child_idle(self) -> None:
        """uvloop's timers count whole milliseconds and may wake before the clock says so: the
        judge then saw the hard limit not yet reached, measured again over a fraction of a
        millisecond, below the kernel's CPU accounting tick, and called a busy child idle."""
        cpu, slowed = _Cpu(), []

        def slower() -> float:  # every wake-up looks 1% early by this clock
            return time.monotonic() * 0.99

        async def ticks() -> float:
            return round(await cpu(), 2)  # CPU time in 10 ms ticks, as the kernel counts it

        with pytest.raises(StartTimeout) as caught:
            await within_start_limit(
                anyio.sleep_forever,
                limit=0.3,
                cpu_seconds=ticks,
                on_slow=lambda: slowed.append(1),
                window=0.1,
                clock=slower,
            )
        assert (caught.value.busy, caught.value.slow, slowed) == (True, True, [1])

    async def test_a_slow_child_that_goes_idle_is_ended_then(self) -> None:
        """Busy past the deadline, then idle: ended at the first idle window, before the hard limit."""
        cpu, slowed = _Cpu(), []

        def slow() -> None:
            slowed.append(1)
            cpu.busy = False

        with pytest.raises(StartTimeout) as caught:
            await within_start_limit(
                anyio.sleep_forever, limit=0.3, cpu_seconds=cpu, on_slow=slow, window=0.1
            )
        assert (caught.value.busy, caught.value.slow, slowed) == (False, True, [1])
        assert caught.value.elapsed < 0.3 * startup.SLOW_START_FACTOR

    async def test_a_late_wake_up_still_measures_a_whole_window(self) -> None:
        """The loop wakes past the deadline (a loaded machine): the busy child is judged over a
        window, not over the microseconds between two reads, which read it as idle."""
        cpu, slowed = _Cpu(), []
        reads = 0

        def late_clock() -> float:  # every read after the start's is 0.5 s late: past the deadline
            nonlocal reads
            reads += 1
            return time.monotonic() + (0.5 if reads > 1 else 0.0)

        def slow() -> None:
            slowed.append(1)
            cpu.busy = False

        with pytest.raises(StartTimeout) as caught:
            await within_start_limit(
                anyio.sleep_forever, limit=0.3, cpu_seconds=cpu, on_slow=slow, window=0.1, clock=late_clock
            )
        assert (caught.value.busy, caught.value.slow, slowed) == (False, True, [1])

    async def test_a_slow_start_that_completes_is_a_start(self) -> None:
        """The handshake completing during the slow allowance is the result."""
        cpu, slowed = _Cpu(), anyio.Event()

        async def handshake() -> str:
            # Once judged slow, not after a sleep: on a loaded machine the judgment came late,
            # after a handshake of 0.5 s had completed.
            await slowed.wait()
            return "listing"

        # The hard limit, 3 s, leaves the loop time to judge late: only then is it a timeout.
        result = await within_start_limit(
            handshake, limit=1.0, cpu_seconds=cpu, on_slow=slowed.set, window=0.1
        )
        assert result == "listing" and slowed.is_set()

    async def test_a_failing_handshake_raises_its_own_error(self) -> None:
        """What the handshake raises passes through as is, not wrapped in an exception group."""

        async def handshake() -> None:
            raise ValueError("bad initialize result")

        with pytest.raises(ValueError, match="bad initialize result"):
            await within_start_limit(handshake, limit=5, cpu_seconds=_Cpu(), on_slow=lambda: None)

    async def test_unknown_cpu_counts_as_idle(self) -> None:
        """A tree whose CPU cannot be read (gone) is not kept alive as busy."""

        async def unknown() -> None:
            return None

        with pytest.raises(StartTimeout) as caught:
            await within_start_limit(
                anyio.sleep_forever, limit=0.2, cpu_seconds=unknown, on_slow=lambda: None, window=0.1
            )
        assert not caught.value.busy and not caught.value.slow
