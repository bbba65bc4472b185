"""Remote extensions: a real daemon supervising the SDK's own server over streamable HTTP and
HTTP+SSE on loopback (tests/servers/remote.py), through the control socket and the gateway."""

from __future__ import annotations

import contextlib
import json
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.control.client import RemoteError
from tests.harness import Daemon, first_text, gateway_session, until
from tests.harness.timing import fail_after, patience
from tests.remote import Remote, text

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


class TestRuns:
    @pytest.mark.parametrize(
        ("mode", "kind"), [("http", "http"), ("json", "auto"), ("sse", "auto"), ("sse", "sse")]
    )
    async def test_it_runs_lists_and_serves_calls_on_every_transport(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], mode: str, kind: str
    ) -> None:
        """Running means the handshake and first list succeeded; its tools reach the control
        socket and every gateway client under the extension's prefix. ``auto`` finds SSE where
        the server refuses streamable HTTP."""
        remote = remotes(mode)
        daemon = daemons({"far": remote.entry(type=kind)})
        status = daemon.wait_state("far", "running")
        assert status["pid"] is None and status["sandbox"] == {"mode": "remote"}, status
        assert "echo" in {tool["name"] for tool in daemon.request("tools", {"name": "far"})["tools"]}
        assert text(daemon.call("far", "echo", text="over http")) == "over http"
        async with gateway_session(daemon.mcp_sock) as session:
            result = await session.call_tool("far__echo", {"text": "through the gateway"})
            assert first_text(result) == "through the gateway"

    async def test_headers_reach_the_server_and_secrets_show_nowhere(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], tmp_path: Path
    ) -> None:
        """A header's ``${credential:NAME}`` is read at connect from the credentials directory;
        the server gets it, and neither status nor the daemon's log holds it."""
        remote = remotes("http")
        credentials = tmp_path / "credentials"
        credentials.mkdir()
        (credentials / "token").write_text("s3cr3t-value\n")
        entry = remote.entry(headers={"X-Token": "${credential:token}", "X-Plain": "plain"})
        daemon = daemons({"far": entry}, env={"CREDENTIALS_DIRECTORY": str(credentials)})
        daemon.wait_state("far", "running")
        seen = json.loads(text(daemon.call("far", "headers")))
        assert seen == {"x-token": "s3cr3t-value", "x-plain": "plain"}
        assert "s3cr3t" not in json.dumps(daemon.status()) and "s3cr3t" not in daemon.log.read_text()

    async def test_a_missing_secret_fails_the_extension_and_names_the_header(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], tmp_path: Path
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(headers={"X-Token": "${credential:absent}"})})
        status = daemon.wait_state("far", "failed")
        assert status["last_error"].startswith("headers X-Token:"), status


