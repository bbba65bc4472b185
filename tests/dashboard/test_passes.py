"""One-time codes and sessions (pure): once, for a while, and never more than their caps."""

from __future__ import annotations

from supervisor.dashboard.passes import (
    CODE_TTL,
    MAX_CODES,
    MAX_SESSIONS,
    SESSION_IDLE,
    SESSION_MAX,
    Passes,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_code_opens_one_session_once() -> None:
    passes = Passes()
    code = passes.issue(read_only=False)
    opened = passes.redeem(code)
    assert opened is not None
    secret, visit = opened
    assert not visit.read_only and passes.visit(secret) is visit
    assert passes.redeem(code) is None  # used
    assert passes.redeem("guess") is None and passes.visit("guess") is None and passes.visit(None) is None


def test_a_read_only_code_makes_a_read_only_session() -> None:
    passes = Passes()
    opened = passes.redeem(passes.issue(read_only=True))
    assert opened is not None and opened[1].read_only


def test_codes_expire() -> None:
    clock = Clock()
    passes = Passes(clock)
    code = passes.issue(read_only=False)
    clock.now += CODE_TTL + 1
    assert passes.redeem(code) is None


def test_sessions_end_when_idle_and_at_their_age_whatever_their_use() -> None:
    clock = Clock()
    passes = Passes(clock)
    idle = passes.redeem(passes.issue(read_only=False))
    used = passes.redeem(passes.issue(read_only=False))
    assert idle is not None and used is not None
    for _ in range(int(SESSION_MAX // (SESSION_IDLE / 2)) + 1):
        clock.now += SESSION_IDLE / 2
        if clock.now - 1000.0 <= SESSION_MAX:
            assert passes.visit(used[0]) is not None
    assert passes.visit(idle[0]) is None
    assert passes.visit(used[0]) is None  # past SESSION_MAX, however often it was used
    assert passes.counts == (0, 0)


def test_both_tables_are_bounded_oldest_out() -> None:
    passes = Passes()
    codes = [passes.issue(read_only=False) for _ in range(MAX_CODES + 5)]
    assert passes.counts[0] == MAX_CODES
    assert passes.redeem(codes[0]) is None and passes.redeem(codes[-1]) is not None
    secrets = []
    for _ in range(MAX_SESSIONS + 5):
        opened = passes.redeem(passes.issue(read_only=False))
        assert opened is not None
        secrets.append(opened[0])
    assert passes.counts[1] == MAX_SESSIONS
    assert passes.visit(secrets[0]) is None and passes.visit(secrets[-1]) is not None
