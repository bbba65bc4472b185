"""The command line: ``main()`` in-process against a real control server and an in-memory backend."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import structlog
from structlog.testing import capture_logs

from supervisor import cli
from supervisor.config import settings as config
from supervisor.control import server as control
from supervisor.extension.state import ExitStatus, Snapshot, State
from tests.harness import FakeBackend
from tests.harness.timing import fail_after

WAIT = 10  # seconds any single step may take


@pytest.fixture(autouse=True)
def quiet_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keep the in-process server's log lines out of the captured stdout."""
    with capture_logs():
        monkeypatch.setattr(control, "log", structlog.get_logger(control.__name__))
        yield


def four_states() -> FakeBackend:
    """Four extensions, one in each interesting state; alpha's echo answers its text as is."""
    now = datetime.now(UTC)
    snapshots = {
        "alpha": Snapshot(
            "alpha",
            State.RUNNING,
            now - timedelta(seconds=3725),
            pid=4242,
            restarts=1,
            tools=2,
            in_flight=1,
        ),
        "beta": Snapshot(
            "beta",
            State.BACKOFF,
            now,
            restarts=3,
            failures=3,
            last_exit=ExitStatus(3),
            next_restart=now + timedelta(seconds=30),
        ),
        "gamma": Snapshot("gamma", State.FAILED, now, restarts=5, last_error="command not found: nope"),
        "delta": Snapshot("delta", State.STOPPED, now, last_exit=ExitStatus(-signal.SIGKILL)),
    }
    schema = {"type": "object"}
    tools = [
        (
            "alpha",
            types.Tool(name="echo", description="Echo the text back.\nMore detail.", input_schema=schema),
        ),
        ("alpha", types.Tool(name="wordy", description="word " * 100, input_schema=schema)),
        ("beta", types.Tool(name="bare", input_schema=schema)),
    ]
    answers = {"echo": _echo_text, "media": _media, "structured": _structured, "fail": _fail}
    return FakeBackend(snapshots, tools, answers, log_line=None)


def _echo_text(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=str(arguments.get("text", "")))])


def _media(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[
            types.ImageContent(data="A" * 16, mime_type="image/png"),
            types.AudioContent(data="B" * 8, mime_type="audio/wav"),
            types.ResourceLink(
                uri="file:///spool/big.png", name="big.png", mime_type="image/png", size=5_243_006
            ),
            types.EmbeddedResource(
                resource=types.TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="abc")
            ),
        ],
        structured_content={"hidden": False},
    )


def _structured(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[], structured_content={"ok": True, "n": 3})


def _fail(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text="bad input")], is_error=True)


@asynccontextmanager
async def serving(short_tmp: Path, backend: FakeBackend | None = None) -> AsyncIterator[str]:
    """Run a control server for the block; yield its socket path."""
    path = str(short_tmp / "control.sock")
    async with anyio.create_task_group() as tg:
        with fail_after(WAIT):
            await tg.start(partial(control.serve, backend or four_states(), path))
        yield path
        tg.cancel_scope.cancel()


async def run(*argv: str) -> int:
    """``main(argv)`` in a worker thread, so the server keeps running in this event loop."""
    with fail_after(WAIT):
        return await anyio.to_thread.run_sync(cli.main, list(argv))


