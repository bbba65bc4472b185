"""The sandbox as users get it: a real daemon, a hostile fixture server, the kernel saying no.

Every attempt of ``tests/servers/hostile.py`` is refused under the default sandbox (the network
ones under ``network: none`` / ``outbound`` as each mode promises) and succeeds, in the same
daemon, for the same server with ``sandbox: false``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.cli import render
from supervisor.control import client
from supervisor.daemon.root import instance_key
from supervisor.process import children as process
from supervisor.process import sandbox

from .conftest import extension_settings
from .test_daemon import accepts, until

pytestmark = [pytest.mark.timeout(90), pytest.mark.anyio]

CLI = [sys.executable, "-m", "supervisor"]


class SandboxedDaemon:
    """A daemon subprocess with a HOME of its own (holding a key and a .bashrc to steal)."""

    def __init__(
        self,
        directory: Path,
        config: dict[str, Any] | Path,
        prefix: list[str] | None = None,
    ) -> None:
        self.directory = directory
        self.home = directory / "home"
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
        (self.home / ".bashrc").write_text("# the user's\n")
        self.state = self.home / ".local" / "state" / "mcp-supervisor"
        self.state.mkdir(parents=True)
        (self.state / "marker").write_text("state")
        self.socket = str(directory / "control.sock")
        if isinstance(config, Path):  # a file as it is, on our socket
            self.config = config
            env_socket = {"MCP_SUPERVISOR_SOCKET": self.socket}
        else:
            self.config = directory / "config.json"
            self.config.write_text(json.dumps({"socket": self.socket, **config}))
            env_socket = {}
        self.log = directory / "daemon.log"
        # Its state under its own HOME (not the session's STATE_DIRECTORY): the test reads it there.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("XDG_", "MCP_SUPERVISOR_")) and k != "STATE_DIRECTORY"
        }
        path = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # `make run` puts the venv first
        self.env = {**env, "HOME": str(self.home), "PATH": path, **env_socket}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*(prefix or []), *CLI, "daemon", "-c", str(self.config)],
                stdout=log,
                stderr=log,
                env=self.env,
            )
        until(lambda: accepts(self.socket) or self.proc.poll() is not None, within=30)  # a loaded machine

    async def call(self, name: str, tool: str, **arguments: Any) -> dict[str, Any]:
        params = {"name": name, "tool": tool, "arguments": arguments}
        return await client.request(self.socket, "call", params, timeout=30)  # type: ignore[no-any-return]

    async def attempt(self, name: str, kind: str, target: str | int = "") -> str:
        result = await self.call(name, "attempt", kind=kind, target=str(target))
        return str(result["content"][0]["text"])

    async def logs(self, name: str) -> list[str]:
        return (await client.request(self.socket, "logs", {"name": name, "lines": 100}))["lines"]  # type: ignore[no-any-return]

    async def status(self) -> dict[str, dict[str, Any]]:
        records = (await client.request(self.socket, "status"))["extensions"]
        return {record["name"]: record for record in records}

    async def running(self, *names: str) -> dict[str, dict[str, Any]]:
        with anyio.fail_after(30):
            while True:
                records = await self.status()
                failed = [r for n, r in records.items() if n in names and r["state"] == "failed"]
                assert not failed, failed
                if all(records[n]["state"] == "running" for n in names):
                    return records
                await anyio.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        leftovers = process.find_marked(f"{instance_key(self.socket)}:")
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"processes outlived the daemon: {sorted(leftovers)}"


@pytest.fixture
def sandboxed(short_tmp: Path) -> Iterator[Any]:
    started: list[SandboxedDaemon] = []

    def make(config: dict[str, Any] | Path, prefix: list[str] | None = None) -> SandboxedDaemon:
        daemon = SandboxedDaemon(short_tmp, config, prefix)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


@pytest.fixture
def tcp_listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    name = f"mcps-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("\0" + name)
        server.listen()
        yield name


HOSTILE = {
    "confined": extension_settings("hostile.py"),
    "no_network": extension_settings("hostile.py", sandbox={"network": "none"}),
    "outbound": extension_settings("hostile.py", sandbox={"network": "outbound"}),
    "free": extension_settings("hostile.py", sandbox=False),
    "sibling": extension_settings("quick.py"),
    "media": extension_settings("media.py"),
}


class TestHostileServer:
    async def test_every_attempt_is_refused_confined_and_succeeds_unconfined(
        self, sandboxed: Any, tcp_listener: int, abstract_listener: str
    ) -> None:
        """Files, the daemon's own things, signals, ptrace and unix sockets: refused in every
        mode; TCP as each network mode says; all of it works with ``sandbox: false``."""
        daemon = sandboxed({"spool": {"max_inline_bytes": 1024}, "extensions": HOSTILE})
        records = await daemon.running(*HOSTILE)
        spooled = await daemon.call("media", "image", bytes=100_000)
        link = next(c for c in spooled["content"] if c["type"] == "resource_link")
        spool_file = link["uri"].removeprefix("file://")
        assert Path(spool_file).is_file()  # noqa: ASYNC240 - one stat in a test
        attempts = {
            "read ~/.ssh/id_ed25519": ("read", daemon.home / ".ssh" / "id_ed25519"),
            "write ~/.bashrc": ("write", daemon.home / ".bashrc"),
            "list the state directory": ("list", daemon.state),
            "read another extension's spool file": ("read", spool_file),
            "read the daemon's config": ("read", daemon.config),
            "connect to the control socket": ("connect_unix", daemon.socket),
            "kill the daemon": ("kill", daemon.proc.pid),
            "connect to an abstract unix socket": ("connect_abstract", abstract_listener),
            "ptrace a sibling": ("ptrace", records["sibling"]["pid"]),
        }
        for name in ("confined", "no_network", "outbound", "free"):
            for what, (kind, target) in attempts.items():
                outcome = await daemon.attempt(name, kind, target)
                expected = "ok" if name == "free" else "refused"
                assert outcome.startswith(expected), (name, what, outcome)
        network = {  # mode -> (connect to a local port, bind a port)
            "confined": ("ok", "ok"),  # network: all (the default)
            "outbound": ("ok", "refused"),
            "no_network": ("refused", "refused"),
            "free": ("ok", "ok"),
        }
        for name, (connect, bind) in network.items():
            assert (await daemon.attempt(name, "connect_tcp", tcp_listener)).startswith(connect), name
            assert (await daemon.attempt(name, "bind_tcp")).startswith(bind), name
        assert (daemon.home / ".bashrc").read_text().count("hostile") == 1  # only the unconfined one
        base = sandbox.tmp_base(instance_key(daemon.socket))
        assert len(os.listdir(base)) == 5  # one private temporary directory per confined extension
        daemon.stop()
        assert not os.path.exists(base)  # noqa: ASYNC240 - gone with the daemon

    async def test_a_grant_of_the_home_still_hides_its_credentials(self, sandboxed: Any) -> None:
        """`read: [~]` shows ~/.bashrc (read-only) but not ~/.ssh nor the daemon's state in it."""
        extensions = {"reader": extension_settings("hostile.py", sandbox={"read": ["~"]})}
        daemon = sandboxed({"extensions": extensions})
        await daemon.running("reader")
        assert await daemon.attempt("reader", "read", daemon.home / ".bashrc") == "ok"
        assert (await daemon.attempt("reader", "write", daemon.home / ".bashrc")).startswith("refused: EROFS")
        assert (await daemon.attempt("reader", "read", daemon.home / ".ssh" / "id_ed25519")).startswith(
            "refused"
        )
        assert (await daemon.attempt("reader", "read", daemon.state / "marker")).startswith("refused")


