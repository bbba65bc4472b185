"""The last minutes of tool calls, per extension: how many, how many failed, and their latency.

For the dashboard's chart. Prometheus keeps totals since the start; a person asks "what is it
doing now". Each extension has at most :data:`BUCKETS` buckets of :data:`BUCKET` seconds, each
a count and a latency histogram of fixed, geometric bins (:data:`BINS` of them, 0.1 ms to
about 100 s, 25% apart), so memory is bounded whatever the traffic, and a percentile is read
within one bin's width (25%).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ("BINS", "BUCKET", "BUCKETS", "Recent")

BUCKET = 10.0  # seconds per bucket
BUCKETS = 30  # kept per extension: the last five minutes
_FLOOR = 1e-4  # the first bin's upper bound, in seconds
_GROWTH = 1.25
BINS = 62  # the last bin's upper bound is about 100 s; slower calls count in it


def _bin(seconds: float) -> int:
    if seconds <= _FLOOR:
        return 0
    return min(BINS - 1, math.ceil(math.log(seconds / _FLOOR, _GROWTH)))


def _upper(index: int) -> float:
    return _FLOOR * _GROWTH**index


@dataclass(slots=True)
class _Bucket:
    index: int  # monotonic time // BUCKET
    calls: int = 0
    errors: int = 0
    bins: list[int] = field(default_factory=lambda: [0] * BINS)

    def percentile(self, share: float) -> float | None:
        """The latency *share* of the calls took at most (seconds), or None without calls."""
        if not self.calls:
            return None
        wanted, seen = share * self.calls, 0
        for index, count in enumerate(self.bins):
            seen += count
            if seen >= wanted:
                return _upper(index)
        return _upper(BINS - 1)


class Recent:
    """The recent calls of every extension, bucketed (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, deque[_Bucket]] = {}

    def observe(self, extension: str, seconds: float, succeeded: bool) -> None:
        index = int(self._clock() // BUCKET)
        buckets = self._buckets.setdefault(extension, deque(maxlen=BUCKETS))
        if not buckets or buckets[-1].index != index:
            buckets.append(_Bucket(index))
        bucket = buckets[-1]
        bucket.calls += 1
        bucket.errors += not succeeded
        bucket.bins[_bin(seconds)] += 1

    def forget(self, extension: str) -> None:
        self._buckets.pop(extension, None)

    def series(self, extensions: list[str]) -> dict[str, Any]:
        """Per extension of *extensions*, one point per bucket of the window, oldest first:
        ``calls_per_s``, ``errors``, ``p50_ms`` and ``p99_ms`` (None without calls)."""
        now = int(self._clock() // BUCKET)
        out: dict[str, list[dict[str, Any]]] = {}
        for name in extensions:
            kept = {bucket.index: bucket for bucket in self._buckets.get(name, ())}
            points = []
            for index in range(now - BUCKETS + 1, now + 1):
                bucket = kept.get(index) or _Bucket(index)
                p50, p99 = bucket.percentile(0.5), bucket.percentile(0.99)
                points.append(
                    {
                        "calls_per_s": round(bucket.calls / BUCKET, 3),
                        "errors": bucket.errors,
                        "p50_ms": round(p50 * 1000, 3) if p50 is not None else None,
                        "p99_ms": round(p99 * 1000, 3) if p99 is not None else None,
                    }
                )
            out[name] = points
        return {"bucket_seconds": BUCKET, "extensions": out}
