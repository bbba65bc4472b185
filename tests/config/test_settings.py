"""Tests for supervisor.config.settings: models, sources and their order, expansion, and error reporting."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from supervisor.config import settings as config
from supervisor.config.settings import (
    BackoffConfig,
    ConfigError,
    GatewayConfig,
    HttpConfig,
    RemoteConfig,
    Settings,
    SpoolConfig,
    StdioConfig,
    default_config_path,
    default_socket_path,
    load,
)

SOCKET = {"MCP_SUPERVISOR_SOCKET": "/run/test/control.sock"}  # keeps defaults independent of the test user


@pytest.fixture
def write(tmp_path: Path):
    """Write dedented YAML to a file in tmp_path and return its path."""

    def write(text: str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def errors_of(path: Path | None, **kwargs) -> tuple[str, ...]:
    """Load expecting failure; return the error lines."""
    kwargs.setdefault("environ", {})
    with pytest.raises(ConfigError) as info:
        load(path, **kwargs)
    return info.value.errors


FULL = """\
socket: /run/mcp-supervisor/control.sock
shutdown_timeout: 12
spool:
  dir: /var/cache/mcp-supervisor/spool
  max_inline_bytes: 1000
  max_total_bytes: 5000000
gateway:
  http: {enabled: true, host: 127.0.0.1, port: 9000}
extensions:
  time:
    command: uvx
    args: [mcp-server-time]
    env: {TZ: UTC}
    cwd: /srv
    autostart: false
    restart: always
    backoff: {initial: 1, max: 10, multiplier: 3, jitter: 0.5, reset_after: 5}
    max_restarts: 4
    start_timeout: 7
    stop_timeout: 2
    call_timeout: 9
    prefix: clock
    max_message_bytes: 2048
    log_lines: 10
  fs:
    command: npx
"""


class TestDefaults:
    def test_no_file_gives_defaults(self):
        """Without a file, environment or overrides every setting has its documented default."""
        settings = load(None, environ=SOCKET)
        assert settings.socket == "/run/test/control.sock"
        assert settings.shutdown_timeout == 30.0
        assert settings.spool == SpoolConfig(dir=None, max_inline_bytes=262144, max_total_bytes=1024**3)
        assert settings.gateway == GatewayConfig(http=HttpConfig(enabled=False, host="127.0.0.1", port=8765))
        assert settings.extensions == {}

    def test_extension_defaults(self):
        """An extension with only a command gets the documented defaults for everything else."""
        ext = StdioConfig(command="uvx")
        assert (ext.args, ext.env, ext.cwd, ext.autostart, ext.restart) == ([], {}, None, True, "on-failure")
        assert ext.backoff == BackoffConfig(initial=0.5, max=30, multiplier=2, jitter=0.1, reset_after=60)
        timeouts = (ext.start_timeout, ext.stop_timeout, ext.call_timeout)
        assert (ext.max_restarts, timeouts, ext.prefix) == (None, (30.0, 5.0, 60.0), None)
        assert (ext.max_message_bytes, ext.log_lines) == (64 * 1024 * 1024, 500)

    def test_empty_file_gives_defaults(self, write):
        """An empty file, or one with only comments, means all defaults."""
        assert load(None, environ=SOCKET) == load(write(""), environ=SOCKET)
        assert load(None, environ=SOCKET) == load(write("# nothing yet\n"), environ=SOCKET)

    def test_extensions_key_without_entries_is_empty(self, write):
        """`extensions:` with every entry commented out means no extensions."""
        assert load(write("extensions:\n  # time: {command: uvx}\n"), environ=SOCKET).extensions == {}

    def test_gateway_socket_is_beside_control_socket(self):
        """The gateway socket is mcp.sock in the control socket's directory."""
        assert load(None, environ=SOCKET).gateway_socket == "/run/test/mcp.sock"


