"""A real daemon against hostile clients: every listener bounded, the operator always gets in.

Each test plays an attacker on one listener (half-open HTTP connections, stalled bodies, spool
directory reads, refusal floods) and checks what honest clients and the operator still get.
The listeners' bounds in isolation are tested in test_http_limits.py.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import psutil
import pytest
from mcp import Client, MCPError

from .conftest import extension_settings, first_text
from .gateway_client import gateway_session
from .test_daemon import CLI, Daemon, accepts, daemons, until  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

RICH = extension_settings("rich.py")
INLINE = 4096


class Hostile:
    """A daemon with the HTTP listener on a free port, started under an fd limit of the test's."""

    def __init__(self, daemon: Daemon, directory: Path) -> None:
        self.daemon, self.directory = daemon, directory
        self.url = ""

    @property
    def mcp_sock(self) -> str:
        return str(Path(self.daemon.socket).parent / "mcp.sock")

    @property
    def pid(self) -> int:
        assert self.daemon.proc is not None
        return self.daemon.proc.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def status_within(self, seconds: float) -> dict[str, Any]:
        started = time.monotonic()
        result = subprocess.run(
            [*CLI, "status", "--json", "--socket", self.daemon.socket],
            capture_output=True,
            text=True,
            timeout=30,
        )
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        return {"took": took, **json.loads(result.stdout)}


@pytest.fixture
def hostile(daemons: Callable[..., Daemon], short_tmp: Path) -> Iterator[Callable[..., Hostile]]:  # noqa: F811
    started: list[Daemon] = []

    def start(
        extensions: dict[str, Any], *, nofile: tuple[int, int] | None = None, **gateway: Any
    ) -> Hostile:
        daemon = daemons(extensions, start=False)
        started.append(daemon)
        config = {
            "socket": daemon.socket,
            "spool": {"dir": str(short_tmp / "spool"), "max_inline_bytes": INLINE},
            "gateway": {"http": {"enabled": True, "host": "127.0.0.1", "port": 0, **gateway}},
            "extensions": extensions,
        }
        daemon.config.write_text(json.dumps(config))

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        with daemon.log.open("ab") as log:
            daemon.proc = subprocess.Popen(
                [*CLI, "daemon", "-c", str(daemon.config)], stdout=log, stderr=log, preexec_fn=limit
            )
        until(lambda: accepts(daemon.socket) or daemon.proc.poll() is not None)  # type: ignore[union-attr]
        for name in extensions:
            daemon.wait_state(name, "running", within=20)
        http = Hostile(daemon, short_tmp)

        def listening() -> list[dict[str, Any]]:
            return [e for e in daemon.events() if e.get("event") == "gateway.http_listening"]

        until(listening)
        http.url = listening()[0]["url"].removesuffix("/mcp")
        return http

    yield start
    for daemon in started:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.terminate()  # its children go with it; `daemons` then checks that none is left


def _half_open(port: int, count: int) -> list[socket.socket]:
    flood = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /mcp HTTP/1.1\r\n")
        flood.append(sock)
    return flood


class TestFileDescriptors:
    def test_the_soft_limit_is_raised_to_the_hard_one(self, hostile) -> None:
        http = hostile({}, nofile=(256, 4096))
        limits = Path(f"/proc/{http.pid}/limits").read_text()
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
        (event,) = [e for e in http.daemon.events() if e.get("event") == "daemon.fd_limit"]
        assert event["limit"] == 4096 and event["http"] == 256

    def test_status_answers_while_a_listener_is_at_its_cap(self, hostile) -> None:
        """Under a hard limit of 256 fds, a flood of half-open HTTP connections fills the HTTP
        listener's share and no more: the control socket answers at once, mcp.sock serves."""
        http = hostile({"rich": RICH}, nofile=(256, 256))
        (plan,) = [e for e in http.daemon.events() if e.get("event") == "daemon.fd_limit"]
        flood = _half_open(http.port, 300)
        try:
            until(lambda: http.fds() >= plan["http"])
            assert http.status_within(5)["took"] < 1.0 + 1.0  # the CLI's own start is most of it
            assert http.fds() < 256

            async def honest() -> None:
                async with gateway_session(http.mcp_sock) as session:
                    assert first_text(await session.call_tool("rich__echo", {"text": "in"})) == "in"
                async with Client(http.url + "/mcp", mode="legacy") as client:
                    assert first_text(await client.call_tool("rich__echo", {"text": "in"})) == "in"

            anyio.run(honest)
            assert not [e for e in http.daemon.events() if e.get("event", "").endswith("accept_failed")]
        finally:
            for sock in flood:
                sock.close()


