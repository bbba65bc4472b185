"""One factor for the suite's deadlines, read from the environment: ``SUPERVISOR_TEST_SLOWDOWN``.

Every deadline in the suite bounds a hang; none measures speed (``bench/`` does). They are set
to hold on a loaded 2-core machine (``make test-loaded``); a slower one (an emulator, a
sanitizer build, a crowded CI host) multiplies them all by this factor, e.g.
``SUPERVISOR_TEST_SLOWDOWN=3 make test``. The pytest-timeout of each test is scaled alike
(tests/conftest.py). Windows in which nothing must happen (``move_on_after``) are not scaled:
a longer window proves no more.
"""

from __future__ import annotations

import math
import os
from contextlib import AbstractContextManager

import anyio

__all__ = ("SLOWDOWN", "fail_after", "patience")


def _factor(text: str | None) -> float:
    try:
        value = float(text) if text else 1.0
    except ValueError:
        raise SystemExit(f"SUPERVISOR_TEST_SLOWDOWN must be a number, not {text!r}") from None
    if not math.isfinite(value) or value < 1:
        raise SystemExit(f"SUPERVISOR_TEST_SLOWDOWN must be 1 or more, not {text!r}")
    return value


SLOWDOWN = _factor(os.environ.get("SUPERVISOR_TEST_SLOWDOWN"))


def patience(seconds: float) -> float:
    """*seconds*, scaled for this machine: the deadline to give a wait that bounds a hang."""
    return seconds * SLOWDOWN


def fail_after(seconds: float) -> AbstractContextManager[anyio.CancelScope]:
    """``anyio.fail_after`` with the deadline scaled by :data:`SLOWDOWN`."""
    return anyio.fail_after(patience(seconds))
