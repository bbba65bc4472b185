"""Client keys (autoApprove, timeout, disabled, ...): mapped where they mean something, else one warning."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from supervisor import cli
from supervisor.config import clientkeys
from supervisor.config import settings as config
from supervisor.config.settings import StdioConfig, ToolFilter
from supervisor.gateway.catalog import visible
from tests.harness import CLI, until, zygote
from tests.harness.daemon import START_WITHIN
from tests.harness.timing import patience


class TestFold:
    def test_disabled_becomes_autostart(self) -> None:
        """`disabled: true` is `autostart: false`, and nothing is reported as dropped."""
        assert clientkeys.fold({"command": "x", "disabled": True}) == (
            {"command": "x", "autostart": False},
            [],
        )

    @pytest.mark.parametrize(
        ("timeout", "seconds"),
        [(60, 60.0), (1, 1.0), (3600, 3600.0), (0.5, 0.5), (30000, 30.0), (600000, 600.0)],
    )
    def test_timeout_is_seconds_up_to_an_hour_then_milliseconds(self, timeout: float, seconds: float) -> None:
        """Cline and Roo Code give seconds (at most 3600); Gemini CLI milliseconds (30000 is 30 s)."""
        data, dropped = clientkeys.fold({"command": "x", "timeout": timeout})
        assert data["call_timeout"] == seconds
        assert dropped == []

    def test_a_long_timeout_raises_the_absolute_cap(self) -> None:
        """A 30-minute client timeout must not be cut at the default 600 s cap."""
        data, _ = clientkeys.fold({"command": "x", "timeout": 1800})
        assert data["call_timeout"] == data["call_timeout_max"] == 1800.0
        assert StdioConfig.model_validate({"command": "x", "timeout": 1800}).call_timeout_max == 1800.0

    @pytest.mark.parametrize("timeout", [0, -5, "60", True, None, math.inf, math.nan])
    def test_a_timeout_that_is_not_a_duration_is_dropped_not_an_error(self, timeout: object) -> None:
        """Never a failure: a timeout we cannot read is named among the dropped keys."""
        data, dropped = clientkeys.fold({"command": "x", "timeout": timeout})
        assert "call_timeout" not in data
        assert dropped == ["timeout"]

    def test_our_call_timeout_wins_over_the_client_timeout(self) -> None:
        data, dropped = clientkeys.fold({"command": "x", "timeout": 5, "call_timeout": 9})
        assert (data["call_timeout"], dropped) == (9, ["timeout"])

    def test_tool_lists_become_the_tool_filter_by_exact_name(self) -> None:
        """disabledTools/excludeTools deny, includeTools allows, those names; `*` in them stays literal."""
        data, _ = clientkeys.fold({"command": "x", "disabledTools": ["rm*", "drop"], "includeTools": ["a"]})
        tools = ToolFilter.model_validate(data["tools"])
        assert tools.deny == ["rm[*]", "drop"]
        assert tools.allow == ["a"]
        assert not visible("rm*", ["*"], tools.deny)
        assert not visible("drop", ["*"], tools.deny)
        assert visible("rmdir", ["*"], tools.deny)  # `rm*` was a name, not a pattern
        assert visible("a", tools.allow, []) and not visible("b", tools.allow, [])

    def test_ignored_keys_are_dropped_and_named(self) -> None:
        data, dropped = clientkeys.fold(
            {"command": "x", "autoApprove": ["a"], "alwaysAllow": [], "envFile": ".env", "watchPaths": []}
        )
        assert data == {"command": "x"}
        assert dropped == ["autoApprove", "alwaysAllow", "envFile", "watchPaths"]

    def test_transport_type_stdio_is_accepted_and_sse_refused(self) -> None:
        assert clientkeys.fold({"command": "x", "transportType": "stdio"}) == ({"command": "x"}, [])
        with pytest.raises(clientkeys.ClientKeyError, match="transportType 'sse'"):
            clientkeys.fold({"command": "x", "transportType": "sse"})

    def test_other_keys_stay_for_validation_to_judge(self) -> None:
        """A typo is not a client key: it stays, and the model reports it as an error."""
        assert clientkeys.fold({"command": "x", "restrat": "always"}) == (
            {"command": "x", "restrat": "always"},
            [],
        )
        with pytest.raises(ValidationError, match="restrat"):
            StdioConfig.model_validate({"command": "x", "restrat": "always"})


CLINE = {
    "mcpServers": {
        "everything": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-everything"],
            "transportType": "stdio",
            "timeout": 120,
            "autoApprove": ["echo"],
            "alwaysAllow": ["add"],
            "disabled": True,
        },
        "plain": {"command": "uvx", "args": ["mcp-server-time"]},
    }
}


class TestLoadingAClientFile:
    def test_a_cline_file_loads_with_its_keys_mapped(self, tmp_path: Path) -> None:
        path = tmp_path / "cline_mcp_settings.json"
        path.write_text(json.dumps(CLINE))
        settings = config.load(path, environ={})
        everything = settings.extensions["everything"]
        assert (everything.autostart, everything.call_timeout) == (False, 120.0)

    def test_one_warning_line_names_every_ignored_key_with_the_extension(self, tmp_path: Path) -> None:
        path = tmp_path / "cline_mcp_settings.json"
        path.write_text(json.dumps(CLINE))
        warnings: list[str] = []
        config.load(path, environ={}, warnings=warnings)
        assert warnings == [
            "extensions.everything: ignored autoApprove, alwaysAllow "
            "(client settings mcp-supervisor does not use)"
        ]

    def test_check_config_prints_the_warning_and_exits_0(self, tmp_path: Path) -> None:
        """The CLI as a process (forked as the suite's daemons are): exit 0, the config's summary
        on stdout, the warning on stderr."""
        path = tmp_path / "cline_mcp_settings.json"
        path.write_text(json.dumps(CLINE))
        result = zygote.run([*CLI, "check-config", str(path)], timeout=patience(30))
        assert result.returncode == cli.EXIT_OK, result.stderr
        assert result.stdout == f"{path}: OK (2 extensions: everything, plain)\n"
        assert result.stderr == (
            "mcp-supervisor: warning: extensions.everything: ignored autoApprove, alwaysAllow "
            "(client settings mcp-supervisor does not use)\n"
        )

    def test_remote_entries_of_every_client_load_as_remote_extensions(self, tmp_path: Path) -> None:
        """Windsurf's `serverUrl`, Gemini CLI's `httpUrl` and Cline's `transportType` spell what
        `url` and `type` say; `disabled` and `timeout` map as for a stdio entry."""
        path = tmp_path / "mcp_config.json"
        servers = {
            "c7": {"serverUrl": "https://mcp.context7.com/mcp", "disabled": True},
            "gem": {"httpUrl": "https://example.com/mcp", "timeout": 30000},
            "cline": {"url": "https://example.com/sse", "transportType": "sse"},
            "vscode": {"url": "https://example.com/mcp", "type": "streamable-http"},
        }
        path.write_text(json.dumps({"mcpServers": servers}))
        loaded = config.load(path, environ={}).extensions
        assert all(isinstance(entry, config.RemoteConfig) for entry in loaded.values())
        assert (loaded["c7"].url, loaded["c7"].type, loaded["c7"].autostart) == (
            servers["c7"]["serverUrl"],
            "auto",
            False,
        )
        assert (loaded["gem"].type, loaded["gem"].call_timeout) == ("http", 30.0)
        assert (loaded["cline"].type, loaded["vscode"].type) == ("sse", "http")


def test_the_daemon_logs_the_warning_when_it_loads_a_client_file(short_tmp: Path) -> None:
    """A daemon started on a Cline-style file runs, and says once which keys it ignored."""
    path = short_tmp / "cline_mcp_settings.json"
    sock = short_tmp / "control.sock"
    entry = {"command": "uvx", "disabled": True, "autoApprove": ["x"], "watchPaths": []}
    path.write_text(json.dumps({"socket": str(sock), "mcpServers": {"everything": entry}}))
    log = short_tmp / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "daemon", "-c", str(path)], stderr=out)
    try:
        until(lambda: "daemon.ready" in log.read_text() or daemon.poll() is not None, within=START_WITHIN)
        assert daemon.poll() is None, log.read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    warned = [e for e in events if e["event"] == "config.client_keys_ignored"]
    assert [(e["level"], e["detail"]) for e in warned] == [
        (
            "warning",
            "extensions.everything: ignored autoApprove, watchPaths "
            "(client settings mcp-supervisor does not use)",
        )
    ]