class TestFullExample:
    def test_every_field_is_read(self, write):
        """Each documented key lands in the matching model field."""
        settings = load(write(FULL), environ={})
        assert settings.socket == "/run/mcp-supervisor/control.sock"
        assert settings.shutdown_timeout == 12.0
        spool = SpoolConfig(
            dir="/var/cache/mcp-supervisor/spool", max_inline_bytes=1000, max_total_bytes=5000000
        )
        assert settings.spool == spool
        assert settings.gateway.http == HttpConfig(enabled=True, host="127.0.0.1", port=9000)
        assert settings.extensions["time"] == StdioConfig(
            command="uvx",
            args=["mcp-server-time"],
            env={"TZ": "UTC"},
            cwd="/srv",
            autostart=False,
            restart="always",
            backoff=BackoffConfig(initial=1, max=10, multiplier=3, jitter=0.5, reset_after=5),
            max_restarts=4,
            start_timeout=7,
            stop_timeout=2,
            call_timeout=9,
            prefix="clock",
            max_message_bytes=2048,
            log_lines=10,
        )
        assert settings.extensions["fs"] == StdioConfig(command="npx")

    def test_dump_round_trips(self, write):
        """Dumping loaded settings to YAML and loading that again gives equal settings."""
        settings = load(write(FULL), environ={})
        again = load(write(yaml.safe_dump(settings.model_dump()), "again.yaml"), environ={})
        assert settings == again

    def test_numbers_in_args_and_env_become_strings(self, write):
        """YAML numbers in args and env values are taken as their text, as a shell would."""
        path = write("extensions:\n  s: {command: srv, args: [--port, 8080], env: {PORT: 8080}}\n")
        ext = load(path, environ={}).extensions["s"]
        assert (ext.args, ext.env) == (["--port", "8080"], {"PORT": "8080"})


