"""Secrets out of the YAML: ``${file:PATH}`` and ``${credential:NAME}`` in env, read at spawn only."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.config import fields
from supervisor.config import settings as config
from supervisor.config.secrets import MAX_SECRET_BYTES, EnvTemplate, Reference, read_secret, resolve
from supervisor.errors import ConfigError, SpawnError
from tests.harness import CLI, Daemon, extension_settings, first_text, gateway_session, zygote
from tests.harness.timing import patience

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

FILE_SECRET = "s3cret-from-a-file"
CREDENTIAL_SECRET = "s3cret-from-a-credential"


def load(env: dict[str, Any], environ: dict[str, str] | None = None, **entry: Any) -> config.StdioConfig:
    raw = {"extensions": {"fx": {"command": "x", "env": env, **entry}}}
    environ = {"HOME": "/home/u", **(environ or {})}
    token = fields.LOADING.set(fields.Loading(raw, environ))
    try:
        return config.Settings().extensions["fx"]
    finally:
        fields.LOADING.reset(token)


class TestConfig:
    def test_a_reference_stays_a_reference_and_the_rest_expands_as_before(self) -> None:
        env = load(
            {
                "TOKEN": "Bearer ${file:/run/secrets/token} $$ ${USER}",
                "KEY": "${credential:api.key}",
                "HOMEFILE": "${file:~/.token}",
                "PLAIN": "${USER}-$${file:/x}",  # $$: a literal, never read
                "VARIABLE": "${file:-fallback}",  # the variable `file`, with a default
            },
            {"USER": "alice"},
        ).env
        assert env["TOKEN"] == EnvTemplate(("Bearer ", Reference("file", "/run/secrets/token"), " $ alice"))
        assert str(env["TOKEN"]) == "Bearer ${file:/run/secrets/token} $$ alice"
        assert env["KEY"] == EnvTemplate((Reference("credential", "api.key"),))
        assert env["HOMEFILE"] == EnvTemplate((Reference("file", "/home/u/.token"),))
        assert env["PLAIN"] == "alice-${file:/x}" and env["VARIABLE"] == "fallback"

    def test_loading_twice_gives_equal_settings(self) -> None:
        """A reload compares references: an unchanged config restarts nothing, whatever the secret."""
        assert load({"T": "${file:/x}"}) == load({"T": "${file:/x}"}) != load({"T": "${file:/y}"})

    @pytest.mark.parametrize(
        ("entry", "error"),
        [
            ({"args": ["--token", "${file:/x}"]}, "allowed in env values only"),
            ({"command": "${credential:c}"}, "allowed in env values only"),
            ({"env": {"T": "${file:relative/x}"}}, "must be absolute"),
            ({"env": {"T": "${credential:../x}"}}, "a credential name is"),
            ({"env": {"T": "${credential:}"}}, "a credential name is"),
        ],
    )
    def test_references_elsewhere_or_malformed_are_errors(self, entry: dict[str, Any], error: str) -> None:
        with pytest.raises(config.ValidationError, match=error):
            load(**{"env": {}, **entry})


class TestReading:
    def test_one_trailing_newline_is_dropped(self, tmp_path: Path) -> None:
        path = tmp_path / "s"
        for content, value in ((b"abc\n", "abc"), (b"abc\r\n", "abc"), (b"abc\n\n", "abc\n"), (b"", "")):
            path.write_bytes(content)
            assert read_secret(Reference("file", str(path)), None) == value

    @pytest.mark.parametrize(
        ("make", "why"),
        [
            (lambda p: None, "no such file"),
            (lambda p: p.mkdir(), "not a regular file"),
            (lambda p: os.mkfifo(p), "not a regular file"),  # refused, never waited on
            (lambda p: p.write_bytes(b"SECRET" * (MAX_SECRET_BYTES // 6 + 1)), "over 65536 bytes"),
            (lambda p: p.write_bytes(b"SECRET\0x"), "NUL"),
        ],
    )
    def test_bad_files_are_refused_by_reference_never_by_content(
        self, tmp_path: Path, make: Callable[[Path], None], why: str
    ) -> None:
        path = tmp_path / "s"
        make(path)
        with pytest.raises(SpawnError) as caught:
            read_secret(Reference("file", str(path)), None)
        assert str(caught.value).startswith(f"${{file:{path}}}: ") and why in str(caught.value)
        assert caught.value.permanent and "SECRET" not in str(caught.value)

    def test_a_symlink_is_followed_to_its_file(self, tmp_path: Path) -> None:
        """As Kubernetes and Docker mount secrets: a link to a regular file."""
        (tmp_path / "real").write_text("value")
        (tmp_path / "link").symlink_to(tmp_path / "real")
        assert read_secret(Reference("file", str(tmp_path / "link")), None) == "value"

    def test_a_credential_comes_from_the_credentials_directory(self, tmp_path: Path) -> None:
        (tmp_path / "api").write_text("value\n")
        assert read_secret(Reference("credential", "api"), str(tmp_path)) == "value"
        with pytest.raises(SpawnError, match=r"\$\{credential:api\}: \$CREDENTIALS_DIRECTORY is not set"):
            read_secret(Reference("credential", "api"), None)

    def test_resolve_names_the_variable_and_leaves_plain_values_alone(self, tmp_path: Path) -> None:
        plain = {"A": "1"}
        assert anyio.run(resolve, plain, None) is plain  # nothing to read: no thread, same mapping
        missing = {"A": "1", "TOKEN": EnvTemplate((Reference("file", str(tmp_path / "nope")),))}
        with pytest.raises(SpawnError, match=rf"^env TOKEN: \$\{{file:{tmp_path}/nope\}}: no such file$"):
            anyio.run(resolve, missing, None)


def getenv(**env: str) -> dict[str, Any]:
    return extension_settings("getenv.py", env=env)


class TestThroughTheDaemon:
    def test_the_child_sees_the_secrets_and_nothing_shows_them(
        self,
        pinned: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """Via a file and a systemd credential: the child's environment has them; status, tools, health,
        check-config, reload and the daemon's log only ever name the references."""
        secret = short_tmp / "token"
        secret.write_text(FILE_SECRET + "\n")
        credentials = short_tmp / "credentials"
        credentials.mkdir()
        (credentials / "api").write_text(CREDENTIAL_SECRET)
        extension = getenv(TOKEN=f"Bearer ${{file:{secret}}}", API="${credential:api}")
        daemon = pinned({"fx": extension}, env={"CREDENTIALS_DIRECTORY": str(credentials)})
        daemon.wait_state("fx", "running")

        async def ask(name: str) -> str:
            async with gateway_session(daemon.mcp_sock) as session:
                return first_text(await session.call_tool("fx__getenv", {"name": name}))

        assert anyio.run(ask, "TOKEN") == f"Bearer {FILE_SECRET}"
        assert anyio.run(ask, "API") == CREDENTIAL_SECRET
        assert anyio.run(ask, "CREDENTIALS_DIRECTORY") == "(unset)"  # not the way to every credential

        secret.write_text("another-s3cret")  # read at spawn: a reload sees the same config
        assert json.loads(daemon.ok("reload", "--json"))["unchanged"] == ["fx"]
        shown = [
            daemon.ok("status", "--json"),
            daemon.ok("status", "fx"),
            daemon.ok("tools", "--json"),
            daemon.ok("health", "--json"),
            daemon.ok("health", "--prometheus"),
            zygote.run([*CLI, "check-config", str(daemon.config)], timeout=patience(30)).stdout,
            daemon.log.read_text(),
        ]
        assert "fx" in shown[-2]
        for text in shown:
            assert "s3cret" not in text, text
        daemon.ok("restart", "fx")  # the next spawn reads the secret again
        assert anyio.run(ask, "TOKEN") == "Bearer another-s3cret"

    def test_the_daemons_own_settings_are_not_inherited(self, pinned: Callable[..., Daemon]) -> None:
        """A gateway token given to the daemon in its environment (and every other MCP_SUPERVISOR_*
        variable) is the daemon's: a child that reads it could call every extension through HTTP."""
        own = {"MCP_SUPERVISOR_GATEWAY__HTTP__TOKEN": "t0ken-of-the-daemon", "MCP_SUPERVISOR_HEAD_START": "1"}
        daemon = pinned({"fx": getenv(MINE="kept")}, env=own)
        daemon.wait_state("fx", "running")

        async def ask(name: str) -> str:
            async with gateway_session(daemon.mcp_sock) as session:
                return first_text(await session.call_tool("fx__getenv", {"name": name}))

        assert anyio.run(ask, "MINE") == "kept"
        for name in (*own, "MCP_SUPERVISOR_SOCKET"):
            assert anyio.run(ask, name) == "(unset)", name

    def test_a_missing_secret_fails_the_start_for_good_naming_the_reference(
        self,
        pinned: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        daemon = pinned(
            {
                "file": getenv(TOKEN=f"${{file:{short_tmp}/absent}}"),
                "cred": getenv(API="${credential:api}"),  # the daemon has no $CREDENTIALS_DIRECTORY
            },
            env={"CREDENTIALS_DIRECTORY": ""},
        )
        failed = daemon.wait_state("file", "failed")
        assert failed["last_error"] == f"env TOKEN: ${{file:{short_tmp}/absent}}: no such file"
        assert failed["restarts"] == 0  # permanent: not retried
        cred = daemon.wait_state("cred", "failed")
        assert "env API: ${credential:api}: $CREDENTIALS_DIRECTORY is not set" in cred["last_error"]
        started = daemon.cli("start", "file")
        assert started.returncode == 1 and "no such file" in started.stderr


def test_check_config_reads_no_secret(tmp_path: Path) -> None:
    """Validation keeps the reference: a secret file absent where the config is checked is fine."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"extensions": {"fx": {"command": "x", "env": {"T": "${file:/nonexistent/t}"}}}})
    )
    assert config.load(path).extensions["fx"].env["T"] == EnvTemplate((Reference("file", "/nonexistent/t"),))
    path.write_text(json.dumps({"extensions": {"fx": {"command": "x", "args": ["${file:/t}"]}}}))
    with pytest.raises(
        ConfigError, match=r"extensions\.fx\.args\.0.*'\$\{file:/t\}' is allowed in env values only"
    ):
        config.load(path)
