"""The sandbox as users get it: a real daemon, a hostile fixture server, the kernel saying no.

Every attempt of ``tests/servers/hostile.py`` is refused under the default sandbox (the network
ones under ``network: none`` / ``outbound`` as each mode promises) and succeeds, in the same
daemon, for the same server with ``sandbox: false``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from supervisor.cli import render
from supervisor.control import client
from supervisor.daemon.identity import instance_key
from supervisor.process import sandbox
from tests.harness import ROOT, Daemon, extension_settings
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.timeout(90), pytest.mark.anyio]


def attempt(daemon: Daemon, name: str, kind: str, target: str | int | Path = "") -> str:
    """What tests/servers/hostile.py's attempt of *kind* on *target* came to: "ok" or "refused: ..."."""
    result = daemon.call(name, "attempt", kind=kind, target=str(target))
    return str(result["content"][0]["text"])


def logs(daemon: Daemon, name: str) -> list[str]:
    return daemon.request("logs", {"name": name, "lines": 100})["lines"]  # type: ignore[no-any-return]


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
        records = daemon.wait_running(*HOSTILE)
        spooled = daemon.call("media", "image", bytes=100_000)
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
            "read the session keyring": ("syscall", "keyctl"),
            "make a user namespace": ("syscall", "unshare_user"),
        }
        for name in ("confined", "no_network", "outbound", "free"):
            for what, (kind, target) in attempts.items():
                outcome = attempt(daemon, name, kind, target)
                expected = "ok" if name == "free" else "refused"
                assert outcome.startswith(expected), (name, what, outcome)
        network = {  # mode -> (connect to a local port, bind a port)
            "confined": ("ok", "ok"),  # network: all (the default)
            "outbound": ("ok", "refused"),
            "no_network": ("refused", "refused"),
            "free": ("ok", "ok"),
        }
        for name, (connect, bind) in network.items():
            assert (attempt(daemon, name, "connect_tcp", tcp_listener)).startswith(connect), name
            assert (attempt(daemon, name, "bind_tcp")).startswith(bind), name
        assert (daemon.home / ".bashrc").read_text().count("hostile") == 1  # only the unconfined one
        base = sandbox.tmp_base(instance_key(daemon.socket))
        assert len(os.listdir(base)) == 5  # one private temporary directory per confined extension
        daemon.terminate()
        assert not os.path.exists(base)  # noqa: ASYNC240 - gone with the daemon

    async def test_a_grant_of_the_home_still_hides_its_credentials(self, sandboxed: Any) -> None:
        """`read: [~]` shows ~/.bashrc (read-only) but not ~/.ssh nor the daemon's state in it."""
        extensions = {"reader": extension_settings("hostile.py", sandbox={"read": ["~"]})}
        daemon = sandboxed({"extensions": extensions})
        daemon.wait_running("reader")
        assert attempt(daemon, "reader", "read", daemon.home / ".bashrc") == "ok"
        assert (attempt(daemon, "reader", "write", daemon.home / ".bashrc")).startswith("refused: EROFS")
        assert (attempt(daemon, "reader", "read", daemon.home / ".ssh" / "id_ed25519")).startswith("refused")
        assert (attempt(daemon, "reader", "read", daemon.state / "marker")).startswith("refused")

    async def test_a_cache_reached_through_a_symlink_is_its_own_at_every_start(
        self, sandboxed: Any, short_tmp: Path
    ) -> None:
        """~/.cache a link to a disk elsewhere, deeper, and `read: [~]`: a package manager's
        private cache is writable at every start, and the others' are not there by either name.
        From the second start on (the caches' directory existed then) hiding them by ~/.cache's
        name used to cover the grant too: ENOENT, or EROFS for uvx."""
        disk = short_tmp / "disk" / "a" / "b" / "cache"
        (disk / "mcp-supervisor" / "extensions" / "other").mkdir(parents=True)
        (disk / "mcp-supervisor" / "extensions" / "other" / "token").write_text("another's")
        (short_tmp / "home").mkdir()
        (short_tmp / "home" / ".cache").symlink_to(disk)
        pip = short_tmp / "bin" / "pip"  # a command that gets a private pip cache
        pip.parent.mkdir()
        pip.symlink_to(sys.executable)
        settings = {**extension_settings("hostile.py", sandbox={"read": ["~"]}), "command": str(pip)}
        daemon = sandboxed({"extensions": {"pip": settings}})
        pids = [daemon.wait_running("pip")["pip"]["pid"]]
        assert attempt(daemon, "pip", "mkdir", "$PIP_CACHE_DIR") == "ok"
        daemon.request("restart", {"name": "pip"})
        pids.append(daemon.wait_running("pip")["pip"]["pid"])
        assert pids[0] != pids[1]
        assert attempt(daemon, "pip", "fill", "$PIP_CACHE_DIR/wheel 1000") == "ok"
        assert [p.name for p in disk.glob("mcp-supervisor/extensions/pip/*/wheel")] == ["wheel"]
        for way in (daemon.home / ".cache", disk):  # the other extensions' caches, by either name
            token = way / "mcp-supervisor" / "extensions" / "other" / "token"
            assert attempt(daemon, "pip", "read", token).startswith("refused"), way