class TestClientCompatibility:
    def test_mcp_servers_is_the_extensions_key(self, write):
        """`mcpServers:` fills `extensions`."""
        settings = load(write("mcpServers:\n  time: {command: uvx, args: [mcp-server-time]}\n"), environ={})
        assert {"time": StdioConfig(command="uvx", args=["mcp-server-time"])} == settings.extensions

    def test_claude_desktop_json_loads_as_is(self, write):
        """A claude_desktop_config.json file is valid config, env and all."""
        desktop = {
            "mcpServers": {
                "filesystem": {
                    "command": "npx",
                    "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"],
                },
                "github": {
                    "command": "docker",
                    "args": [
                        "run",
                        "-i",
                        "--rm",
                        "-e",
                        "GITHUB_PERSONAL_ACCESS_TOKEN",
                        "ghcr.io/github/github-mcp-server",
                    ],
                    "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "<token>"},
                },
            }
        }
        path = write(json.dumps(desktop, indent=2), "claude_desktop_config.json")
        settings = load(path, environ={})
        assert sorted(settings.extensions) == ["filesystem", "github"]
        assert settings.extensions["filesystem"].args[-1] == "/Users/me/Desktop"
        assert settings.extensions["github"].env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "<token>"}

    def test_both_keys_at_once_are_rejected(self, write):
        """Giving both `extensions` and `mcpServers` is an error naming the second key's line."""
        path = write("extensions:\n  a: {command: x}\nmcpServers:\n  b: {command: y}\n")
        assert errors_of(path) == ("mcpServers (line 3): give 'extensions' or 'mcpServers', not both",)

    def test_type_stdio_is_accepted(self, write):
        """`type: stdio` (Cursor, VS Code) is accepted and not kept as a setting."""
        settings = load(write('{"mcpServers": {"t": {"type": "stdio", "command": "uvx"}}}'), environ={})
        assert settings.extensions["t"] == StdioConfig(command="uvx")
        assert "type" not in StdioConfig.model_fields

    def test_url_is_a_remote_extension(self, write):
        """An entry with a `url` is a remote server, with the lifecycle settings of any extension
        and liveness pings on by default (nothing else notices an idle server going away)."""
        settings = load(write("mcpServers:\n  remote:\n    url: https://example.com/mcp\n"), environ={})
        remote = settings.extensions["remote"]
        assert remote == RemoteConfig(url="https://example.com/mcp")
        assert (remote.type, remote.ping_interval, remote.headers) == ("auto", 30.0, {})

    def test_a_remote_type_with_a_command_says_to_give_its_url(self, write):
        """`type: sse` beside a command names the type and says what a remote entry needs."""
        (error,) = errors_of(write("mcpServers:\n  remote: {type: sse, command: x}\n"))
        assert (
            error
            == "extensions.remote (line 2): type 'sse' is a remote server: give its 'url' (and no 'command')"
        )

    @pytest.mark.parametrize(
        ("url", "allowed"),
        [("http://127.0.0.1:8080/mcp", True), ("http://localhost/mcp", True), ("http://[::1]/mcp", True),
         ("http://example.com/mcp", False), ("http://10.0.0.2/mcp", False)],
    )  # fmt: skip
    def test_plain_http_is_for_loopback_unless_allowed(self, url: str, allowed: bool) -> None:
        if allowed:
            assert RemoteConfig(url=url).url == url
        else:
            with pytest.raises(ValidationError, match="plain http://"):
                RemoteConfig(url=url)
        assert RemoteConfig(url=url, allow_http=True).allow_http

    @pytest.mark.parametrize(
        ("oauth", "where", "error"),
        [
            ("{grant: client_credentials, client_id: ci}", "",
             "'grant: client_credentials' needs 'client_id' and 'client_secret'"),
            ("{scopes: ['read write']}", ".scopes.0",
             "'read write' is not one OAuth scope (printable, no spaces)"),
            ("{client_metadata_url: 'http://example.org/c.json', callback_port: 8976}", "",
             "'client_metadata_url' must be an https:// URL with a path, not 'http://example.org/c.json'"),
            ("{client_metadata_url: 'https://example.org/c.json'}", "",
             "'client_metadata_url' needs 'callback_port': the port of the document's redirect URI"),
            ("{client_id: x, secret: y}", ".secret", "Extra inputs are not permitted"),
        ],
    )  # fmt: skip
    def test_oauth_settings_that_cannot_work_name_the_field_and_line(
        self, write, oauth: str, where: str, error: str
    ) -> None:
        config = f"extensions:\n  far:\n    url: https://example.com/mcp\n    oauth: {oauth}\n"
        assert errors_of(write(config)) == (f"extensions.far.oauth{where} (line 4): {error}",)

    def test_client_spellings_of_oauth_load(self, write) -> None:
        entry = "url: https://example.com/mcp, oauth: {clientId: x, callbackPort: 9000}"
        oauth = load(write(f"mcpServers:\n  far: {{{entry}}}\n"), environ={}).extensions["far"].oauth
        assert (oauth.client_id, oauth.callback_port) == ("x", 9000)

    @pytest.mark.parametrize("name", ["Host", "content-length", "Mcp-Session-Id", "bad name", ""])
    def test_headers_the_transport_sets_or_that_are_no_names_are_refused(self, name: str) -> None:
        with pytest.raises(ValidationError, match="header"):
            RemoteConfig(url="https://example.com/", headers={name: "x"})

    def test_disabled_means_no_autostart(self, write):
        """`disabled: true` loads as autostart false and compares equal to it."""
        settings = load(write("mcpServers:\n  t: {command: uvx, disabled: true}\n"), environ={})
        assert settings.extensions["t"] == StdioConfig(command="uvx", autostart=False)
        assert "disabled" not in StdioConfig.model_fields

    def test_disabled_and_autostart_together_are_rejected(self):
        """Giving both `disabled` and `autostart` is ambiguous and therefore an error."""
        with pytest.raises(ValidationError, match="not both"):
            StdioConfig(command="uvx", disabled=False, autostart=False)


