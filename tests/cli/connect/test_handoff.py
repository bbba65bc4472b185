"""connect's side of fd passing: which stdio it offers the daemon, and when it tries a switch again."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from supervisor.cli.connect import handoff


class TestEligible:
    """Which stdio connect offers the daemon: pipes and sockets, unless switched off."""

    def test_pipes_and_sockets_but_not_files(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        read_end, write_end = os.pipe()
        one, other = socket.socketpair()
        plain = (tmp_path / "file").open("w+b")
        try:
            assert handoff.eligible(read_end, write_end)
            assert handoff.eligible(one.fileno(), other.fileno())
            assert not handoff.eligible(plain.fileno(), write_end)
            assert not handoff.eligible(read_end, plain.fileno())
            monkeypatch.setenv("MCP_SUPERVISOR_HANDOFF", "0")
            assert not handoff.eligible(read_end, write_end)
        finally:
            for fd in (read_end, write_end):
                os.close(fd)
            one.close()
            other.close()
            plain.close()


class TestSwitchTries:
    """When connect tries a switch on a live link again, after one failed."""

    def test_a_failure_that_may_pass_backs_off_doubling_up_to_a_minute(self) -> None:
        tries = handoff.SwitchTries()
        assert tries.ready() and tries.due() is None
        delays = [tries.failed() for _ in range(10)]
        for failures, delay in enumerate(delays):
            base = min(2.0**failures, 60.0)  # 1, 2, 4 ... 32, then 60 s
            assert 0.9 * base <= delay <= min(1.1 * base, 60.0)
        due = tries.due()
        assert not tries.ready() and due is not None and 0 < due <= 60
        tries.reset()  # a switch that worked, or a new daemon
        assert tries.ready() and tries.due() is None and tries.failures == 0

    def test_a_daemon_that_never_can_is_not_asked_again_until_a_new_one(self) -> None:
        tries = handoff.SwitchTries()
        tries.never()
        assert not tries.ready() and tries.due() is None  # no timer: nothing to wait for
        tries.reset()
        assert tries.ready()
