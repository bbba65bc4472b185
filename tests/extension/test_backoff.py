"""The backoff schedule and restart policy: pure values, tested without an event loop."""

from __future__ import annotations

import pytest

from supervisor.extension.backoff import Backoff, Outcome, OutcomeKind, RestartPolicy

NO_JITTER = Backoff(initial=0.5, maximum=30, multiplier=2, jitter=0)


class TestBackoff:
    def test_schedule_doubles_from_initial(self) -> None:
        """Attempt n waits initial * multiplier**(n-1)."""
        assert [NO_JITTER.delay(n) for n in range(1, 6)] == [0.5, 1, 2, 4, 8]

    def test_cap(self) -> None:
        """The delay never exceeds the maximum."""
        assert NO_JITTER.delay(7) == 30
        assert NO_JITTER.delay(50) == 30

    def test_huge_attempt_does_not_overflow(self) -> None:
        """A crash loop running for days still computes a delay."""
        assert NO_JITTER.delay(10**9) == 30
        assert Backoff(initial=1e-9, maximum=1e300, multiplier=1000, jitter=0).delay(10**6) == 1e300

    def test_no_delay_before_first_attempt_or_with_zero_initial(self) -> None:
        """Attempt 0 and initial 0 mean restart at once."""
        assert NO_JITTER.delay(0) == 0
        assert Backoff(initial=0).delay(5) == 0

    @pytest.mark.parametrize("rand, expected", [(0.0, 0.9), (0.5, 1.0), (1.0, 1.1)])
    def test_jitter_spreads_both_ways(self, rand: float, expected: float) -> None:
        """Jitter 0.1 moves the delay within ±10 %, driven by the injected random source."""
        backoff = Backoff(initial=1, maximum=30, multiplier=2, jitter=0.1)
        assert backoff.delay(1, rand=lambda: rand) == pytest.approx(expected)

    def test_jitter_never_exceeds_cap(self) -> None:
        """At the cap, jitter only shortens the delay."""
        backoff = Backoff(initial=1, maximum=4, multiplier=2, jitter=0.5)
        assert backoff.delay(10, rand=lambda: 1.0) == 4

    def test_multiplier_one_is_constant(self) -> None:
        """Multiplier 1 gives a fixed delay."""
        backoff = Backoff(initial=2, maximum=30, multiplier=1, jitter=0)
        assert {backoff.delay(n) for n in range(1, 20)} == {2}


def outcome(kind: OutcomeKind, uptime: float = 0.0) -> Outcome:
    return Outcome(kind, uptime=uptime)


CLEAN, CRASH = OutcomeKind.CLEAN_EXIT, OutcomeKind.CRASHED
START_FAILED, PERMANENT, STOPPED = OutcomeKind.START_FAILED, OutcomeKind.PERMANENT, OutcomeKind.STOPPED


class TestRestartPolicy:
    @pytest.mark.parametrize(
        "mode, kind, restarts",
        [
            ("always", CLEAN, True),
            ("always", CRASH, True),
            ("always", START_FAILED, True),
            ("on-failure", CLEAN, False),
            ("on-failure", CRASH, True),
            ("on-failure", START_FAILED, True),
            ("never", CLEAN, False),
            ("never", CRASH, False),
            ("never", START_FAILED, False),
        ],
    )
    def test_mode_decides_per_outcome(self, mode: str, kind: OutcomeKind, restarts: bool) -> None:
        """Each restart mode restarts exactly the outcomes systemd's equivalent would."""
        policy = RestartPolicy(mode=mode)  # type: ignore[arg-type]
        assert policy.should_restart(outcome(kind), 1) is restarts

    @pytest.mark.parametrize("mode", ["always", "on-failure", "never"])
    def test_permanent_and_stopped_never_restart(self, mode: str) -> None:
        """Command not found, or a stop on request, ends the watcher under every mode."""
        policy = RestartPolicy(mode=mode)  # type: ignore[arg-type]
        assert not policy.should_restart(outcome(PERMANENT), 1)
        assert not policy.should_restart(outcome(STOPPED), 0)

    def test_max_restarts_budget(self) -> None:
        """max_restarts=2 allows two restarts; the third consecutive failure gives up."""
        policy = RestartPolicy(mode="always", max_restarts=2)
        failures = 0
        decisions = []
        for _ in range(3):
            failures = policy.next_failures(outcome(CRASH), failures)
            decisions.append(policy.should_restart(outcome(CRASH), failures))
        assert decisions == [True, True, False]

    def test_stable_run_resets_failures(self) -> None:
        """A run that stayed up for reset_after resets the count; a short one adds to it."""
        policy = RestartPolicy(reset_after=60)
        assert policy.next_failures(outcome(CRASH, uptime=59.9), 4) == 5
        assert policy.next_failures(outcome(CRASH, uptime=60), 4) == 0
        assert policy.next_failures(outcome(CLEAN, uptime=61), 4) == 0

    def test_start_failures_never_reset(self) -> None:
        """A failed handshake counts however long it took."""
        assert RestartPolicy(reset_after=0).next_failures(outcome(START_FAILED, uptime=100), 2) == 3

    def test_stop_leaves_count_alone(self) -> None:
        """A stop on request is no failure."""
        assert RestartPolicy().next_failures(outcome(STOPPED), 3) == 3

    @pytest.mark.parametrize(
        "mode, kind, failed",
        [
            ("on-failure", CLEAN, False),
            ("never", CLEAN, False),
            ("always", CLEAN, True),
            ("never", CRASH, True),
            ("on-failure", PERMANENT, True),
            ("always", STOPPED, False),
        ],
    )
    def test_gave_up_means_failed(self, mode: str, kind: OutcomeKind, failed: bool) -> None:
        """A clean exit the policy accepts ends as stopped; anything else that ends the watcher is failed."""
        assert RestartPolicy(mode=mode).gave_up(outcome(kind), 1) is failed  # type: ignore[arg-type]