class TestErrors:
    def test_unknown_top_level_key(self, write):
        """A typo at the top level is reported with its name and line."""
        path = write("socket: /tmp/s.sock\nsoket: /tmp/s.sock\n")
        assert errors_of(path) == ("soket (line 2): Extra inputs are not permitted",)

    def test_unknown_key_in_extension(self, write):
        """A typo inside an extension is reported with its full path and line."""
        path = write("extensions:\n  time:\n    command: uvx\n    argz: [x]\n")
        assert errors_of(path) == ("extensions.time.argz (line 4): Extra inputs are not permitted",)

    def test_unknown_key_in_nested_model(self, write):
        """A typo inside backoff is reported with its full path and line."""
        path = write("extensions:\n  time:\n    command: uvx\n    backoff:\n      inital: 1\n")
        assert errors_of(path) == ("extensions.time.backoff.inital (line 5): Extra inputs are not permitted",)

    def test_bad_enum(self, write):
        """An invalid restart policy names the allowed values, the field path and the line."""
        path = write("extensions:\n  time:\n    command: uvx\n    restart: sometimes\n")
        expected = "extensions.time.restart (line 4): Input should be 'always', 'on-failure' or 'never'"
        assert errors_of(path) == (expected,)

    def test_every_error_is_reported(self, write):
        """Problems in different places are all listed in one ConfigError, one per line of its message."""
        path = write(
            """\
            shutdown_timeout: 0
            spool: {max_total_bytes: 0}
            extensions:
              a:
                args: [x]
              b:
                command: y
                log_lines: 0
                backoff: {jitter: 2}
            """
        )
        with pytest.raises(ConfigError) as info:
            load(path, environ={})
        assert set(info.value.errors) == {
            "shutdown_timeout (line 1): Input should be greater than 0",
            "spool.max_total_bytes (line 2): Input should be greater than 0",
            "extensions.a.command (line 4): Field required",
            "extensions.b.log_lines (line 8): Input should be greater than or equal to 1",
            "extensions.b.backoff.jitter (line 9): Input should be less than or equal to 1",
        }
        assert "\n".join(info.value.errors) == str(info.value)

    @pytest.mark.parametrize("name", ["bad name", "-dash", "a" * 65, "é"])
    def test_bad_extension_name(self, write, name):
        """A name with other characters, a leading `-` or over 64 characters is an error naming it."""
        (error,) = errors_of(write(json.dumps({"extensions": {name: {"command": "x"}}})))
        assert error.startswith(f"extensions.{name} (line 1): invalid name '{name}'")

    def test_double_underscore_in_name(self, write):
        """`__` separates extension and tool in the gateway, so a name may not contain it."""
        (error,) = errors_of(write("extensions:\n  my__ext: {command: x}\n"))
        assert error.startswith("extensions.my__ext (line 2): invalid name 'my__ext'")
        assert "'__'" in error

    def test_bad_prefix(self, write):
        """`prefix` follows the same rules as extension names."""
        (error,) = errors_of(write("extensions:\n  a: {command: x, prefix: a__b}\n"))
        assert error.startswith("extensions.a.prefix (line 2): invalid name 'a__b'")

    @pytest.mark.parametrize(
        "extensions",
        [
            "  fs-home: {command: x, prefix: fs}\n  fs-work: {command: x, prefix: fs}\n",
            "  fs-home: {command: x, prefix: fs-work}\n  fs-work: {command: x}\n",  # its default prefix
        ],
    )
    def test_a_shared_prefix_names_both_extensions(self, write, extensions):
        """Two extensions on one gateway prefix would take each other's names as they start and stop."""
        (error,) = errors_of(write("extensions:\n" + extensions))
        assert error.startswith(
            "extensions (line 1): extensions 'fs-home' and 'fs-work' both use the gateway"
        )
        assert "give one of them its own 'prefix:'" in error

    def test_empty_command(self, write):
        """An empty command is an error."""
        assert errors_of(write("extensions:\n  a: {command: ''}\n")) == (
            "extensions.a.command (line 2): command must not be empty",
        )

    def test_duplicate_key(self, write):
        """Two blocks with the same extension name are an error rather than the first being dropped."""
        path = write("extensions:\n  a: {command: x}\n  a: {command: y}\n")
        assert errors_of(path) == ("extensions.a (line 3): duplicate key, first on line 2",)

    def test_missing_file(self, tmp_path):
        """A missing file is one error naming the file, without a line."""
        path = tmp_path / "nope.yaml"
        assert errors_of(path) == (f"{path}: No such file or directory",)

    def test_unreadable_file(self, tmp_path):
        """A path that cannot be read as a file is reported, not raised as OSError."""
        (error,) = errors_of(tmp_path)
        assert error.startswith(f"{tmp_path}: ")

    def test_yaml_syntax_error_has_its_line(self, write):
        """A YAML syntax error names the file and the line of the problem."""
        path = write("extensions:\n  a: {command: x\n  b: [\n")
        (error,) = errors_of(path)
        assert error.startswith(f"{path} (line ")
        path = write("socket: a\n  bad: indent\n")
        assert errors_of(path) == (f"{path} (line 2): mapping values are not allowed here",)

    @pytest.mark.parametrize(
        ("text", "kind"), [("- a\n- b\n", "list"), ("just text\n", "str"), ("3\n", "int")]
    )
    def test_top_level_must_be_mapping(self, write, text, kind):
        """A file whose top level is not a mapping is rejected with the type it found."""
        path = write(text)
        assert errors_of(path) == (f"{path} (line 1): the top level must be a mapping, not a {kind}",)

    def test_config_error_is_a_supervisor_error(self):
        """ConfigError is a SupervisorError whose str() is its errors joined by newlines."""
        from supervisor.errors import SupervisorError

        exc = ConfigError(["a: one", "b: two"])
        assert isinstance(exc, SupervisorError)
        assert exc.errors == ("a: one", "b: two")
        assert str(exc) == "a: one\nb: two"


