"""Restart policy and backoff schedule: pure values, no clock and no sleeping.

The watcher feeds each run's :class:`Outcome` to a :class:`RestartPolicy`, which says whether
to restart and after how long. Randomness is injectable so the schedule is testable.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from supervisor.extension.state import ExitStatus

__all__ = ("Backoff", "Outcome", "OutcomeKind", "RestartMode", "RestartPolicy")

RestartMode = Literal["always", "on-failure", "never"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the *n*-th consecutive restart: ``initial * multiplier**(n-1)``, capped, jittered."""

    initial: float = 0.5
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.1  # fraction of the delay, 0..1, spread evenly both ways

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before restart *attempt* (1-based). Never negative, never above ``maximum``."""
        if attempt < 1 or self.initial <= 0 or self.maximum <= 0:
            return 0.0
        exponent = attempt - 1
        # Compare in log space: multiplier**exponent overflows a float long before the cap matters.
        headroom = math.log(self.maximum) - math.log(self.initial)  # not log(max/initial): that can overflow
        if self.multiplier > 1 and exponent * math.log(self.multiplier) >= headroom:
            base = self.maximum
        else:
            base = min(self.initial * self.multiplier**exponent, self.maximum)
        jittered = base * (1.0 + self.jitter * (2.0 * rand() - 1.0))
        return min(max(jittered, 0.0), self.maximum)


class OutcomeKind(enum.StrEnum):
    CLEAN_EXIT = enum.auto()  # the child exited with code 0
    CRASHED = enum.auto()  # non-zero exit, killed by a signal, or its stdio broke
    START_FAILED = enum.auto()  # spawned, but no handshake within start_timeout
    PERMANENT = enum.auto()  # cannot ever start as configured: command not found, not executable
    STOPPED = enum.auto()  # stopped on request
    NEEDS_LOGIN = enum.auto()  # a remote server refused the run's credentials: waits for a person


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one run of the child ended."""

    kind: OutcomeKind
    uptime: float = 0.0  # seconds spent running (after the handshake); 0 if it never got there
    error: str | None = None
    exit: ExitStatus | None = None


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    mode: RestartMode = "on-failure"
    backoff: Backoff = Backoff()
    max_restarts: int | None = None  # consecutive failures allowed before giving up; None = never
    reset_after: float = 60.0  # a run this long resets the failure count

    def next_failures(self, outcome: Outcome, failures: int) -> int:
        """The consecutive-failure count after *outcome*: reset only by a run that stayed up."""
        if outcome.kind in (OutcomeKind.STOPPED, OutcomeKind.NEEDS_LOGIN):
            return failures
        ran = outcome.kind in (OutcomeKind.CLEAN_EXIT, OutcomeKind.CRASHED)
        if ran and outcome.uptime >= self.reset_after:
            return 0
        return failures + 1

    def should_restart(self, outcome: Outcome, failures: int) -> bool:
        """Whether to start again after *outcome*, given the count from :meth:`next_failures`."""
        if outcome.kind in (OutcomeKind.STOPPED, OutcomeKind.PERMANENT, OutcomeKind.NEEDS_LOGIN):
            return False
        if self.mode == "never":
            return False
        if self.mode == "on-failure" and outcome.kind is OutcomeKind.CLEAN_EXIT:
            return False
        return self.max_restarts is None or failures <= self.max_restarts

    def gave_up(self, outcome: Outcome, failures: int) -> bool:
        """Whether the end of the watcher means ``failed`` rather than ``stopped``."""
        if outcome.kind in (OutcomeKind.STOPPED, OutcomeKind.NEEDS_LOGIN):
            return False
        if outcome.kind is OutcomeKind.CLEAN_EXIT:
            # A clean exit under `always` only ends the watcher when the restart budget ran out.
            return self.mode == "always"
        return True
