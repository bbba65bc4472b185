"""Reading client config files (``importer``) and adding extensions to a config's text (``configfile``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import fields, importer, runners
from supervisor.config import settings as config
from supervisor.config.file import add_extensions, extension_names
from supervisor.config.migrate import workspace_of
from supervisor.errors import ConfigError
from tests.harness import DATA

SAMPLES = DATA / "clientconfigs"
HOME = "/home/me"


def planned(sample: str, workspace: str | None = None, **kwargs: Any) -> importer.Plan:
    return importer.plan(importer.read_client(SAMPLES / sample, **kwargs), home=HOME, workspace=workspace)


def entries(found: importer.Plan) -> dict[str, dict[str, Any]]:
    return {item.name: item.entry for item in found.imported}


class TestRemoteServers:
    def test_headers_are_copied_with_a_note_and_variables_named(self) -> None:
        raw = {"url": "https://h/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}, "disabled": True}
        entry, notes = importer._convert(raw, home=HOME, workspace=None, inputs={})
        assert entry == {
            "url": "https://h/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN}"},
            "autostart": False,
        }
        assert notes[0].startswith("headers Authorization copied as they are")
        assert importer._variables(entry) == ("TOKEN",)

    @pytest.mark.parametrize(
        ("command", "args", "expected"),
        [
            ("npx", ["-y", "mcp-remote", "https://h/mcp"], {"url": "https://h/mcp"}),
            ("npx", ["mcp-remote@0.1.29", "https://h/sse", "--transport", "sse-only",
                     "--header", "Authorization: Bearer ${AUTH}"],
             {"url": "https://h/sse", "type": "sse", "headers": {"Authorization": "Bearer ${AUTH}"}}),
            ("uvx", ["mcp-proxy", "--transport=streamablehttp", "-H", "X-Key", "v", "https://h/mcp"],
             {"url": "https://h/mcp", "type": "http", "headers": {"X-Key": "v"}}),
            ("/usr/local/bin/mcp-proxy", ["http://localhost:9000/sse"],
             {"url": "http://localhost:9000/sse", "type": "sse"}),
        ],
    )  # fmt: skip
    def test_stdio_wrappers_of_a_remote_server_come_in_as_that_server(
        self, command: str, args: list[str], expected: dict[str, Any]
    ) -> None:
        """mcp-remote and mcp-proxy run a remote server as a stdio one: the daemon reaches the
        server itself (one login, one session for every client), so the wrapper goes."""
        entry, notes = importer._convert(
            {"command": command, "args": args}, home=HOME, workspace=None, inputs={}
        )
        assert entry == expected
        assert "wraps a remote server" in notes[0]

    def test_mcp_proxy_serving_a_stdio_server_stays_a_stdio_entry(self) -> None:
        entry, _ = importer._convert(
            {"command": "mcp-proxy", "args": ["--port", "8080", "uvx", "mcp-server-time"]},
            home=HOME, workspace=None, inputs={},
        )  # fmt: skip
        assert entry["command"] == "mcp-proxy"


class TestFormats:
    def test_claude_desktop(self) -> None:
        """Every server taken; a name with a space renamed; a literal `$` escaped as `$$`."""
        client = importer.read_client(SAMPLES / "claude_desktop_config.json")
        assert (client.table, client.client, client.comments) == (("mcpServers",), "claude", False)
        found = importer.plan(client, home=HOME)
        got = entries(found)
        assert list(got) == ["filesystem", "github", "brave-search"]
        assert got["filesystem"]["args"][-1] == "/Users/me/Downloads"
        assert got["github"]["env"] == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_pa$$$$word"}
        first = "npx may download the server when first started: first_start_timeout: 300"
        assert [note.split(" (start_timeout")[0] for note in found.notes] == [
            f"filesystem: {first}",
            f"github: {first}",
            "brave search: renamed to 'brave-search' (letters, digits, '_' and '-' only, no '__')",
            f"brave-search: {first}",
        ]
        assert found.skipped == []

    def test_cursor(self) -> None:
        """${userHome} and ${env:X} mapped, envFile reported, a url server imported as a remote one."""
        found = planned("cursor_mcp.json")
        got = entries(found)
        assert got["notes"] == {
            "command": f"{HOME}/bin/notes-mcp",
            "args": ["--db", f"{HOME}/.notes.db"],
            "env": {"NOTES_TOKEN": "${NOTES_TOKEN}"},
        }
        assert found.imported[0].variables == ("NOTES_TOKEN",)
        assert got["linear"] == {"url": "https://mcp.linear.app/sse"}  # type auto: finds SSE itself
        assert found.skipped == []
        assert (
            "notes: envFile '${userHome}/.notes.env' is not read: copy its variables into env" in found.notes
        )

    def test_windsurf(self) -> None:
        """disabled and disabledTools mapped; serverUrl is a remote server's URL."""
        found = planned("windsurf_mcp_config.json")
        assert entries(found)["memory"]["autostart"] is False
        assert entries(found)["memory"]["tools"] == {"deny": ["delete_entities", "delete_relations"]}
        assert entries(found)["context7"] == {"url": "https://mcp.context7.com/mcp"}

    def test_cline(self) -> None:
        """transportType stdio accepted, timeout in seconds, autoApprove/alwaysAllow named as ignored."""
        found = planned("cline_mcp_settings.json")
        assert entries(found)["everything"] == {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-everything"],
            "call_timeout": 1800,
            "call_timeout_max": 1800,
            "first_start_timeout": 300,
        }
        assert (
            "everything: ignored autoApprove, alwaysAllow (client settings mcp-supervisor does not use)"
            in (found.notes)
        )
        assert entries(found)["remote"] == {"url": "http://localhost:3001/sse", "type": "sse"}

    def test_claude_code_project_file(self) -> None:
        """`.mcp.json`: ${VAR} and ${VAR:-default} are Claude Code's syntax and ours: kept; http too."""
        client = importer.read_client(SAMPLES / "claude-code" / ".mcp.json")
        assert client.client == "claude-code"
        found = importer.plan(client, home=HOME)
        assert entries(found)["db"]["args"][-1] == "${DATABASE_URL:-postgres://localhost/dev}"
        assert found.imported[0].variables == ("API_KEY",)  # the one without a default
        assert entries(found)["sentry"] == {"url": "https://mcp.sentry.dev/mcp", "type": "http"}

    def test_claude_code_user_file_and_its_projects(self) -> None:
        """~/.claude.json: the user-scope servers, with a note per project; --project takes a project's."""
        found = planned("claude-code-user/.claude.json")
        assert list(entries(found)) == ["fetch"]
        assert found.notes[1:] == [
            "not imported: 1 server(s) of project /home/me/work/app (Claude Code's local scope); "
            "import them with --project /home/me/work/app"
        ]
        project = planned("claude-code-user/.claude.json", project="/home/me/work/app")
        assert list(entries(project)) == ["playwright"]
        with pytest.raises(ConfigError, match="has no project '/nowhere'"):
            importer.read_client(SAMPLES / "claude-code-user" / ".claude.json", project="/nowhere")

    def test_vscode_with_comments_inputs_and_workspace_variables(self) -> None:
        """JSONC read; ${workspaceFolder}, ${workspaceFolderBasename}, ${/} mapped; ${input:...} skipped."""
        client = importer.read_client(SAMPLES / "vscode" / ".vscode" / "mcp.json")
        assert (client.table, client.client, client.comments) == (("servers",), "vscode", True)
        found = importer.plan(client, home=HOME, workspace="/src/app")
        assert entries(found)["filesystem"] == {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/src/app", "app"],
            "env": {"HOME_COPY": "${HOME}", "SEP": "a/b"},
            "first_start_timeout": 300,
            "sandbox": {"write": ["/src/app", "app"]},  # the directories it serves
        }
        assert found.skipped == [
            "github: ${input:github_token} (GitHub Personal Access Token) is asked by VS Code when the "
            "server starts, and a daemon cannot ask: add this server by hand, with the value in its env",
        ]
        assert entries(found)["remote"] == {"url": "http://localhost:8080/sse", "type": "sse"}

    def test_file_servers_may_write_what_they_serve_others_get_the_default(self) -> None:
        """server-filesystem's directories become write grants; github gets the default; the
        report says which."""
        found = planned("claude_desktop_config.json")
        got = {item.name: item for item in found.imported}
        assert got["filesystem"].entry["sandbox"] == {"write": ["/Users/me/Desktop", "/Users/me/Downloads"]}
        assert "may write /Users/me/Desktop, /Users/me/Downloads" in got["filesystem"].sandbox
        assert "sandbox" not in got["github"].entry
        assert got["github"].sandbox.startswith("the default")

    @pytest.mark.parametrize(
        ("args", "granted", "report"),
        [
            (["mcp-server-git", "--repository", "~/src/x"], {"write": ["~/src/x"]}, "may write ~/src/x"),
            (
                ["notes-mcp", "--db", "/home/me/.notes.db"],
                None,
                "it is given /home/me/.notes.db: a file in a home",
            ),
            (
                ["mcp-server-sqlite", "--db-path", "/srv/data/x.db"],
                None,
                "/srv/data/x.db: grant /srv/data, as it",
            ),
            (["-y", "@modelcontextprotocol/server-memory"], None, "the default"),
        ],
    )
    def test_what_each_kind_of_server_gets(self, args: list[str], granted: Any, report: str) -> None:
        made, said = importer.sandbox_of({"command": "uvx", "args": args})
        assert made == granted
        assert report in said

    def test_a_path_in_its_env_is_reported_with_the_directory_to_grant(self) -> None:
        """server-memory's file is named by MEMORY_FILE_PATH: the report names it and its directory."""
        entry = {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}
        entry["env"] = {"MEMORY_FILE_PATH": "/srv/mem/memory.jsonl", "DEBUG": "1"}
        made, said = importer.sandbox_of(entry)
        assert made is None
        assert "/srv/mem/memory.jsonl (env MEMORY_FILE_PATH): grant /srv/mem" in said and "DEBUG" not in said

    def test_workspace_variables_without_a_workspace_are_reported(self) -> None:
        found = planned("vscode/.vscode/mcp.json", workspace=None)
        assert found.skipped[0] == (
            "filesystem: ${workspaceFolder} has no meaning outside a workspace: give --workspace DIR"
        )

    @pytest.mark.parametrize("sample", sorted(str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*.json")))
    def test_every_imported_entry_is_a_valid_extension(self, sample: str) -> None:
        """What the plan produces validates as an extension of its kind (with its variables set)."""
        found = planned(sample, workspace="/src/app")
        assert found.imported
        for item in found.imported:
            token = fields.LOADING.set(fields.Loading({}, dict.fromkeys(item.variables, "v")))
            try:
                kind = config.RemoteConfig if "url" in item.entry else config.StdioConfig
                kind.model_validate(item.entry)
            finally:
                fields.LOADING.reset(token)


class TestFirstStart:
    @pytest.mark.parametrize(
        ("command", "args", "runner"),
        [
            ("npx", ["-y", "@modelcontextprotocol/server-memory"], "npx"),
            ("/usr/local/bin/npx", ["pkg"], "npx"),
            ("uvx", ["mcp-server-time"], "uvx"),
            ("bunx", ["pkg"], "bunx"),
            ("pnpx", ["pkg"], "pnpx"),
            ("pipx", ["run", "mcp-server-fetch"], "pipx run"),
            ("pnpm", ["dlx", "pkg"], "pnpm dlx"),
            ("yarn", ["dlx", "pkg"], "yarn dlx"),
            ("bun", ["x", "pkg"], "bun x"),
            ("uv", ["tool", "run", "mcp-server-git"], "uv tool run"),
            ("docker", ["run", "-i", "--rm", "mcp/fetch"], "docker run"),
            ("deno", ["run", "-A", "npm:pkg"], "deno run"),
            ("node", ["server.js"], None),
            ("python", ["-m", "server"], None),
            ("uv", ["run", "server.py"], None),
            ("pipx", ["install", "pkg"], None),
            ("deno", ["run", "server.ts"], None),
            ("docker", ["exec", "-i", "box", "server"], None),
        ],
    )
    def test_which_commands_download_first(self, command: str, args: list[str], runner: str | None) -> None:
        """Package runners are known by their command (and verb), by name only."""
        assert runners.downloads_first(command, args) == runner

    def test_a_runner_entry_gets_first_start_timeout_and_the_report_says_so(self) -> None:
        """npx -y gets first_start_timeout: 300 and a note; a plain command gets neither."""
        raw = {
            "mcpServers": {
                "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
                "local": {"command": "/opt/server", "args": ["--stdio"]},
            }
        }
        client = importer.ClientFile(Path("c.json"), raw, ("mcpServers",), "claude", False)
        found = importer.plan(client, home=HOME)
        got = entries(found)
        assert got["memory"]["first_start_timeout"] == runners.FIRST_START_TIMEOUT
        assert "first_start_timeout" not in got["local"]
        assert found.notes == [
            "memory: npx may download the server when first started: first_start_timeout: 300 "
            "(start_timeout once it has started)"
        ]


class TestVariables:
    @pytest.mark.parametrize(
        ("text", "mapped"),
        [
            ("plain", "plain"),
            ("$HOME/x", "$$HOME/x"),  # not expanded by the client: a literal `$`
            ("a$$b", "a$$$$b"),
            ("${env:TOKEN}", "${TOKEN}"),
            ("${TOKEN}", "${TOKEN}"),
            ("${TOKEN:-none}", "${TOKEN:-none}"),
            ("${userHome}/.x", f"{HOME}/.x"),
            ("${pathSeparator}${/}", "//"),
        ],
    )
    def test_mapped(self, text: str, mapped: str) -> None:
        raw = {"servers": {"s": {"command": "run", "args": [text]}}}
        client = importer.ClientFile(Path("mcp.json"), raw, ("servers",), "vscode", False)
        assert entries(importer.plan(client, home=HOME))["s"]["args"] == [mapped]

    @pytest.mark.parametrize("text", ["${command:pick}", "${config:editor.x}", "${cwd}", "${input:x}"])
    def test_not_mappable_skips_the_server_with_the_variable_named(self, text: str) -> None:
        raw = {"servers": {"s": {"command": "run", "args": [text]}}}
        client = importer.ClientFile(Path("mcp.json"), raw, ("servers",), "vscode", False)
        found = importer.plan(client, home=HOME)
        assert found.imported == []
        assert found.skipped[0].startswith(f"s: {text}")

    def test_renamed_names_never_collide(self) -> None:
        raw = {"mcpServers": {"a b": {"command": "x"}, "a-b": {"command": "y"}, "a__b": {"command": "z"}}}
        client = importer.ClientFile(Path("c.json"), raw, ("mcpServers",), "claude", False)
        assert [i.name for i in importer.plan(client, home=HOME).imported] == ["a-b", "a-b-2", "a_b"]

    def test_own_connect_entry_is_never_imported(self) -> None:
        raw = {"mcpServers": {"supervisor": {"command": "/opt/bin/mcp-supervisor", "args": ["connect"]}}}
        client = importer.ClientFile(Path("c.json"), raw, ("mcpServers",), "claude", False)
        assert importer.plan(client, home=HOME).skipped == [
            "supervisor: it is mcp-supervisor's own connect entry"
        ]


class TestReadErrors:
    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ("{nope", "not valid JSON"),
            ("[1]", "the top level must be an object"),
            ('{"other": {}}', "has no 'mcpServers' (or VS Code 'servers') object"),
        ],
    )
    def test_a_bad_file_is_one_config_error(self, tmp_path: Path, content: str, message: str) -> None:
        path = tmp_path / "mcp.json"
        path.write_text(content)
        with pytest.raises(ConfigError, match=re.escape(message)):
            importer.read_client(path)

    def test_comments_in_strings_are_kept(self, tmp_path: Path) -> None:
        path = tmp_path / "mcp.json"
        path.write_text('{"servers": {"s": {"command": "a//b", "args": ["/*x*/", "q\\"//"],},}} // end\n')
        client = importer.read_client(path)
        assert client.servers["s"] == {"command": "a//b", "args": ["/*x*/", 'q"//']}


