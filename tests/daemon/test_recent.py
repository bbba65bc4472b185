"""The last minutes of calls (pure): bounded buckets, percentiles within a bin, old buckets gone."""

from __future__ import annotations

from supervisor.daemon.recent import BUCKET, BUCKETS, Recent


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def test_percentiles_fall_within_a_bin_of_the_truth() -> None:
    clock = Clock()
    recent = Recent(clock)
    for i in range(1, 1001):  # 1 ms .. 1 s, evenly
        recent.observe("ext", i / 1000, succeeded=i % 100 != 0)
    last = recent.series(["ext"])["extensions"]["ext"][-1]
    assert last["calls_per_s"] == 1000 / BUCKET and last["errors"] == 10
    assert 500 <= last["p50_ms"] <= 500 * 1.25
    assert 990 <= last["p99_ms"] <= 990 * 1.25


def test_the_window_is_bounded_whatever_the_traffic() -> None:
    clock = Clock()
    recent = Recent(clock)
    for _ in range(3 * BUCKETS):  # fifteen minutes of calls, one bucket at a time
        for _ in range(100):
            recent.observe("ext", 0.002, succeeded=True)
        clock.now += BUCKET
    assert all(len(kept) <= BUCKETS for kept in recent._buckets.values())
    points = recent.series(["ext", "never"])["extensions"]
    assert len(points["ext"]) == BUCKETS and points["ext"][-1]["calls_per_s"] == 0  # the bucket of now
    assert points["ext"][0]["calls_per_s"] == 10.0
    assert all(p["calls_per_s"] == 0 and p["p50_ms"] is None for p in points["never"])


def test_a_quiet_extension_s_old_buckets_leave_the_window() -> None:
    clock = Clock()
    recent = Recent(clock)
    recent.observe("ext", 0.5, succeeded=True)
    clock.now += BUCKET * BUCKETS
    assert all(p["calls_per_s"] == 0 for p in recent.series(["ext"])["extensions"]["ext"])
    recent.forget("ext")
    assert not recent._buckets