class TestExpansion:
    def test_variable(self, write):
        """`${VAR}` expands from the given environ in command, args, env values and cwd."""
        path = write(
            """\
            extensions:
              a:
                command: ${BIN}/server
                args: [--root, "${HOME}/data"]
                env: {TOKEN: "${TOKEN}"}
                cwd: ${HOME}
            """
        )
        ext = load(path, environ={"BIN": "/opt/bin", "HOME": "/home/me", "TOKEN": "s3cret"}).extensions["a"]
        assert (ext.command, ext.args) == ("/opt/bin/server", ["--root", "/home/me/data"])
        assert (ext.env, ext.cwd) == ({"TOKEN": "s3cret"}, "/home/me")

    def test_default(self, write):
        """`${VAR:-default}` uses the default when VAR is unset or empty, and VAR otherwise."""
        path = write('extensions:\n  a: {command: x, args: ["${A:-one}", "${B:-two}", "${C:-}"]}\n')
        assert load(path, environ={"B": ""}).extensions["a"].args == ["one", "two", ""]
        assert load(path, environ={"A": "1", "B": "2"}).extensions["a"].args == ["1", "2", ""]

    def test_dollar_dollar_is_literal(self, write):
        """`$$` is a literal `$`, so `$${HOME}` stays unexpanded; a lone `$` is left alone."""
        path = write('extensions:\n  a: {command: x, args: ["$${HOME}", "cost: 5$", "$$$$", "^a$"]}\n')
        assert load(path, environ={"HOME": "/h"}).extensions["a"].args == ["${HOME}", "cost: 5$", "$$", "^a$"]

    def test_set_but_empty_variable_expands_to_nothing(self, write):
        """`${VAR}` with VAR set to the empty string expands to the empty string."""
        path = write('extensions:\n  a: {command: x, env: {X: "<${E}>"}}\n')
        assert load(path, environ={"E": ""}).extensions["a"].env == {"X": "<>"}

    def test_unset_variable_is_an_error(self, write):
        """An unset variable without default is an error naming the field path, its line and the variable."""
        path = write(
            'extensions:\n  a:\n    command: x\n    args: [ok, "${NOPE}"]\n    env: {K: "${ALSO_NOPE}"}\n'
        )
        hint = "is not set (write $$ for a literal $)"
        assert errors_of(path) == (
            f"extensions.a.args.1 (line 4): environment variable NOPE {hint}",
            f"extensions.a.env.K (line 5): environment variable ALSO_NOPE {hint}",
        )

    def test_malformed_reference_is_an_error(self, write):
        """An unterminated or invalid `${` is an error rather than passing through."""
        (error,) = errors_of(write('extensions:\n  a: {command: "${oops"}\n'))
        assert error.startswith("extensions.a.command (line 2): malformed '${'")

    def test_variable_is_not_expanded_elsewhere(self, write):
        """Only command, args, env values and cwd expand; other strings are taken as written."""
        path = write('socket: "/run/${X}/c.sock"\nextensions:\n  a: {command: x, env: {"${K}": v}}\n')
        settings = load(path, environ={"X": "y", "K": "k"})
        assert settings.socket == "/run/${X}/c.sock"
        assert settings.extensions["a"].env == {"${K}": "v"}


