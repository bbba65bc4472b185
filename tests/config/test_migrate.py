"""``mcp-supervisor import`` and ``client-config`` as users run them: the console script, real files,
and once a real daemon plus a real MCP client through the rewritten client entry."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.harness import CLI, DATA, ROOT, SERVERS, Daemon, until, zygote
from tests.harness.timing import fail_after, patience

SAMPLES = DATA / "clientconfigs"
README = ROOT / "README.md"
SCRIPT = str(Path(sys.executable).parent / "mcp-supervisor")  # what the connect entry names
BACKUP = re.compile(r"\.bak-\d{8}-\d{6}$")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "MCP_SUPERVISOR_SOCKET"}
    return zygote.run([*CLI, *args], timeout=patience(60), env={**environ, **(env or {})})


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A copy of the sample client files, and a config with a socket of its own."""
    shutil.copytree(SAMPLES, tmp_path / "clients")
    (tmp_path / "config.yaml").write_text(
        f"# my daemon\nsocket: {tmp_path / 'run' / 'control.sock'}  # a socket of its own\n"
        "extensions:\n  clock:\n    command: mcp-supervisor-demo   # the demo\n    args: [clock]\n"
        "\n# the end\nshutdown_timeout: 10\n"
    )
    return tmp_path


class TestImport:
    def test_the_written_config_passes_check_config(self, work: Path) -> None:
        """Every stdio server of a Claude Desktop file lands in the config, which check-config accepts."""
        config = work / "new" / "config.yaml"  # no file, no directory yet
        result = run("import", str(work / "clients" / "claude_desktop_config.json"), "-c", str(config))
        assert result.returncode == 0, result.stderr
        assert (
            "imported github: npx -y @modelcontextprotocol/server-github\n  sandbox: the default"
            in result.stdout
        )
        assert "  sandbox: may write /Users/me/Desktop, /Users/me/Downloads" in result.stdout  # filesystem's
        assert f"wrote {config}\n" in result.stdout
        assert stat.S_IMODE(config.stat().st_mode) == 0o600  # env values may be secrets
        check = run("check-config", str(config))
        assert check.returncode == 0, check.stderr
        assert check.stdout == f"{config}: OK (3 extensions: filesystem, github, brave-search)\n"

    def test_merge_keeps_the_config_content_order_and_comments(self, work: Path) -> None:
        before = (work / "config.yaml").read_text().splitlines()
        result = run(
            "import", str(work / "clients" / "cline_mcp_settings.json"), "-c", str(work / "config.yaml")
        )
        assert result.returncode == 0, result.stderr
        after = (work / "config.yaml").read_text().splitlines()
        lines = iter(after)
        assert all(line in lines for line in before), after  # every old line, in the same order
        check = run("check-config", str(work / "config.yaml"))
        assert check.stdout.endswith("OK (3 extensions: clock, everything, remote)\n"), check.stderr

    def test_a_taken_name_is_refused_without_force_and_nothing_changes(self, work: Path) -> None:
        client = work / "clients" / "windsurf_mcp_config.json"
        assert run("import", str(client), "-c", str(work / "config.yaml")).returncode == 0
        config_before, client_before = (work / "config.yaml").read_bytes(), client.read_bytes()
        again = run("import", str(client), "-c", str(work / "config.yaml"), "--rewrite-client")
        assert again.returncode == 1
        assert again.stderr == (
            "mcp-supervisor: 'memory', 'context7' already configured: give --force to replace them "
            "(nothing was written)\n"
        )
        assert (work / "config.yaml").read_bytes() == config_before
        assert client.read_bytes() == client_before
        assert not list(client.parent.glob("*.bak-*"))
        forced = run("import", str(client), "-c", str(work / "config.yaml"), "--force")
        assert forced.returncode == 0, forced.stderr
        assert "replaced memory: npx -y @modelcontextprotocol/server-memory\n" in forced.stdout
        assert (work / "config.yaml").read_text().count("memory:") == 1

    def test_dry_run_writes_nothing(self, work: Path) -> None:
        client = work / "clients" / "claude_desktop_config.json"
        before = client.read_bytes()
        result = run("import", str(client), "-c", str(work / "none.yaml"), "--rewrite-client", "--dry-run")
        assert result.returncode == 0, result.stderr
        assert "dry run:" in result.stdout
        assert not (work / "none.yaml").exists()
        assert client.read_bytes() == before

    def test_a_config_that_would_not_load_is_not_written(self, work: Path) -> None:
        """The merged text is loaded as the daemon would before it replaces the file: exit 2, untouched."""
        (work / "config.yaml").write_text("extensions:\n  clock:\n    command: x\n    restart: sometimes\n")
        before = (work / "config.yaml").read_bytes()
        result = run(
            "import", str(work / "clients" / "cline_mcp_settings.json"), "-c", str(work / "config.yaml")
        )
        assert result.returncode == 2
        assert "nothing written, the merged config would not load" in result.stderr
        assert "extensions.clock.restart (line 4)" in result.stderr
        assert (work / "config.yaml").read_bytes() == before
        assert [p.name for p in work.iterdir() if p.name.startswith(".config")] == []  # no temporary left

    def test_unset_variables_are_named_and_the_config_still_written(self, work: Path) -> None:
        """${env:NOTES_TOKEN} unset at import: named; the config is written and loads once it is set."""
        environ = {k: v for k, v in os.environ.items() if k not in ("NOTES_TOKEN", "MCP_SUPERVISOR_SOCKET")}
        result = zygote.run(
            [*CLI, "import", str(work / "clients" / "cursor_mcp.json"), "-c", str(work / "config.yaml")],
            timeout=patience(30),
            env=environ,
        )
        assert result.returncode == 0, result.stderr
        assert "note: NOTES_TOKEN is not set here: the daemon needs it in its environment\n" in result.stdout
        assert run("check-config", str(work / "config.yaml"), env={"NOTES_TOKEN": "t"}).returncode == 0

    def test_nothing_to_import_exits_1(self, work: Path) -> None:
        client = work / "clients" / "remote.json"
        client.write_text(
            json.dumps({"mcpServers": {"r": {"type": "websocket", "url": "wss://example.com/"}}})
        )
        result = run("import", str(client), "-c", str(work / "config.yaml"))
        assert result.returncode == 1
        assert result.stdout.startswith("skipped r: type 'websocket' is no transport mcp-supervisor knows")
        assert result.stderr == f"mcp-supervisor: no server to import from {client}\n"


