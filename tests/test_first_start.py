"""A wrapper's first start (npx -y, uvx): the daemon waits for it and says what it waits for."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.state import SHOWN_LINE_CAP, one_line

from .conftest import extension_settings
from .test_daemon import Daemon, daemons, until  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)


class TestSlowFirstStart:
    def test_a_child_writing_progress_is_waited_for_and_status_says_why(
        self,
        daemons: Callable[..., Daemon],  # noqa: F811
        short_tmp: Path,
    ) -> None:
        """No deadline shorter than start_timeout ends a start; status shows the request and stderr."""
        gates = short_tmp / "gates"  # not the socket directory itself: the sandbox hides that
        gates.mkdir()
        gate = gates / "gate"
        settings = extension_settings(
            "slow_start.py",
            env={"SLOW_START_GATE": str(gate)},
            start_timeout=20,
            call_timeout=0.5,
            sandbox={"read": [str(gates)]},  # it watches for the gate there
        )
        started = time.monotonic()
        daemon = daemons({"slow": settings})

        def waiting() -> bool:
            record = daemon.status()["slow"]
            assert record["state"] == "starting", record  # never given up on, never restarted
            return record["waiting"] == "initialize" and bool(record["last_stderr"])

        until(waiting)
        record = daemon.status()["slow"]
        assert record["last_stderr"].startswith("downloading ")  # the colours and the \r are gone
        assert "\x1b" not in record["last_stderr"] and record["pid"]
        table = daemon.cli("status", "slow").stdout
        assert "waiting" in table and "for initialize; stderr: downloading " in table, table

        # Past every shorter limit (call_timeout, the stdin stall limit, 2 s), still starting.
        until(lambda: waiting() and time.monotonic() - started > 2.5)
        gate.touch()
        running = daemon.wait_state("slow", "running")
        assert running["restarts"] == 0 and running["waiting"] is None
        assert running["last_stderr"] == "slow_start: ready"
        called = daemon.cli("call", "slow", "echo", "--args", '{"text": "ok"}')
        assert (called.returncode, called.stdout.strip()) == (0, "ok")
        assert daemon.terminate() == 0

    def test_start_timeout_still_ends_it_and_names_the_request(
        self,
        daemons: Callable[..., Daemon],  # noqa: F811
        short_tmp: Path,
    ) -> None:
        """Progress on stderr does not extend start_timeout: the error names what was unanswered."""
        settings = extension_settings(
            "slow_start.py",
            env={"SLOW_START_GATE": str(short_tmp / "never")},
            start_timeout=1,
            restart="never",
        )
        daemon = daemons({"slow": settings})
        failed = daemon.wait_state("slow", "failed")
        assert failed["last_error"] == "no MCP handshake within 1s (no answer to initialize)"
        assert failed["last_stderr"].startswith("downloading ")
        assert daemon.terminate() == 0


class TestOneLine:
    def test_escapes_controls_and_length(self) -> None:
        """What a child wrote is shown without escapes, control or bidi characters, and bounded."""
        assert one_line("\x1b[1;33mnpm warn\x1b[0m\texec\r") == "npm warn exec"
        assert one_line("\x1b]0;title\x07ok \u202eevil\x00") == "ok evil"
        long = one_line("x" * 100_000)
        assert len(long) == SHOWN_LINE_CAP and long.endswith("…")