class TestExample:
    async def test_the_example_config_runs_confined_as_it_is(self, sandboxed: Any) -> None:
        """configs/example.yaml, unchanged: both demo servers run confined and answer."""
        daemon = sandboxed(Path(__file__).parent.parent / "configs" / "example.yaml")
        records = await daemon.running("clock", "notes")
        assert {records[n]["sandbox"]["mode"] for n in ("clock", "notes")} == {"confined"}
        now = await daemon.call("clock", "now", timezone="Europe/Paris")
        assert not now["isError"] and now["content"][0]["text"]
        added = await daemon.call("notes", "add_note", text="confined")
        assert not added["isError"], added


class TestVisible:
    async def test_status_health_and_logs_show_the_sandbox(self, sandboxed: Any) -> None:
        """status and health carry mode, network and digest; the server's refusals are in its logs;
        granting one more path changes the digest (a reload restarts it)."""
        extensions = {
            "confined": extension_settings("hostile.py", sandbox={"network": "outbound"}),
            "free": extension_settings("hostile.py", sandbox=False),
        }
        daemon = sandboxed({"extensions": extensions})
        records = await daemon.running(*extensions)
        shown = records["confined"]["sandbox"]
        assert shown["mode"] == "confined" and shown["network"] == "outbound"
        assert len(shown["digest"]) == 12
        assert records["free"]["sandbox"] == {"mode": "off"}
        health = await client.request(daemon.socket, "health")
        assert {e["name"]: e["sandbox"] for e in health["extensions"]}["confined"] == shown
        table = render.health_text(health).splitlines()
        assert table[2].split()[-1] == "SANDBOX"
        rows = {line.split()[0]: line for line in table[3:5]}
        assert rows["confined"].endswith(f"network outbound, {shown['digest'][:8]}")
        assert rows["free"].endswith("off")

        await daemon.attempt("confined", "read", daemon.home / ".ssh" / "id_ed25519")
        assert any(
            "No such file or directory" in line and "id_ed25519" in line
            for line in await daemon.logs("confined")
        )

        extensions["confined"]["sandbox"]["read"] = [str(daemon.directory)]
        daemon.config.write_text(json.dumps({"socket": daemon.socket, "extensions": extensions}))
        assert (await client.request(daemon.socket, "reload"))["restarted"] == ["confined"]
        records = await daemon.running("confined")
        assert records["confined"]["sandbox"]["digest"] != shown["digest"]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
class TestUnenforceable:
    async def test_network_none_without_network_namespaces_fails_clearly_and_alone(
        self, sandboxed: Any
    ) -> None:
        """A kernel that cannot make network namespaces: `network: none` fails for good, saying how
        to opt out; it never runs unconfined; the default sandbox still runs."""
        limit = 'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"'  # in a user namespace of its own
        extensions = {
            "offline": extension_settings("hostile.py", sandbox={"network": "none"}),
            "online": extension_settings("hostile.py"),
        }
        daemon = sandboxed(
            {"extensions": extensions}, prefix=["unshare", "-U", "-r", "sh", "-c", limit, "sh"]
        )
        await daemon.running("online")
        with anyio.fail_after(20):
            while (record := (await daemon.status())["offline"])["state"] != "failed":  # noqa: ASYNC110 - another process
                await anyio.sleep(0.05)
        assert "network namespaces" in record["last_error"]
        assert "network: outbound" in record["last_error"] and "sandbox: false" in record["last_error"]
        assert record["pid"] is None and record["restarts"] == 0
