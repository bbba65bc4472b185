"""Tests for supervisor.logs: what a logged exception may show."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from supervisor import logs

SECRET = "hunter2-do-not-log-me"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """logs.configure() sets process-wide state: put structlog and the root logger back afterwards."""
    saved_config = structlog.get_config()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    yield
    structlog.configure(**saved_config)
    root.handlers[:], root.level = saved_handlers, saved_level


def spawn_with(env: dict[str, str]) -> None:
    secret = env["TOKEN"]  # a local holding a secret, as process.spawn's `env` does
    raise RuntimeError(f"spawn failed after {len(secret)} characters")


def log_a_crash(stream: io.StringIO, *, json_lines: bool, stdlib: bool = False) -> str:
    logs.configure(json=json_lines, stream=stream)
    try:
        spawn_with({"TOKEN": SECRET})
    except RuntimeError:
        if stdlib:
            logging.getLogger("mcp.client").exception("the SDK saw a crash")
        else:
            structlog.get_logger("supervisor.extension").exception("extension.watcher_crashed")
    return stream.getvalue()


class TestNoLocals:
    @pytest.mark.parametrize("json_lines", [True, False], ids=["json", "console"])
    @pytest.mark.parametrize("stdlib", [False, True], ids=["structlog", "stdlib"])
    def test_a_logged_exception_shows_no_frame_locals(self, json_lines: bool, stdlib: bool) -> None:
        """The traceback is logged (frames, message) but not the values of local variables."""
        output = log_a_crash(io.StringIO(), json_lines=json_lines, stdlib=stdlib)
        assert "spawn_with" in output and "spawn failed after" in output  # the traceback is there
        assert SECRET not in output

    def test_json_traceback_is_structured(self) -> None:
        """JSON mode still gives a structured exception (frames with file, line and function)."""
        output = log_a_crash(io.StringIO(), json_lines=True)
        event = json.loads(output.splitlines()[-1])
        frames = event["exception"][0]["frames"]
        assert any(frame["name"] == "spawn_with" for frame in frames)
        assert all("locals" not in frame or not frame["locals"] for frame in frames)

    def test_console_uses_the_plain_formatter_whatever_is_installed(self) -> None:
        """rich or better-exceptions would print locals; the console renderer never picks them."""
        logs.configure(json=False, stream=io.StringIO())
        renderer = structlog.get_config()["processors"][-1]
        assert isinstance(renderer, structlog.dev.ConsoleRenderer)
        assert renderer._exception_formatter is structlog.dev.plain_traceback


class TestFormat:
    """The daemon writes readable lines on a terminal, JSON lines elsewhere, or what it is asked."""

    @staticmethod
    def first_line(tmp_path: Path, *flags: str) -> str:
        """The daemon's first log line, its stderr a terminal (a pty)."""
        directory = Path(tempfile.mkdtemp(prefix="mcps-", dir="/tmp"))
        try:
            config = directory / "config.json"
            config.write_text(json.dumps({"socket": str(directory / "control.sock"), "extensions": {}}))
            leader, follower = pty.openpty()
            argv = [sys.executable, "-m", "supervisor", "daemon", "-c", str(config), *flags]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
            os.close(follower)
            try:
                line = b""
                with open(leader, "rb", buffering=0) as terminal:
                    while not line.endswith(b"\n"):
                        ready, _, _ = select.select([terminal], [], [], 20)
                        assert ready, "the daemon wrote nothing"
                        line += terminal.read(1)
            finally:
                proc.terminate()
                proc.wait(timeout=20)
            return line.decode().strip()
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_a_terminal_gets_readable_lines(self, tmp_path: Path) -> None:
        line = self.first_line(tmp_path)
        assert not line.startswith("{") and "daemon.starting" in line, line

    def test_json_when_asked_even_on_a_terminal(self, tmp_path: Path) -> None:
        assert json.loads(self.first_line(tmp_path, "--log-format", "json"))["event"] == "daemon.starting"
