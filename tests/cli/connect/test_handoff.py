"""connect's side of fd passing: which stdio it offers the daemon."""

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