class TestRewriteClient:
    def test_backup_then_one_connect_entry_and_the_rest_untouched(self, work: Path) -> None:
        """The client keeps its other keys; its servers, remote ones too, become one connect entry."""
        client = work / "clients" / "cursor_mcp.json"
        client.chmod(0o640)
        original = client.read_bytes()
        result = run("import", str(client), "-c", str(work / "config.yaml"), "--rewrite-client")
        assert result.returncode == 0, result.stderr
        (saved,) = client.parent.glob("cursor_mcp.json.bak-*")
        assert BACKUP.search(saved.name)
        assert saved.read_bytes() == original
        assert stat.S_IMODE(saved.stat().st_mode) == stat.S_IMODE(client.stat().st_mode) == 0o640
        data = json.loads(client.read_text())
        socket_path = str(work / "run" / "control.sock")  # not the default: named
        assert data == {
            "mcpServers": {
                "supervisor": {"command": SCRIPT, "args": ["connect", "--socket", socket_path]},
            }
        }
        assert f"rewrote {client}: one 'supervisor' entry runs connect; backup {saved}\n" in result.stdout

    def test_other_top_level_keys_keep_their_values_and_order(self, work: Path) -> None:
        client = work / "clients" / "claude-code-user" / ".claude.json"
        before = json.loads(client.read_text())
        result = run("import", str(client), "-c", str(work / "config.yaml"), "--rewrite-client")
        assert result.returncode == 0, result.stderr
        after = json.loads(client.read_text())
        assert list(after) == list(before)
        assert {k: v for k, v in after.items() if k != "mcpServers"} == {
            k: v for k, v in before.items() if k != "mcpServers"
        }
        assert list(after["mcpServers"]) == ["supervisor"]
        assert after["mcpServers"]["supervisor"]["type"] == "stdio"  # Claude Code writes it

    def test_vscode_jsonc_is_rewritten_and_its_comments_kept_in_the_backup(self, work: Path) -> None:
        client = work / "clients" / "vscode" / ".vscode" / "mcp.json"
        result = run("import", str(client), "-c", str(work / "config.yaml"), "--rewrite-client")
        assert result.returncode == 0, result.stderr
        assert "(its comments are only in the backup)" in result.stdout
        data = json.loads(client.read_text())
        assert list(data["servers"]) == ["github", "supervisor"]  # the skipped stay
        assert data["servers"]["supervisor"]["type"] == "stdio"
        assert data["inputs"][0]["id"] == "github_token"
        assert (
            f"{client.parent.parent.resolve()}, vscode]" in (work / "config.yaml").read_text()
        )  # the workspace
        check = run("check-config", str(work / "config.yaml"))
        assert check.returncode == 0, check.stderr

    def test_a_symlinked_client_file_stays_a_symlink(self, work: Path) -> None:
        """Dotfiles kept as links: the target is backed up and rewritten, the link still points to it."""
        target = work / "dotfiles" / "claude_desktop_config.json"
        target.parent.mkdir()
        shutil.copy(work / "clients" / "claude_desktop_config.json", target)
        link = work / "clients" / "linked.json"
        link.symlink_to(target)
        result = run("import", str(link), "-c", str(work / "config.yaml"), "--rewrite-client")
        assert result.returncode == 0, result.stderr
        assert link.is_symlink() and link.resolve() == target
        assert list(json.loads(target.read_text())["mcpServers"]) == ["supervisor"]
        assert len(list(target.parent.glob("claude_desktop_config.json.bak-*"))) == 1

    def test_a_rewrite_that_cannot_be_done_stops_the_import_before_any_write(self, work: Path) -> None:
        """A server left in the client and named `supervisor` would be lost: exit 2, config and
        client untouched."""
        client = work / "clients" / "taken.json"
        servers = {"a": {"command": "x"}, "supervisor": {"type": "websocket", "url": "wss://example.com/"}}
        client.write_text(json.dumps({"mcpServers": servers}))
        before = (work / "config.yaml").read_bytes()
        result = run("import", str(client), "-c", str(work / "config.yaml"), "--rewrite-client")
        assert result.returncode == 2
        assert "has an entry named 'supervisor' already; rename it first" in result.stderr
        assert (work / "config.yaml").read_bytes() == before
        assert json.loads(client.read_text()) == {"mcpServers": servers}


