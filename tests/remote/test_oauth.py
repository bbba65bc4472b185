"""OAuth, one login per host: a real daemon, the SDK's protected server and authorization server
on loopback (tests/servers/oauth.py), ``mcp-supervisor login`` run as a person would, the test
following the URL it prints as the person's browser would."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError

from supervisor.control.client import RemoteError
from supervisor.remote.login import MAX_CONNECTIONS
from tests.harness import CLI, SERVERS, Daemon, first_text, gateway_session, until, zygote
from tests.harness.timing import patience
from tests.remote import entry, together

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


class Protected:
    """tests/servers/oauth.py with some options: the MCP URL, and the server's own counters."""

    def __init__(self, *options: str) -> None:
        argv = [sys.executable, str(SERVERS / "oauth.py"), *options]
        self.proc = zygote.popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.url

    def entry(self, **overrides: Any) -> dict[str, Any]:
        return entry(self.url, **overrides)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def servers() -> Iterator[Callable[..., Protected]]:
    started: list[Protected] = []

    def start(*options: str) -> Protected:
        started.append(Protected(*options))
        return started[-1]

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def logged_out(daemons: Callable[..., Daemon], servers: Callable[..., Protected]) -> Callable[..., Daemon]:
    """A protected server (with these options) and a daemon whose extension ``far`` of it waits
    in needs-login (*entry*: more of its settings; the rest: the daemon's options)."""

    def start(*options: str, entry: dict[str, Any] | None = None, **daemon_options: Any) -> Daemon:
        server = servers(*options)
        daemon = daemons({"far": server.entry(**(entry or {}))}, state=True, **daemon_options)
        daemon.wait_state("far", "needs-login")
        return daemon

    return start