class TestSources:
    def test_env_socket_beats_file(self, write):
        """MCP_SUPERVISOR_SOCKET wins over the file's socket."""
        path = write("socket: /from/file.sock\n")
        assert load(path, environ={"MCP_SUPERVISOR_SOCKET": "/from/env.sock"}).socket == "/from/env.sock"

    def test_nested_env_beats_file_and_keeps_siblings(self, write):
        """A nested variable replaces one key of the file's section and leaves the others."""
        path = write("spool: {dir: /var/spool/x, max_inline_bytes: 100}\n")
        settings = load(path, environ={"MCP_SUPERVISOR_SPOOL__MAX_INLINE_BYTES": "5"})
        assert settings.spool == SpoolConfig(dir="/var/spool/x", max_inline_bytes=5)

    def test_env_reaches_into_extensions(self, write):
        """An extension's setting can be changed through the environment."""
        path = write("extensions:\n  time: {command: uvx}\n")
        settings = load(path, environ={"MCP_SUPERVISOR_EXTENSIONS__TIME__CALL_TIMEOUT": "5"})
        assert settings.extensions["time"] == StdioConfig(command="uvx", call_timeout=5)

    def test_override_beats_env(self, write):
        """Explicit overrides (the command line) win over the environment and the file."""
        path = write("socket: /from/file.sock\nshutdown_timeout: 3\n")
        environ = {"MCP_SUPERVISOR_SOCKET": "/from/env.sock", "MCP_SUPERVISOR_SHUTDOWN_TIMEOUT": "4"}
        settings = load(path, overrides={"socket": "/from/cli.sock"}, environ=environ)
        assert (settings.socket, settings.shutdown_timeout) == ("/from/cli.sock", 4.0)

    def test_none_override_is_ignored(self, write):
        """An override of None (an option not given) leaves the lower sources in charge."""
        path = write("socket: /from/file.sock\n")
        assert load(path, overrides={"socket": None}, environ={}).socket == "/from/file.sock"

    def test_env_error_has_no_line(self, write):
        """A bad value from the environment is reported by path, without a file line."""
        path = write("spool:\n  max_inline_bytes: 10\n")
        (error,) = errors_of(path, environ={"MCP_SUPERVISOR_SPOOL__MAX_INLINE_BYTES": "lots"})
        assert error.startswith("spool.max_inline_bytes: Input should be a valid integer")

    def test_override_error_has_no_line(self, write):
        """A bad override is reported by path, without a file line."""
        path = write("shutdown_timeout: 3\n")
        assert errors_of(path, overrides={"shutdown_timeout": 0}) == (
            "shutdown_timeout: Input should be greater than 0",
        )

    def test_malformed_json_in_env_is_a_config_error(self):
        """A list or mapping variable that is not JSON becomes a ConfigError, not a crash."""
        (error,) = errors_of(None, environ={"MCP_SUPERVISOR_EXTENSIONS": "{oops"})
        assert error.startswith("environment: ")
        assert "extensions" in error

    def test_unrelated_env_is_ignored(self):
        """Other MCP_SUPERVISOR_* variables, such as the config path, are not settings and not errors."""
        environ = {**SOCKET, "MCP_SUPERVISOR_CONFIG": "/x.yaml", "PATH": "/bin"}
        assert load(None, environ=SOCKET) == load(None, environ=environ)

    def test_os_environ_is_the_default(self, monkeypatch):
        """Without an explicit environ, load() reads os.environ."""
        monkeypatch.setenv("MCP_SUPERVISOR_SOCKET", "/from/os/environ.sock")
        assert load(None).socket == "/from/os/environ.sock"


class TestDefaultPaths:
    def test_root_socket(self, monkeypatch):
        """Root uses /run/mcp-supervisor, whatever XDG_RUNTIME_DIR says."""
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        assert default_socket_path({"XDG_RUNTIME_DIR": "/run/user/0"}) == "/run/mcp-supervisor/control.sock"

    def test_user_socket_in_runtime_dir(self, monkeypatch):
        """A normal user gets a directory under XDG_RUNTIME_DIR."""
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        expected = "/run/user/1000/mcp-supervisor/control.sock"
        assert expected == default_socket_path({"XDG_RUNTIME_DIR": "/run/user/1000"})

    def test_user_socket_without_runtime_dir(self, monkeypatch):
        """Without XDG_RUNTIME_DIR a normal user gets a per-uid directory in /tmp."""
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        assert default_socket_path({}) == "/tmp/mcp-supervisor-1000/control.sock"

    def test_env_socket_wins(self, monkeypatch):
        """MCP_SUPERVISOR_SOCKET wins over every default, for root too."""
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        assert default_socket_path({"MCP_SUPERVISOR_SOCKET": "/x/c.sock"}) == "/x/c.sock"

    def test_reads_os_environ_by_default(self, monkeypatch):
        """Called without arguments, default_socket_path reads os.environ."""
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        monkeypatch.delenv("MCP_SUPERVISOR_SOCKET", raising=False)
        monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
        assert default_socket_path() == "/run/user/1000/mcp-supervisor/control.sock"

    def test_load_uses_its_environ_for_the_default(self, monkeypatch):
        """load() computes the default socket from the environ it was given."""
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        settings = load(None, environ={"XDG_RUNTIME_DIR": "/run/user/1000"})
        assert settings.socket == "/run/user/1000/mcp-supervisor/control.sock"
        assert settings.gateway_socket == "/run/user/1000/mcp-supervisor/mcp.sock"

    def test_config_path(self, monkeypatch):
        """MCP_SUPERVISOR_CONFIG names the config file, else /etc/mcp-supervisor/config.yaml."""
        assert default_config_path({}) == "/etc/mcp-supervisor/config.yaml"
        assert default_config_path({"MCP_SUPERVISOR_CONFIG": "/x.yaml"}) == "/x.yaml"
        monkeypatch.setenv("MCP_SUPERVISOR_CONFIG", "/y.yaml")
        assert default_config_path() == "/y.yaml"