class TestExample:
    async def test_the_example_config_runs_confined_as_it_is(self, sandboxed: Any) -> None:
        """configs/example.yaml, unchanged: both demo servers run confined and answer."""
        daemon = sandboxed(ROOT / "configs" / "example.yaml")
        records = daemon.wait_running("clock", "notes")
        assert {records[n]["sandbox"]["mode"] for n in ("clock", "notes")} == {"confined"}
        now = daemon.call("clock", "now", timezone="Europe/Paris")
        assert not now["isError"] and now["content"][0]["text"]
        added = daemon.call("notes", "add_note", text="confined")
        assert not added["isError"], added

    async def test_the_example_s_dashboard_link_opens_the_page(self, sandboxed: Any) -> None:
        """The quick start's `mcp-supervisor dashboard` on the example (its port moved to a free
        one by the environment, as two daemons may run here at once)."""
        daemon = sandboxed(ROOT / "configs" / "example.yaml", env={"MCP_SUPERVISOR_GATEWAY__HTTP__PORT": "0"})
        daemon.wait_running("clock", "notes")
        printed = daemon.cli("dashboard", "--no-browser")
        assert printed.returncode == 0, printed.stderr
        opened = httpx2.get(printed.stdout.strip(), follow_redirects=True, timeout=10)
        assert opened.status_code == 200 and "/dashboard/static/app.js" in opened.text


class TestVisible:
    async def test_status_health_and_logs_show_the_sandbox(self, sandboxed: Any) -> None:
        """status and health carry mode, network, digest and level; the server's refusals are in its logs;
        granting one more path changes the digest (a reload restarts it)."""
        extensions = {
            "confined": extension_settings("hostile.py", sandbox={"network": "outbound"}),
            "free": extension_settings("hostile.py", sandbox=False),
        }
        daemon = sandboxed({"extensions": extensions})
        records = daemon.wait_running(*extensions)
        shown = records["confined"]["sandbox"]
        assert shown["mode"] == "confined" and shown["network"] == "outbound"
        assert len(shown["digest"]) == 12
        assert records["free"]["sandbox"] == {"mode": "off"}
        health = await client.request(daemon.socket, "health")
        assert {e["name"]: e["sandbox"] for e in health["extensions"]}["confined"] == shown
        table = render.health_text(health).splitlines()
        assert table[2].split()[-1] == "SANDBOX"
        rows = {line.split()[0]: line for line in table[3:5]}
        level = "landlock 7, namespaces, seccomp"  # this kernel's: test_levels.py plays older ones
        assert shown["confined"] == level and shown["lacks"] == []
        assert rows["confined"].endswith(f"network outbound, {shown['digest'][:8]}, {level}")
        assert rows["free"].endswith("off")

        attempt(daemon, "confined", "read", daemon.home / ".ssh" / "id_ed25519")
        assert any(
            "No such file or directory" in line and "id_ed25519" in line for line in logs(daemon, "confined")
        )

        extensions["confined"]["sandbox"]["read"] = [str(daemon.directory)]
        daemon.config.write_text(json.dumps({"socket": daemon.socket, "extensions": extensions}))
        assert (await client.request(daemon.socket, "reload"))["restarted"] == ["confined"]
        records = daemon.wait_running("confined")
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
        daemon.wait_running("online")
        with fail_after(20):
            while (record := daemon.status()["offline"])["state"] != "failed":  # noqa: ASYNC110 - another process
                await anyio.sleep(0.05)
        assert "network namespaces" in record["last_error"]
        assert "network: outbound" in record["last_error"] and "sandbox: false" in record["last_error"]
        assert record["pid"] is None and record["restarts"] == 0