class Login:
    """``mcp-supervisor login NAME`` running, as a person runs it: the URL it printed."""

    def __init__(self, daemon: Daemon, name: str, *options: str, env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")} | (env or {})
        argv = [*CLI, "login", name, "--socket", daemon.socket, *options]
        self.proc = zygote.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def approve(self) -> httpx2.Response:
        assert self.url.startswith("http://127.0.0.1:"), self.outcome()
        return approve(self.url)

    def outcome(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=patience(30))
        return self.proc.returncode, out, err


def approve(url: str) -> httpx2.Response:
    """Follow the authorization *url*, as the browser does: the server consents at once and
    redirects to the daemon's loopback receiver, whose answer this is."""
    consent = httpx2.get(url, follow_redirects=False, timeout=patience(10))
    assert consent.status_code in (302, 303, 307), consent.text
    return httpx2.get(consent.headers["location"], timeout=patience(10))


def stats(daemon: Daemon, name: str = "far") -> dict[str, int]:
    return json.loads(text(daemon.call(name, "stats")))  # type: ignore[no-any-return]


def text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


def logged_in(daemon: Daemon, name: str = "far") -> None:
    login = Login(daemon, name, "--no-browser")
    assert login.approve().status_code == 200
    code, out, err = login.outcome()
    assert code == 0, err
    assert f"logged in: {name!r} is running" in out


class TestNeedsLogin:
    async def test_it_waits_in_needs_login_and_a_call_says_what_to_run(
        self, daemons: Callable[..., Daemon], servers: Callable[..., Protected]
    ) -> None:
        """A 401 is no crash: no restart loop, no registration behind the person's back, and a
        call names the command that helps."""
        server = servers()
        daemon = daemons({"far": server.entry()}, state=True)
        status = daemon.wait_state("far", "needs-login")
        assert status["restarts"] == 0 and "mcp-supervisor login far" in status["last_error"], status
        with pytest.raises(RemoteError, match=r"needs-login.*log in with `mcp-supervisor login far`"):
            daemon.call("far", "echo", text="hi")
        async with gateway_session(daemon.mcp_sock) as session:
            result = await session.call_tool("far__echo", {"text": "hi"})
        assert result.is_error and "mcp-supervisor login far" in first_text(result)
        assert daemon.status()["far"]["state"] == "needs-login"
        assert len([e for e in daemon.find("extension.state") if e.get("state") == "starting"]) == 1
        (row,) = [line for line in daemon.ok("status").splitlines() if line.startswith("far ")]
        assert row.split()[:2] == ["far", "needs-login"] and "run `mcp-supervisor login far`" in row, row


class TestLogin:
    async def test_one_login_serves_every_client_and_shows_no_token(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """The person follows the printed URL once; the extension runs; two gateway clients at
        once call through the one login; the token file is the daemon user's alone and no token
        is in status or the log."""
        daemon = logged_out()
        logged_in(daemon)
        async with gateway_session(daemon.mcp_sock) as one, gateway_session(daemon.mcp_sock) as two:
            results: list[Any] = []

            async def call(session: Any, words: str) -> None:
                results.append(first_text(await session.call_tool("far__echo", {"text": words})))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, one, "one")
                tg.start_soon(call, two, "two")
        assert sorted(results) == ["one", "two"]
        counts = stats(daemon)
        assert counts["authorization_code"] == 1 and counts["registered"] == 1, counts
        (row,) = [line for line in daemon.ok("status").splitlines() if line.startswith("far ")]
        assert "logged in, token 59m" in row and "refreshable" in row, row
        login = daemon.status()["far"]["remote"]["login"]
        assert login["logged_in"] and login["refreshable"] and login["expires_at"] > time.time(), login
        (token_file,) = (daemon.state / "oauth").glob("*/far.json")
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        tokens = json.loads(token_file.read_text())["tokens"]
        for secret in (tokens["access_token"], tokens["refresh_token"]):
            assert secret not in json.dumps(daemon.status()) and secret not in daemon.log.read_text()

    async def test_the_url_opens_in_the_browser_where_there_is_a_display(
        self, logged_out: Callable[..., Daemon], tmp_path: Path
    ) -> None:
        """With a display, ``login`` hands the URL to the user's browser ($BROWSER here: a script
        that notes it), and that URL logs in."""
        daemon = logged_out()
        noted = tmp_path / "opened"
        browser = tmp_path / "browser"
        browser.write_text(f'#!/bin/sh\necho "$1" > {noted}\n')
        browser.chmod(0o755)
        login = Login(daemon, "far", env={"DISPLAY": ":99", "BROWSER": str(browser)})
        until(lambda: noted.exists() and noted.read_text().strip() == login.url, within=patience(10))
        assert login.approve().status_code == 200
        code, _, err = login.outcome()
        assert code == 0, err

    async def test_tokens_survive_a_restart_and_are_refreshed_before_they_expire(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """Two-second tokens: calls keep working past many expiries with refreshes, not logins,
        and a new daemon on the same state serves at once with the stored refresh token."""
        daemon = logged_out("--expires", "2")
        logged_in(daemon)
        until(lambda: stats(daemon)["refresh_token"] >= 2, within=patience(20), interval=0.5)
        daemon.kill()
        daemon.start()
        daemon.wait_state("far", "running")
        assert text(daemon.call("far", "echo", text="after a restart")) == "after a restart"
        counts = stats(daemon)
        assert counts["authorization_code"] == 1 and counts["registered"] == 1, counts

    async def test_per_client_instances_share_the_login_and_its_refreshes(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """Two clients, one upstream session each, two-second tokens with rotating refresh
        tokens: each session picks up what the other refreshed, and nobody is asked to log in
        again."""
        daemon = logged_out("--expires", "2", entry=dict(instances="per-client"))
        logged_in(daemon)
        async with gateway_session(daemon.mcp_sock) as one, gateway_session(daemon.mcp_sock) as two:

            async def keep_calling(session: Any) -> int:
                served, stats_now = 0, {"refresh_token": 0}
                while stats_now["refresh_token"] < 3:
                    result = await session.call_tool("far__stats", {})
                    assert not result.is_error, first_text(result)
                    stats_now, served = json.loads(first_text(result)), served + 1
                    await anyio.sleep(0.2)
                return served

            with anyio.fail_after(patience(30)):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(keep_calling, one)
                    tg.start_soon(keep_calling, two)
        counts = stats(daemon)
        assert counts["authorization_code"] == 1 and counts["refresh_token"] >= 3, counts

    async def test_a_revoked_login_returns_to_needs_login_once(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        daemon = logged_out(entry=dict(ping_interval=0.2))
        logged_in(daemon)
        assert text(daemon.call("far", "revoke_all")) == "revoked"
        status = daemon.wait_state("far", "needs-login")
        assert "mcp-supervisor login far" in status["last_error"], status
        assert daemon.status()["far"]["restarts"] == 0

    async def test_logout_revokes_and_forgets(self, logged_out: Callable[..., Daemon]) -> None:
        daemon = logged_out()
        logged_in(daemon)
        revoked_before = stats(daemon)["revoked"]
        assert "revoked and forgotten" in daemon.ok("logout", "far")
        daemon.wait_state("far", "needs-login")
        assert not list((daemon.state / "oauth").glob("*/far.json"))
        logged_in(daemon)  # the server saw the revocation: count it through a new login
        assert stats(daemon)["revoked"] >= revoked_before + 1

    async def test_a_preregistered_client_logs_in_with_its_secret(
        self, logged_out: Callable[..., Daemon], tmp_path: Path
    ) -> None:
        port = _free_port()
        credentials = tmp_path / "credentials"
        credentials.mkdir()
        (credentials / "oauth-secret").write_text("s3cret\n")
        oauth = {
            "client_id": "fixed-client",
            "client_secret": "${credential:oauth-secret}",
            "callback_port": port,
        }
        env = {"CREDENTIALS_DIRECTORY": str(credentials)}
        daemon = logged_out(
            "--preregistered", f"fixed-client:s3cret:{port}", entry=dict(oauth=oauth), env=env
        )
        logged_in(daemon)
        assert json.loads(text(daemon.call("far", "whoami")))["client_id"] == "fixed-client"
        assert stats(daemon)["registered"] == 0


class TestMetadataDocument:
    async def test_a_server_taking_client_id_metadata_documents_gets_the_url_as_client_id(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """``client_metadata_url``: where the server advertises Client ID Metadata Documents, the
        login uses the document's URL as its client id and registers nothing."""
        port = _free_port()
        document = "https://clients.example/mcp-supervisor.json"
        oauth = {"client_metadata_url": document, "callback_port": port}
        daemon = logged_out("--cimd", str(port), entry={"oauth": oauth})
        logged_in(daemon)
        assert json.loads(text(daemon.call("far", "whoami")))["client_id"] == document
        assert stats(daemon)["registered"] == 0


class TestFromTheClient:
    @pytest.mark.parametrize("path", ["sdk", "fast"])
    async def test_a_client_that_opens_urls_is_asked_to_log_in(
        self, logged_out: Callable[..., Daemon], path: str
    ) -> None:
        """A 2025-11-25 client declaring URL-mode elicitation that calls a tool of a logged-out
        server gets URLElicitationRequiredError (-32042) naming the authorization URL; once its
        person followed it, the same call goes through. On the SDK's path, and on the fast path
        (a client that listed tools)."""
        daemon = logged_out(entry={"ping_interval": 0.2})
        logged_in(daemon)  # its tools are known (and saved) from now on
        assert text(daemon.call("far", "revoke_all")) == "revoked"
        daemon.wait_state("far", "needs-login")

        async def elicit(context: Any, params: Any) -> Any:
            raise AssertionError("the gateway answers with the error; it does not ask")

        async with gateway_session(daemon.mcp_sock, elicitation_callback=elicit) as session:
            if path == "fast":
                assert "far__echo" in {tool.name for tool in (await session.list_tools()).tools}
            with pytest.raises(MCPError) as refused:
                await session.call_tool("far__echo", {"text": "hi"})
            assert refused.value.error.code == -32042, refused.value.error
            (asked,) = refused.value.error.data["elicitations"]
            assert asked["mode"] == "url" and asked["elicitationId"] and "far" in asked["message"]
            assert approve(asked["url"]).status_code == 200
            daemon.wait_state("far", "running")
            assert first_text(await session.call_tool("far__echo", {"text": "hi"})) == "hi"


class TestDevice:
    async def test_a_device_code_logs_in_a_host_without_a_browser(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """``login --device``: the command prints where to go and the code; the person approves
        on another device (here: the URL carrying the code); the daemon, polling, gets the tokens."""
        daemon = logged_out("--device")
        login = Login(daemon, "far", "--device")
        assert "/device?user_code=" in login.url, login.outcome()
        assert httpx2.get(login.url, timeout=patience(10)).status_code == 200  # the person approves
        code, _, err = login.outcome()
        assert code == 0 and "enter the code" in err, err
        assert text(daemon.call("far", "echo", text="from afar")) == "from afar"
        assert stats(daemon)["device_code"] == 1

    async def test_a_server_without_device_login_says_so(self, logged_out: Callable[..., Daemon]) -> None:
        daemon = logged_out()
        result = daemon.cli("login", "far", "--device")
        assert result.returncode == 1 and "offers no device login" in result.stderr, result.stderr


class TestStepUp:
    async def test_a_call_refused_for_a_wider_scope_waits_for_a_login_that_asks_for_it(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """A 403 ``insufficient_scope`` is a login to wait for, not a crash; the next login asks
        for the scope the server named on top of the one granted, and the call then goes through."""
        daemon = logged_out()
        logged_in(daemon)
        with pytest.raises(RemoteError):
            daemon.call("far", "admin")
        status = daemon.wait_state("far", "needs-login")
        assert "wider scope (mcp admin)" in status["last_error"], status
        logged_in(daemon)
        assert text(daemon.call("far", "admin")) == "admin done"
        assert json.loads(text(daemon.call("far", "whoami")))["scopes"] == ["mcp", "admin"]


class TestMachine:
    async def test_client_credentials_log_in_with_no_person(
        self, daemons: Callable[..., Daemon], servers: Callable[..., Protected], tmp_path: Path
    ) -> None:
        """``grant: client_credentials``: the run logs in as the client itself, and again when its
        two-second token lapses; no login command, no needs-login."""
        server = servers("--machine", "robot:beep", "--expires", "2")
        credentials = tmp_path / "credentials"
        credentials.mkdir()
        (credentials / "robot").write_text("beep\n")
        oauth = {"grant": "client_credentials", "client_id": "robot", "client_secret": "${credential:robot}"}
        env = {"CREDENTIALS_DIRECTORY": str(credentials)}
        daemon = daemons({"far": server.entry(oauth=oauth)}, state=True, env=env)
        daemon.wait_state("far", "running")
        assert json.loads(text(daemon.call("far", "whoami")))["client_id"] == "robot"
        until(lambda: stats(daemon)["client_credentials"] >= 2, within=patience(20), interval=0.5)
        assert daemon.status()["far"]["restarts"] == 0

    @pytest.mark.parametrize("grant", ["authorization_code", "client_credentials"])
    async def test_calls_run_at_once_under_a_login(
        self, daemons: Callable[..., Daemon], servers: Callable[..., Protected], tmp_path: Path, grant: str
    ) -> None:
        """The login is locked while a request is signed, not while it is answered: 8 calls to
        a server answering in JSON bodies (headers when the tool is done) run at once. The
        SDK's providers held the lock until each answer's headers: one call at a time."""
        server = servers("--machine", "robot:beep", "--json")
        credentials = tmp_path / "credentials"
        credentials.mkdir()
        (credentials / "robot").write_text("beep\n")
        if grant == "client_credentials":
            oauth = {"grant": grant, "client_id": "robot", "client_secret": "${credential:robot}"}
        else:
            oauth = {}
        env = {"CREDENTIALS_DIRECTORY": str(credentials)}
        daemon = daemons({"far": server.entry(oauth=oauth)}, state=True, env=env)
        if grant == "authorization_code":
            logged_in(daemon)
        daemon.wait_state("far", "running")
        assert await together(daemon, 8) == ["8"] * 8


class TestRefused:
    async def test_another_state_on_the_redirect_is_refused_and_the_login_waits_on(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        daemon = logged_out()
        login = Login(daemon, "far", "--no-browser")
        consent = httpx2.get(login.url, follow_redirects=False, timeout=patience(10))
        forged = consent.headers["location"].split("?")[0] + "?code=stolen&state=forged"
        refused = httpx2.get(forged, timeout=patience(10))
        assert refused.status_code == 400 and "not the login" in refused.text
        assert httpx2.get(consent.headers["location"], timeout=patience(10)).status_code == 200
        code, _, err = login.outcome()
        assert code == 0, err

    async def test_a_silent_or_oversized_visitor_of_the_receiver_costs_the_login_nothing(
        self, logged_out: Callable[..., Daemon]
    ) -> None:
        """The loopback receiver is open to every local user while it waits: connections that say
        nothing (as many as it serves at once, and one more) and one that sends more than a request
        head never block the person's redirect; a second ``login`` meanwhile joins the one under
        way (same URL)."""
        daemon = logged_out()
        login = Login(daemon, "far", "--no-browser")
        assert daemon.request("login", {"name": "far"})["url"] == login.url
        consent = httpx2.get(login.url, follow_redirects=False, timeout=patience(10))
        port = int(consent.headers["location"].split(":")[2].split("/")[0])
        holders = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]
        with socket.create_connection(("127.0.0.1", port)) as silent:
            with socket.create_connection(("127.0.0.1", port)) as flooding:
                flooding.sendall(b"GET /callback?" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n")
                flooding.settimeout(patience(15))
                try:
                    answer = flooding.recv(100)
                except ConnectionResetError:  # closed with the rest unread
                    answer = b""
                assert answer == b""  # closed without an answer
            assert httpx2.get(consent.headers["location"], timeout=patience(10)).status_code == 200
            code, _, err = login.outcome()
            assert code == 0, err
            assert silent.fileno() >= 0
        for holder in holders:
            holder.close()

    @pytest.mark.parametrize(
        ("options", "words"),
        [
            (("--deny",), "refused: access_denied (the user said no)"),
            (("--issuer", "http://elsewhere.example"), "issuer"),
            (
                ("--authorize-at", "http://login.example/authorize"),
                "uses http://login.example/authorize, plain http:// off loopback",
            ),
            (("--token-bytes", "64"), "Invalid token response"),
            (("--token-bytes", "300000"), "over 65536 bytes"),
        ],
    )
    async def test_a_bad_answer_fails_the_login_in_words(
        self,
        logged_out: Callable[..., Daemon],
        options: tuple[str, ...],
        words: str,
    ) -> None:
        daemon = logged_out(*options, entry=dict(max_message_bytes=65536))
        login = Login(daemon, "far", "--no-browser", "--wait", str(patience(20)))
        if login.url.startswith("http"):
            consent = httpx2.get(login.url, follow_redirects=False, timeout=patience(10))
            if consent.status_code in (302, 303, 307):
                httpx2.get(consent.headers["location"], timeout=patience(10))
        code, _, err = login.outcome()
        assert code == 1 and words in err, err
        assert daemon.status()["far"]["state"] == "needs-login"
        assert not daemon.problems()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