CONFIG = """\
# my daemon
socket: /tmp/x/control.sock
extensions:
  # the clock
  clock:
    command: mcp-supervisor-demo   # demo
    args: [clock]

  notes:
    command: old

# the gateway
gateway:
  max_name_length: 64
"""


class TestAddExtensions:
    def test_comments_and_order_are_kept(self) -> None:
        """Every existing line stays, in order; the new entries follow the last one, before later sections."""
        text, kept = add_extensions(
            CONFIG, {"fs": {"command": "npx", "args": ["-y", "@x/fs"]}}, comment="from c"
        )
        assert kept
        assert text.startswith(CONFIG.split("# the gateway")[0].rstrip("\n"))
        assert "  # from c\n  fs:\n    command: npx\n    args: [-y, '@x/fs']\n\n# the gateway\n" in text
        assert extension_names(text) == ["clock", "notes", "fs"]

    def test_replaced_entries_lose_their_lines_only(self) -> None:
        text, _ = add_extensions(CONFIG, {"notes": {"command": "new"}}, replace=["notes"])
        assert "old" not in text
        assert "# the clock" in text and "# demo" in text and "# the gateway" in text
        assert extension_names(text) == ["clock", "notes"]

    def test_a_file_without_extensions_gets_the_key(self) -> None:
        text, kept = add_extensions("socket: /tmp/s.sock  # here\n", {"a": {"command": "x"}})
        assert (text, kept) == ("socket: /tmp/s.sock  # here\n\nextensions:\n  a:\n    command: x\n", True)

    def test_an_empty_extensions_key_is_filled(self) -> None:
        text, _ = add_extensions("extensions:\n# nothing yet\nspool: {}\n", {"a": {"command": "x"}})
        assert text == "extensions:\n  a:\n    command: x\n# nothing yet\nspool: {}\n"

    def test_a_json_config_is_written_anew(self) -> None:
        """Flow style (a JSON file used as the config): rewritten from its data, comments reported lost."""
        text, kept = add_extensions('{"mcpServers": {"a": {"command": "x"}}}', {"b": {"command": "y"}})
        assert not kept
        assert extension_names(text) == ["a", "b"]

    def test_no_file_yet(self) -> None:
        text, _ = add_extensions(None, {"a": {"command": "x", "env": {"T": "${T}"}}}, comment="c")
        assert text == "# c\nextensions:\n  a:\n    command: x\n    env:\n      T: ${T}\n"


class TestWorkspace:
    def test_what_workspace_folder_means(self, tmp_path: Path) -> None:
        """The folder holding .vscode/ (or .cursor/, .mcp.json); none for a file of the user's home."""
        assert workspace_of(tmp_path / "app" / ".vscode" / "mcp.json") == str(tmp_path / "app")
        assert workspace_of(tmp_path / "app" / ".cursor" / "mcp.json") == str(tmp_path / "app")
        assert workspace_of(tmp_path / "app" / ".mcp.json") == str(tmp_path / "app")
        assert workspace_of(Path.home() / ".cursor" / "mcp.json") is None
        assert workspace_of(tmp_path / "claude_desktop_config.json") is None
        assert workspace_of(Path.home() / ".claude.json", "/src/app") == "/src/app"