class TestSeen:
    async def test_status_shows_the_url_transport_protocol_and_round_trip(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("sse")
        daemon = daemons({"far": remote.entry(ping_interval=0.2)})
        daemon.wait_state("far", "running")
        until(lambda: daemon.status()["far"]["remote"].get("rtt_ms") is not None, within=patience(10))
        seen = daemon.status()["far"]["remote"]
        assert (seen["url"], seen["transport"], seen["protocol"]) == (remote.url, "sse", "2025-11-25"), seen
        assert 0 < seen["rtt_ms"] < 10_000, seen
        (row,) = [line for line in daemon.ok("status").splitlines() if line.startswith("far ")]
        assert row.split()[:3] == ["far", "running", "remote"] and f"{remote.url} (sse, " in row, row

    async def test_its_log_messages_are_what_logs_shows(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        daemon.wait_state("far", "running")
        assert text(daemon.call("far", "log", text="hello from afar")) == "logged"
        lines = lambda: daemon.request("logs", {"name": "far", "lines": 10})["lines"]  # noqa: E731
        until(lambda: "info remote: hello from afar" in lines(), within=patience(10))

    async def test_the_environment_s_proxy_is_used(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """HTTP_PROXY is honoured: the request goes to the proxy, in absolute form (here a proxy
        that answers 502, which the extension's start then names)."""
        remote = remotes("http")
        seen: list[bytes] = []
        proxy = socket.create_server(("127.0.0.1", 0))

        def serve() -> None:
            with contextlib.suppress(OSError):
                while True:
                    peer, _ = proxy.accept()
                    with peer:
                        seen.append(peer.recv(65536).split(b"\r\n", 1)[0])
                        peer.sendall(
                            b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )

        threading.Thread(target=serve, daemon=True).start()
        try:
            env = {"HTTP_PROXY": f"http://127.0.0.1:{proxy.getsockname()[1]}", "NO_PROXY": ""}
            daemon = daemons({"far": remote.entry(max_restarts=0)}, env=env)
            status = daemon.wait_state("far", "failed")
        finally:
            proxy.close()
        assert seen and seen[0] == f"POST {remote.url} HTTP/1.1".encode(), seen
        assert "HTTP 502" in status["last_error"], status


class TestTrust:
    def test_a_certificate_the_system_does_not_trust_is_refused(
        self, daemons: Callable[..., Daemon], tmp_path: Path
    ) -> None:
        """HTTPS is verified against the system's trust store: a self-signed server never gets
        the headers, and the error says why."""
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        remote = Remote("http", (str(cert), str(key))).start()
        try:
            daemon = daemons({"far": remote.entry(max_restarts=0)})
            status = daemon.wait_state("far", "failed")
        finally:
            remote.kill()
        assert "CERTIFICATE_VERIFY_FAILED" in status["last_error"], status

    def test_a_redirect_to_another_origin_is_not_followed(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """The configured headers never leave the URL's origin: a 307 elsewhere fails that call
        and the other origin sees no request."""
        remote = remotes("http")
        elsewhere = socket.create_server(("127.0.0.1", 0))
        elsewhere.settimeout(0.5)
        try:
            daemon = daemons({"far": remote.entry(headers={"X-Token": "not-for-others"})})
            daemon.wait_state("far", "running")
            other = f"http://127.0.0.1:{elsewhere.getsockname()[1]}/mcp"
            assert text(daemon.call("far", "redirect_next", url=other)) == "armed"
            with pytest.raises(RemoteError, match=r"Redirect to .* not followed"):
                daemon.call("far", "echo", text="lost")
            with pytest.raises(TimeoutError):
                elsewhere.accept()  # nobody came
        finally:
            elsewhere.close()
        assert text(daemon.call("far", "echo", text="still")) == "still"


class TestInstances:
    async def test_per_client_instances_each_hold_a_session_of_their_own(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """instances: per-client opens one upstream session per gateway client, and a client's
        leaving ends its session on the server (streamable HTTP's DELETE)."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(instances="per-client")})
        daemon.wait_state("far", "running")

        async def sessions(session: Any) -> int:
            return int(first_text(await session.call_tool("far__sessions", {})))

        async with gateway_session(daemon.mcp_sock) as a:
            alone = await sessions(a)
            async with gateway_session(daemon.mcp_sock) as b:
                assert await sessions(b) == alone + 1
                assert await sessions(a) == alone + 1
            with fail_after(patience(10)):
                # b's instance stops and its session is deleted (polled: no event says so)
                while await sessions(a) != alone:  # noqa: ASYNC110
                    await anyio.sleep(0.05)


class TestSupervision:
    async def test_a_server_that_goes_away_backs_off_and_is_back_when_it_is(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """Killed while idle, it is noticed by the liveness ping, retried with backoff while the
        port refuses, and running again (a new run, initialized anew) once the server is back."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(ping_interval=0.3, ping_timeout=1)})
        first = daemon.wait_state("far", "running")
        remote.kill()
        down = daemon.wait_state("far", "backoff")
        assert down["last_error"], down
        until(lambda: daemon.status()["far"]["restarts"] >= first["restarts"] + 2, within=patience(15))
        remote.start()  # on the same port
        daemon.wait_state("far", "running", within=patience(20))
        assert text(daemon.call("far", "echo", text="back")) == "back"

    async def test_a_call_in_flight_when_the_server_dies_fails_at_once(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """The call's error says it may or may not have run; nothing waits for call_timeout."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(call_timeout=120)})
        daemon.wait_state("far", "running")
        failed: list[BaseException] = []

        def call() -> None:
            try:
                daemon.call("far", "sleep", seconds=60)
            except Exception as exc:
                failed.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        until(lambda: daemon.status()["far"]["in_flight"] == 1, within=patience(10))
        remote.kill()
        caller.join(patience(15))
        assert not caller.is_alive(), "the call waited on"
        assert failed and "may or may not have run" in str(failed[0]), failed

    async def test_a_lost_session_is_initialized_again(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """A server that forgot the session answers its next request 404: that run ends, and the
        next one initializes a new session and serves."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        first = daemon.wait_state("far", "running")
        assert text(daemon.call("far", "forget")) == "forgotten"
        with pytest.raises(Exception):  # noqa: B017 - the 404's error, whatever its words
            daemon.call("far", "echo", text="after")
        until(lambda: daemon.status()["far"]["restarts"] > first["restarts"], within=patience(10))
        daemon.wait_state("far", "running")
        assert text(daemon.call("far", "echo", text="again")) == "again"

    async def test_a_server_error_ends_the_run_and_the_next_one_serves(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """A 5xx is the server's trouble, not the call's: the run ends (the call says it may or may
        not have run), the restart backs off, and the next run serves."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        first = daemon.wait_state("far", "running")
        assert text(daemon.call("far", "answer_next", status=503)) == "armed"
        with pytest.raises(RemoteError, match=r"HTTP 503.*may or may not have run"):
            daemon.call("far", "echo", text="lost")
        until(lambda: daemon.status()["far"]["restarts"] > first["restarts"], within=patience(10))
        daemon.wait_state("far", "running")
        assert text(daemon.call("far", "echo", text="served")) == "served"

    async def test_an_oversized_image_goes_to_the_spool_and_a_link_comes_back(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], short_tmp: Path
    ) -> None:
        """A remote server's media passes through the spool like a child's: the client gets a
        resource_link to a 0600 file holding the decoded bytes."""
        remote = remotes("json")
        spool = short_tmp / "spool"
        daemon = daemons(
            {"far": remote.entry()}, settings={"spool": {"dir": str(spool), "max_inline_bytes": 4096}}
        )
        daemon.wait_state("far", "running")
        (item,) = daemon.call("far", "image", bytes=100_000)["content"]
        assert item["type"] == "resource_link" and item["mimeType"] == "image/png", item
        assert item["size"] == 100_000
        (path,) = [p for p in spool.rglob("*") if p.is_file()]
        assert path.stat().st_size == 100_000 and stat.S_IMODE(path.stat().st_mode) == 0o600

    async def test_a_changed_tool_list_reaches_the_catalog(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        daemon.wait_state("far", "running")
        daemon.call("far", "toggle_tool")
        names = lambda: {tool["name"] for tool in daemon.request("tools", {"name": "far"})["tools"]}  # noqa: E731
        until(lambda: "extra" in names(), within=patience(10))

    async def test_an_answer_over_the_limit_fails_that_call_only(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """max_message_bytes bounds what one answer may hold in memory: over it, the call fails
        and the run serves on."""
        remote = remotes("json")
        daemon = daemons({"far": remote.entry(max_message_bytes=100_000)})
        first = daemon.wait_state("far", "running")
        with pytest.raises(RemoteError, match="100000 bytes"):  # the limit it went over, named
            daemon.call("far", "big_text", bytes=500_000)
        assert text(daemon.call("far", "echo", text="still")) == "still"
        assert daemon.status()["far"]["restarts"] == first["restarts"]


# `check-config --explain` as the CLI runs it, and which of the SDK's client modules it loaded.
EXPLAIN_PROBE = """
import sys
from supervisor.cli.main import main
code = main(sys.argv[1:])
print(sorted(m for m in sys.modules if m.startswith("mcp.client")), file=sys.stderr)
sys.exit(code)
"""


def test_explain_says_nothing_of_it_runs_here(tmp_path: Path) -> None:
    """``check-config --explain`` of a remote server: no sandbox to show, and why; it prints
    words about the config, so the SDK's client (over half of its time once) stays unloaded."""
    config = tmp_path / "config.yaml"
    config.write_text(
        f"socket: {tmp_path}/control.sock\nextensions:\n  far: {{url: 'https://example.com/mcp'}}\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", EXPLAIN_PROBE, "check-config", str(config), "--explain", "far"],
        capture_output=True,
        text=True,
        timeout=patience(60),
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "[]"
    assert result.stdout == (
        "far: a remote server (https://example.com/mcp): nothing of it runs on this host, so there "
        "is nothing to confine; the daemon sends its headers to that origin only\n"
        "  OAuth: when the server asks, the daemon logs in once for the host: `mcp-supervisor login far`; "
        "tokens stay in the daemon's state directory (0600), never in a child's view, a log or status\n"
    )