class TestClientConfig:
    @pytest.mark.parametrize("client", ["claude", "cursor", "windsurf", "vscode", "claude-code"])
    def test_the_readme_shows_what_client_config_prints(self, client: str) -> None:
        """README's "Connecting MCP clients" snippets are this command's output, install path aside."""
        result = run("client-config", "--client", client)
        assert result.returncode == 0, result.stderr
        shown = result.stdout.replace(SCRIPT, "/opt/mcp-supervisor/.venv/bin/mcp-supervisor")
        assert shown.strip() in README.read_text()

    def test_entries(self) -> None:
        vscode = json.loads(run("client-config", "--client", "vscode").stdout)
        assert vscode == {
            "servers": {"supervisor": {"type": "stdio", "command": SCRIPT, "args": ["connect"]}}
        }
        code = run("client-config", "--client", "claude-code").stdout
        assert code == f"claude mcp add --scope user supervisor -- {SCRIPT} connect\n"

    def test_socket_and_profile(self, tmp_path: Path) -> None:
        """--socket only when it is not the default a client's connect finds; --profile passes through."""
        other = str(tmp_path / "control.sock")
        out = json.loads(run("client-config", "--socket", other, "--profile", "coding").stdout)
        assert out["mcpServers"]["supervisor"]["args"] == [
            "connect",
            "--socket",
            other,
            "--profile",
            "coding",
        ]
        default = run("client-config", "--socket", run_default_socket()).stdout
        assert json.loads(default)["mcpServers"]["supervisor"]["args"] == ["connect"]

    def test_the_socket_of_a_config(self, work: Path) -> None:
        """-c CONFIG: the config's socket, named since it is not the default."""
        out = json.loads(run("client-config", "--client", "cursor", "-c", str(work / "config.yaml")).stdout)
        args = ["connect", "--socket", str(work / "run" / "control.sock")]
        assert out == {"mcpServers": {"supervisor": {"command": SCRIPT, "args": args}}}


def run_default_socket() -> str:
    from supervisor.paths import default_socket_path

    return default_socket_path({k: v for k, v in os.environ.items() if k != "MCP_SUPERVISOR_SOCKET"})


def test_two_commands_move_a_claude_desktop_config_under_the_daemon(
    short_tmp: Path, daemons: Callable[..., Daemon]
) -> None:
    """`import --rewrite-client` + `daemon`: the client file has only the connect entry, the daemon runs
    the servers, and an MCP client started from that entry calls their tools through the gateway."""
    servers: dict[str, Any] = {
        name: {"command": sys.executable, "args": [str(SERVERS / "quick.py")], "env": {"WHO": name}}
        for name in ("alpha", "beta")
    }
    client = short_tmp / "claude_desktop_config.json"
    client.write_text(json.dumps({"mcpServers": servers, "globalShortcut": "Ctrl+Space"}, indent=2))
    config = short_tmp / "config.yaml"
    config.write_text(f"socket: {short_tmp / 'control.sock'}\n")

    result = run("import", str(client), "-c", str(config), "--rewrite-client")
    assert result.returncode == 0, result.stderr
    daemon = daemons(config=config, end="terminate")

    entries = json.loads(client.read_text())["mcpServers"]
    assert list(entries) == ["supervisor"]

    def status() -> dict[str, str]:
        return {name: record["state"] for name, record in daemon.status().items()}

    until(lambda: status() == {"alpha": "running", "beta": "running"})

    async def through_the_client_entry() -> list[str]:
        entry = entries["supervisor"]
        params = StdioServerParameters(command=entry["command"], args=entry["args"])
        with fail_after(20):
            async with stdio_client(params) as streams, ClientSession(*streams) as session:
                await session.initialize()
                names = [tool.name for tool in (await session.list_tools()).tools]
                result = await session.call_tool("beta__echo", {"text": "moved"})
                assert result.content[0].text == "moved"  # type: ignore[union-attr]
                return names

    names = anyio.run(through_the_client_entry)
    assert {"alpha__echo", "beta__echo"} <= set(names)
    assert daemon.terminate() == 0