class TestSpoolDirectories:
    async def test_reading_a_spool_directory_is_a_clear_error_and_leaks_nothing(self, hostile) -> None:
        http = hostile({"rich": RICH})
        async with gateway_session(http.mcp_sock) as session:
            link = (await session.call_tool("rich__image", {"bytes": INLINE * 2})).content[1]
            assert isinstance(link, types.ResourceLink)
            directory = link.uri.rsplit("/", 1)[0]
            before = http.fds()
            for _ in range(200):
                with pytest.raises(MCPError) as caught:
                    await session.read_resource(directory)
                assert caught.value.error.code == -32002
                assert "directory" in caught.value.error.message
            assert http.fds() <= before + 5
            read = await session.read_resource(link.uri)  # the file itself still reads
            assert isinstance(read.contents[0], types.BlobResourceContents)


class TestBodies:
    def test_stalled_bodies_hold_no_more_than_the_budget(self, hostile) -> None:
        """Ten connections that promise 60 MiB, send 30 and stall: the daemon stays small."""
        http = hostile({"rich": RICH})
        chunk = b"{" * (1 << 20)
        head = (
            f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{http.port}\r\ncontent-type: application/json\r\n"
            f"accept: application/json, text/event-stream\r\ncontent-length: {60 << 20}\r\n\r\n"
        ).encode()
        stalled = []
        try:
            for _ in range(10):
                sock = socket.create_connection(("127.0.0.1", http.port), timeout=5)
                sock.sendall(head)
                try:
                    for _ in range(30):
                        sock.sendall(chunk)
                except OSError:  # refused (503) and closed: the budget is spent
                    pass
                stalled.append(sock)
            assert http.rss() < 200 << 20, http.rss() >> 20

            async def honest() -> None:
                async with Client(http.url + "/mcp", mode="legacy") as client:
                    assert first_text(await client.call_tool("rich__echo", {"text": "in"})) == "in"

            anyio.run(honest)
        finally:
            for sock in stalled:
                sock.close()


class TestQuietLogs:
    def test_shutdown_with_an_http_client_connected_is_prompt_and_clean(self, hostile) -> None:
        http = hostile({"rich": RICH})
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD, http.url + "/mcp"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
            started = time.monotonic()
            assert http.daemon.terminate() == 0
            assert time.monotonic() - started < 2.5  # uvicorn's graceful wait alone was 3 s
        finally:
            holder.kill()
            holder.wait()
        lines = http.daemon.log.read_text().splitlines()
        assert all(line.startswith("{") for line in lines), [
            line for line in lines if not line.startswith("{")
        ]
        errors = [json.loads(line) for line in lines if '"level": "error"' in line]
        assert errors == []

    def test_every_line_is_json_even_a_warning_of_the_sdk(self, hostile) -> None:
        """Log fan-out uses the SDK's deprecated ``Connection.log``: its warning was a raw line."""
        http = hostile({"rich": RICH})

        async def logs() -> None:
            arrived = anyio.Event()

            async def on_log(params: types.LoggingMessageNotificationParams) -> None:
                arrived.set()

            async with gateway_session(http.mcp_sock, logging_callback=on_log) as session:
                await session.set_logging_level("info")
                await session.call_tool("rich__log", {"level": "error", "message": "hello"})
                with anyio.fail_after(10):
                    await arrived.wait()

        anyio.run(logs)
        assert http.daemon.terminate() == 0
        lines = http.daemon.log.read_text().splitlines()
        assert all(line.startswith("{") for line in lines), [
            line for line in lines if not line.startswith("{")
        ]

    def test_refused_requests_are_counted_not_logged_one_by_one(self, hostile) -> None:
        http = hostile({}, token="a-token-of-sixteen-chars")
        with httpx2.Client() as client:
            for _ in range(300):
                assert client.post(http.url + "/mcp", content=b"{}").status_code == 401

        def refusals() -> list[dict[str, Any]]:
            return [e for e in http.daemon.events() if e.get("event") == "gateway.http_refused"]

        until(lambda: sum(e.get("repeated", 1) for e in refusals()) == 300)  # a summary counts its window
        assert len(refusals()) <= 10  # a line a second at most, each counting the ones it stands for


_HOLD = """
import sys, anyio
from mcp import Client
async def main():
    async with Client(sys.argv[1], mode="legacy") as client:
        await client.list_tools()
        print("holding", flush=True)
        await anyio.sleep(60)
anyio.run(main)
"""


class TestSoak:
    @pytest.mark.timeout(120)
    def test_every_attack_at_once_while_honest_clients_call(self) -> None:
        """bench/hostile.py, short and scaled down: no honest call fails, the daemon stays bounded."""
        bench = Path(__file__).parent.parent / "bench" / "hostile.py"
        result = subprocess.run(
            [sys.executable, str(bench), "--seconds", "8", "--scale", "0.3", "--unix", "2", "--http", "2"],
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        report = json.loads(result.stdout)
        assert all(report["honest"][kind]["calls"] > 0 for kind in ("unix", "http")), report
        assert report["goals"]["no_honest_errors"], report["honest"]
        assert report["goals"]["rss_under_200_mib"] and report["goals"]["fds_under_512"], report["daemon"]
        assert report["attacks"]["tokenless_flood_401"] > 0 and report["attacks"]["half_open"] > 0
