"""Remote extensions' tests; :func:`entry` is the entry they share."""

from __future__ import annotations

from typing import Any

from tests.harness.timing import patience


def entry(url: str, **overrides: Any) -> dict[str, Any]:
    """A remote extension's entry for *url*, restarting fast and stopping soon (tests wait on it)."""
    settings = {
        "url": url,
        "backoff": {"initial": 0.1, "max": 0.5, "jitter": 0},
        "start_timeout": patience(10),
        "stop_timeout": 1,
    }
    return {**settings, **overrides}