@pytest.mark.anyio
class TestStatus:
    async def test_table(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """status prints one aligned row per extension with the most useful detail last."""
        async with serving(short_tmp) as path:
            code = await run("status", "--socket", path)
        out = capsys.readouterr().out.splitlines()
        assert code == cli.EXIT_OK
        assert out[0].split() == ["NAME", "STATE", "PID", "UPTIME", "RESTARTS", "TOOLS", "DETAIL"]
        assert out[1].split() == [
            "alpha",
            "running",
            "4242",
            "1h",
            "2m",
            "1",
            "2",
            "1",
            "call",
            "in",
            "flight",
        ]
        assert re.fullmatch(
            r"beta +backoff +- +- +3 +0 +restart in \d+\.\ds \(attempt 3\); exited with code 3", out[2]
        )
        assert re.fullmatch(r"gamma +failed +- +- +5 +0 +command not found: nope", out[3])
        assert re.fullmatch(r"delta +stopped +- +- +0 +0 +killed by SIGKILL", out[4])
        column = out[0].index("STATE")
        assert [line[column:].split()[0] for line in out[1:]] == ["running", "backoff", "failed", "stopped"]

    async def test_json(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """status --json prints the daemon's records unchanged."""
        backend = four_states()
        async with serving(short_tmp, backend) as path:
            code = await run("status", "--json", "--socket", path)
        assert code == cli.EXIT_OK
        assert json.loads(capsys.readouterr().out) == {
            "extensions": [
                {**snapshot.as_dict(), "name_collisions": [], "tools_changed": []}
                for snapshot in backend.snapshots.values()
            ],
            "profiles": [],
        }

    async def test_one_extension(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """status NAME prints the header and that extension only."""
        async with serving(short_tmp) as path:
            code = await run("status", "gamma", "--socket", path)
        lines = capsys.readouterr().out.splitlines()
        assert code == cli.EXIT_OK
        assert [line.split()[0] for line in lines] == ["NAME", "gamma"]

    async def test_unknown_extension(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown name fails with the daemon's sentence and exit 1."""
        async with serving(short_tmp) as path:
            code = await run("status", "nope", "--socket", path)
        captured = capsys.readouterr()
        assert code == cli.EXIT_FAILED
        assert captured.err == "mcp-supervisor: no extension named 'nope' is configured\n"
        assert captured.out == ""

    async def test_the_socket_may_come_before_the_command(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`mcp-supervisor --socket PATH status`, as supervisorctl -s and docker -H; after it wins."""
        async with serving(short_tmp) as path:
            assert await run("--socket", path, "status") == cli.EXIT_OK
            assert capsys.readouterr().out.startswith("NAME")
            assert await run("--socket", "/nowhere.sock", "status", "--socket", path) == cli.EXIT_OK
            assert await run("--socket", "/nowhere.sock", "status") == cli.EXIT_UNREACHABLE

    async def test_the_socket_comes_from_the_environment(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without --socket, MCP_SUPERVISOR_SOCKET names the socket."""
        async with serving(short_tmp) as path:
            monkeypatch.setenv("MCP_SUPERVISOR_SOCKET", path)
            code = await run("status")
        assert code == cli.EXIT_OK
        assert capsys.readouterr().out.startswith("NAME")


@pytest.mark.anyio
class TestActions:
    async def test_start_prints_the_new_status(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """start NAME waits by default and prints the resulting status row."""
        backend = four_states()
        async with serving(short_tmp, backend) as path:
            code = await run("start", "delta", "--socket", path)
        out = capsys.readouterr().out.splitlines()
        assert code == cli.EXIT_OK
        assert out[1].split()[:3] == ["delta", "running", "5000"]
        assert backend.actions == [("start", "delta", True)]

    async def test_a_failed_start_exits_1_with_the_reason(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A start ending anything but running exits 1 and says why."""
        async with serving(short_tmp) as path:
            code = await run("start", "gamma", "--socket", path)
        captured = capsys.readouterr()
        assert code == cli.EXIT_FAILED
        assert captured.err == "mcp-supervisor: extension 'gamma' failed to start: command not found: nope\n"
        assert "gamma" in captured.out

    async def test_no_wait(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--no-wait sends wait=false and a transitional state is not a failure."""
        backend = four_states()
        async with serving(short_tmp, backend) as path:
            code = await run("stop", "alpha", "--no-wait", "--socket", path)
        assert code == cli.EXIT_OK
        assert backend.actions == [("stop", "alpha", False)]
        assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["alpha", "stopping"]

    async def test_all(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """restart --all acts on every extension, prints each row in order, and exits 1 if any failed."""
        backend = four_states()
        async with serving(short_tmp, backend) as path:
            code = await run("restart", "--all", "--socket", path)
        captured = capsys.readouterr()
        assert code == cli.EXIT_FAILED
        assert [line.split()[0] for line in captured.out.splitlines()] == [
            "NAME",
            "alpha",
            "beta",
            "gamma",
            "delta",
        ]
        assert (
            captured.err == "mcp-supervisor: extension 'gamma' failed to restart: command not found: nope\n"
        )
        assert sorted(backend.actions) == [("restart", n, True) for n in ("alpha", "beta", "delta", "gamma")]

    async def test_unknown_extension(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Acting on an unknown extension exits 1 with the daemon's sentence."""
        async with serving(short_tmp) as path:
            code = await run("stop", "nope", "--socket", path)
        assert code == cli.EXIT_FAILED
        assert capsys.readouterr().err == "mcp-supervisor: no extension named 'nope' is configured\n"


@pytest.mark.anyio
class TestTools:
    async def test_table(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """tools prints extension, tool, gateway name and the first description line, cut to the width."""
        monkeypatch.setenv("COLUMNS", "80")
        async with serving(short_tmp) as path:
            code = await run("tools", "--socket", path)
        out = capsys.readouterr().out.splitlines()
        assert code == cli.EXIT_OK
        assert out[0].split() == ["EXTENSION", "TOOL", "GATEWAY", "NAME", "DESCRIPTION"]
        assert out[1].split() == ["alpha", "echo", "alpha__echo", "Echo", "the", "text", "back."]
        assert out[2].startswith("alpha      wordy  alpha__wordy  word word")
        assert out[2].endswith("…")
        assert len(out[2]) == 80
        assert out[3].split() == ["beta", "bare", "beta__bare"]

    async def test_json(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """tools NAME --json prints the daemon's records."""
        async with serving(short_tmp) as path:
            code = await run("tools", "beta", "--json", "--socket", path)
        assert code == cli.EXIT_OK
        assert json.loads(capsys.readouterr().out) == {
            "tools": [
                {
                    "extension": "beta",
                    "exposed": "beta__bare",
                    "collision": None,
                    "changed": None,
                    "name": "bare",
                    "inputSchema": {"type": "object"},
                }
            ]
        }


@pytest.mark.anyio
class TestCall:
    async def test_text(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """call prints text content as is and passes --args as the arguments."""
        backend = four_states()
        async with serving(short_tmp, backend) as path:
            code = await run("call", "alpha", "echo", "--args", '{"text": "hello\\nworld"}', "--socket", path)
        assert code == cli.EXIT_OK
        assert capsys.readouterr().out == "hello\nworld\n"
        assert backend.calls == [("alpha", "echo", {"text": "hello\nworld"})]

    async def test_other_content_is_one_line_each(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Images, audio, links and embedded resources print as one descriptive line each."""
        async with serving(short_tmp) as path:
            code = await run("call", "alpha", "media", "--socket", path)
        assert code == cli.EXIT_OK
        assert capsys.readouterr().out.splitlines() == [
            "[image image/png, 16 bytes base64]",
            "[audio audio/wav, 8 bytes base64]",
            "[resource_link file:///spool/big.png image/png 5.0 MiB]",
            "[resource file:///a.txt text/plain, 3 characters]",
            "{",
            '  "hidden": false',
            "}",
        ]

    async def test_structured_content(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """structuredContent prints as indented JSON when there is no text."""
        async with serving(short_tmp) as path:
            code = await run("call", "alpha", "structured", "--socket", path)
        assert code == cli.EXIT_OK
        assert json.loads(capsys.readouterr().out) == {"ok": True, "n": 3}

    async def test_a_tool_error_exits_1(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """isError prints the content to stderr and exits 1."""
        async with serving(short_tmp) as path:
            code = await run("call", "alpha", "fail", "--socket", path)
        captured = capsys.readouterr()
        assert code == cli.EXIT_FAILED
        assert captured.out == ""
        assert captured.err == "mcp-supervisor: tool 'fail' of 'alpha' reported an error: bad input\n"

    async def test_json(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """call --json prints the wire result (and still exits 1 on isError)."""
        async with serving(short_tmp) as path:
            code = await run("call", "alpha", "fail", "--json", "--socket", path)
        assert code == cli.EXIT_FAILED
        assert json.loads(capsys.readouterr().out) == {
            "content": [{"type": "text", "text": "bad input"}],
            "isError": True,
        }

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ("[1, 2]", "--args must be a JSON object such as '{\"text\": \"hi\"}', not '[1, 2]'"),
            ("{text: hi}", "--args is not valid JSON (Expecting property name enclosed in double quotes: "),
        ],
    )
    def test_bad_args_exit_2_before_connecting(
        self, capsys: pytest.CaptureFixture[str], args: str, message: str
    ) -> None:
        """--args that is not a JSON object is a usage error, even with no daemon around."""
        code = cli.main(["call", "alpha", "echo", "--args", args, "--socket", "/nonexistent/control.sock"])
        err = capsys.readouterr().err
        assert code == cli.EXIT_USAGE
        assert err.startswith(f"mcp-supervisor: {message}")
        assert err.count("\n") == 1


@pytest.mark.anyio
class TestLogs:
    async def test_lines(self, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """logs NAME -n N prints the last N lines."""
        async with serving(short_tmp) as path:
            code = await run("logs", "alpha", "-n", "3", "--socket", path)
        assert code == cli.EXIT_OK
        assert capsys.readouterr().out == "line 0\nline 1\nline 2\n"

    def test_a_bad_count_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """-n outside 1..10000 exits 2."""
        assert cli.main(["logs", "alpha", "-n", "0"]) == cli.EXIT_USAGE
        message = "argument -n/--lines: must be between 1 and 10000 (see 'mcp-supervisor logs --help')"
        assert capsys.readouterr().err == f"mcp-supervisor: {message}\n"


class TestNoDaemon:
    @pytest.mark.parametrize(
        "argv", [["status"], ["start", "x"], ["tools"], ["call", "x", "y"], ["logs", "x"]]
    )
    def test_exit_3_with_the_socket_named(
        self, short_tmp: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
    ) -> None:
        """With no daemon on the socket every client command exits 3 with one sentence."""
        path = str(short_tmp / "control.sock")
        code = cli.main([*argv, "--socket", path])
        captured = capsys.readouterr()
        assert code == cli.EXIT_UNREACHABLE
        assert captured.err == f"mcp-supervisor: no daemon is listening on {path}\n"
        assert captured.out == ""


class TestUsage:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            ([], "the following arguments are required: COMMAND (see 'mcp-supervisor --help')"),
            (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
            (["start"], "give either NAME or --all (see 'mcp-supervisor start --help')"),
            (["stop", "x", "--all"], "give either NAME or --all (see 'mcp-supervisor stop --help')"),
            (["status", "--bogus"], "unrecognized arguments: --bogus"),
        ],
    )
    def test_usage_errors_exit_2(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        """A bad command line is one sentence on stderr and exit 2."""
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == cli.EXIT_USAGE
        assert err.startswith(f"mcp-supervisor: {message}")
        assert err.count("\n") == 1

    def test_help_exits_0(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--help prints the commands and exits 0."""
        assert cli.main(["--help"]) == cli.EXIT_OK
        out = capsys.readouterr().out
        for command in (
            "daemon",
            "status",
            "start",
            "stop",
            "restart",
            "tools",
            "call",
            "logs",
            "check-config",
        ):
            assert command in out


class TestCheckConfig:
    def test_ok(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A valid file prints 'CONFIG: OK (N extensions: ...)' and exits 0."""
        path = tmp_path / "config.yaml"
        path.write_text(
            "extensions:\n  time: {command: uvx, args: [mcp-server-time]}\n  notes: {command: notes}\n"
        )
        assert cli.main(["check-config", str(path)]) == cli.EXIT_OK
        assert capsys.readouterr().out == f"{path}: OK (2 extensions: time, notes)\n"

    def test_without_a_file_it_checks_the_daemons(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No CONFIG: the one `daemon` would read ($MCP_SUPERVISOR_CONFIG), so a hint naming only
        `check-config --explain NAME` works."""
        path = tmp_path / "config.yaml"
        path.write_text("extensions:\n  notes: {command: notes}\n")
        monkeypatch.setenv("MCP_SUPERVISOR_CONFIG", str(path))
        assert cli.main(["check-config"]) == cli.EXIT_OK
        assert capsys.readouterr().out == f"{path}: OK (1 extension: notes)\n"

    def test_every_error_is_printed(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An invalid file exits 2 and prints every problem config.load found."""
        path = tmp_path / "config.yaml"
        path.write_text(
            "extensions:\n  time: {command: uvx, restart: sometimes}\n  bad: {args: []}\nbogus: 1\n"
        )
        with pytest.raises(config.ConfigError) as caught:
            config.load(str(path))
        assert len(caught.value.errors) >= 3
        assert cli.main(["check-config", str(path)]) == cli.EXIT_USAGE
        err = capsys.readouterr().err.splitlines()
        assert err[0] == f"mcp-supervisor: {path} is not valid:"
        assert err[1:] == [f"  {line}" for line in caught.value.errors]

    def test_a_missing_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing file is one sentence naming it, exit 2."""
        path = tmp_path / "nope.yaml"
        assert cli.main(["check-config", str(path)]) == cli.EXIT_USAGE
        assert capsys.readouterr().err == f"mcp-supervisor: {path}: No such file or directory\n"


class TestDaemon:
    def test_a_bad_config_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """daemon with an unusable config exits 2 before starting anything."""
        assert cli.main(["daemon", "-c", str(tmp_path / "nope.yaml")]) == cli.EXIT_USAGE
        assert (
            capsys.readouterr().err
            == f"mcp-supervisor: {tmp_path / 'nope.yaml'}: No such file or directory\n"
        )

    def test_runs_until_sigterm(self, short_tmp: Path, tmp_path: Path) -> None:
        """daemon --socket serves the control socket and exits 0 on SIGTERM."""
        path = tmp_path / "config.yaml"
        path.write_text("extensions: {}\n")
        socket_path = str(short_tmp / "run" / "control.sock")
        argv = [sys.executable, "-m", "supervisor.cli", "daemon", "-c", str(path), "--socket", socket_path]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as daemon:
            try:
                status = _poll(lambda: cli.main(["status", "--socket", socket_path]))
                assert status == cli.EXIT_OK
            finally:
                daemon.send_signal(signal.SIGTERM)
                _, err = daemon.communicate(timeout=WAIT)
        assert daemon.returncode == 0, err.decode()
        assert not os.path.exists(socket_path)


def _poll(attempt: Any) -> int:
    """Call *attempt* until it stops answering 'unreachable', within WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while (code := attempt()) == cli.EXIT_UNREACHABLE and time.monotonic() < deadline:
        time.sleep(0.05)
    return code