class TestModels:
    def test_settings_are_frozen(self):
        """Assigning to settings or to an extension's config raises."""
        settings = load(None, environ=SOCKET)
        with pytest.raises(ValidationError):
            settings.socket = "/elsewhere"  # type: ignore[misc]
        with pytest.raises(ValidationError):
            StdioConfig(command="x").command = "y"  # type: ignore[misc]
        with pytest.raises(ValidationError):
            settings.spool.max_inline_bytes = 1  # type: ignore[misc]

    def test_equal_settings_compare_equal(self, write):
        """Loading the same file twice gives equal values; one changed setting makes them differ."""
        assert load(write(FULL), environ={}) == load(write(FULL), environ={})
        changed = load(write(FULL.replace("call_timeout: 9", "call_timeout: 8"), "b.yaml"), environ={})
        assert load(write(FULL), environ={}).extensions["fs"] == changed.extensions["fs"]
        assert load(write(FULL), environ={}).extensions["time"] != changed.extensions["time"]

    def test_unknown_keys_rejected_by_models(self):
        """Models forbid unknown keys even when built directly."""
        with pytest.raises(ValidationError, match="Extra inputs"):
            StdioConfig(command="x", comand="y")
        with pytest.raises(ValidationError, match="Extra inputs"):
            Settings(bogus=1)

    def test_all_is_complete(self):
        """Every name in __all__ exists."""
        assert all(hasattr(config, name) for name in config.__all__)


class TestGatewaySettings:
    def test_defaults(self, write) -> None:
        """The gateway's name budget defaults to 64 and every tool is shown."""
        settings = load(write("extensions: {a: {command: x}}\n"), environ=SOCKET)
        assert settings.gateway.max_name_length == 64
        assert settings.extensions["a"].tools.allow == ["*"]
        assert settings.extensions["a"].tools.deny == []

    def test_http_off_loopback_needs_a_token(self, write) -> None:
        """Listening beyond loopback without a bearer token is a config error naming the field."""
        errors = errors_of(write("gateway: {http: {enabled: true, host: 0.0.0.0}}\n"), environ=SOCKET)
        assert any("gateway.http" in e and "token" in e for e in errors), errors
        text = "gateway: {http: {enabled: true, host: 0.0.0.0, token: s3cret-s3cret-s3cret}}\n"
        settings = load(write(text), environ=SOCKET)
        assert "s3cret" not in repr(settings)

    @pytest.mark.parametrize("token", ["''", "short"])
    def test_a_token_too_short_to_guard_anything_is_refused(self, write, token: str) -> None:
        """An empty token would turn the check off; a short one is guessable: both are errors."""
        text = f"gateway: {{http: {{enabled: true, host: 0.0.0.0, token: {token}}}}}\n"
        errors = errors_of(write(text), environ=SOCKET)
        assert any("gateway.http" in e and "16 characters" in e for e in errors), errors

    def test_http_on_loopback_needs_no_token(self, write) -> None:
        for host in ("127.0.0.1", "::1", "localhost"):
            load(write(f"gateway: {{http: {{enabled: true, host: '{host}'}}}}\n"), environ=SOCKET)
