"""The head start: the first autostart children spawn before the daemon imports the MCP SDK."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.config.settings import Settings
from supervisor.daemon.headstart import first_starts
from supervisor.process import children as process
from supervisor.process import sandbox
from tests.harness import CLI, Daemon, alive, extension_settings, until, zygote
from tests.harness.timing import patience

pytestmark = pytest.mark.timeout(60)

# What the daemon imports before its head start: the modules of the light phase, and logging's set-up.
LIGHT_PHASE = """
import sys
import supervisor.daemon.run
from supervisor import logs
logs.configure(json=True)
heavy = ("mcp", "mcp_types", "starlette", "uvicorn", "sse_starlette", "supervisor.gateway.server")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m in heavy))
"""


class TestOrder:
    def test_nothing_before_the_head_start_imports_the_sdk_or_the_gateway(self) -> None:
        """The daemon's light phase (run, logging) loads neither the MCP SDK nor the gateway."""
        done = subprocess.run([sys.executable, "-c", LIGHT_PHASE], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]"

    def test_the_watchers_serve_the_runs_the_head_start_launched(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        """Each autostart child is spawned once, before the control socket serves (the daemon
        proper is imported in between), and its watcher serves that very process."""
        daemon = daemons({"sdk": extension_settings("echo.py"), "plain": extension_settings("quick.py")})
        running = daemon.wait_running("sdk", "plain")
        events = [e["event"] for e in daemon.events()]
        assert events.index("daemon.head_start") < events.index("control.listening")
        launched = daemon.find("daemon.head_start")[0]["extensions"]
        assert launched == {name: running[name]["pid"] for name in ("sdk", "plain")}
        assert [running[name]["restarts"] for name in ("sdk", "plain")] == [0, 0]
        assert daemon.call("sdk", "echo", text="hi")["content"][0]["text"] == "hi"
        assert daemon.terminate() == 0

    def test_without_it_every_spawn_waits_for_the_autostart(self, daemons: Callable[..., Daemon]) -> None:
        """``MCP_SUPERVISOR_HEAD_START=0``: no head start, and the extensions start as before."""
        daemon = daemons({"plain": extension_settings("quick.py")}, env={"MCP_SUPERVISOR_HEAD_START": "0"})
        daemon.wait_state("plain", "running")
        assert daemon.find("daemon.head_start") == []
        assert daemon.terminate() == 0


class TestWhich:
    def test_the_plain_autostarts_among_the_first_start_slots(self) -> None:
        """In the config's order, every autostart takes a slot; only shared, not on-demand ones launch."""
        plain = {"command": "x"}
        settings = Settings.model_validate(
            {
                "socket": "/tmp/x/control.sock",
                "extensions": {
                    "learner": {**plain, "on_demand": True},  # may start to learn its listing
                    "off": {**plain, "autostart": False},  # takes no slot
                    "first": plain,
                    "own": {**plain, "instances": "per-client"},
                    "second": plain,
                    "late": plain,  # past the slots
                },
            }
        )
        assert [name for name, _ in first_starts(settings, 4)] == ["first", "second"]
        assert [name for name, _ in first_starts(settings, 2)] == ["first"]
        assert first_starts(settings, 0) == []

    def test_a_start_slot_bounds_it_and_the_rest_start_as_usual(self, daemons: Callable[..., Daemon]) -> None:
        """With one start slot only the first extension gets a head start; both run."""
        daemon = daemons(
            {"one": extension_settings("quick.py"), "two": extension_settings("quick.py")},
            settings={"start_slots": 1},
        )
        running = daemon.wait_running("one", "two")
        assert daemon.find("daemon.head_start")[0]["extensions"] == {"one": running["one"]["pid"]}
        assert daemon.terminate() == 0

    def test_one_it_cannot_launch_is_its_watchers_to_report(self, daemons: Callable[..., Daemon]) -> None:
        """A command that is not found fails as before, with the reason; the others start."""
        daemon = daemons(
            {
                "missing": extension_settings("quick.py") | {"command": "no-such-command-here"},
                "plain": extension_settings("quick.py"),
            }
        )
        failed = daemon.wait_state("missing", "failed")
        assert "not found" in failed["last_error"]
        daemon.wait_state("plain", "running")
        assert list(daemon.find("daemon.head_start")[0]["extensions"]) == ["plain"]
        assert daemon.terminate() == 0


class TestStatus:
    def test_it_shows_the_grants_the_head_started_run_got(
        self, daemons: Callable[..., Daemon], short_tmp: Path
    ) -> None:
        """A confined extension's grants digest is the same for its head-started run as for the
        run after a restart (the head start's grants, not the daemon's guess)."""
        home = short_tmp / "home"
        (home / "data").mkdir(parents=True)
        settings = extension_settings("quick.py", env={"HOME": str(home)}, sandbox={"write": ["~/data"]})
        daemon = daemons({"confined": settings})
        first = daemon.wait_state("confined", "running")
        assert first["pid"] == daemon.find("daemon.head_start")[0]["extensions"]["confined"]
        daemon.request("restart", {"name": "confined"})
        second = daemon.wait_state("confined", "running")
        assert second["pid"] != first["pid"]
        assert first["sandbox"]["mode"] == "confined"
        assert first["sandbox"]["digest"] == second["sandbox"]["digest"]
        assert daemon.terminate() == 0


class TestCleanUp:
    def test_a_sigterm_right_after_the_head_start_ends_it_all(self, daemons: Callable[..., Daemon]) -> None:
        """SIGTERM as soon as the head start is logged, while a fresh interpreter still imports
        the daemon proper: exit 0 within ``shutdown_timeout``, though two of the three children
        ignore SIGTERM, and no process of any tree is left."""
        extensions = {
            "sdk": extension_settings("echo.py"),
            "stubborn": extension_settings("stubborn.py", stop_timeout=30),
            "also": extension_settings("stubborn.py", stop_timeout=30),
        }
        daemon = daemons(extensions, settings={"shutdown_timeout": 3}, start=False)
        with daemon.log.open("ab") as log:
            proc = subprocess.Popen(
                [*CLI, "daemon", "-c", str(daemon.config)], stdout=log, stderr=log, env=daemon.env
            )
        try:
            until(
                lambda: daemon.log.exists() and daemon.find("daemon.head_start") != [],
                within=30,
                interval=0.002,
            )
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert proc.wait(timeout=30) == 0
            # shutdown_timeout (3 s), plus the imports of the daemon proper, which a loaded machine
            # slows (15 s with two suites beside it); short of the stubborn ones' stop_timeout (30 s each)
            assert time.monotonic() - signalled < 3 + patience(24)
        finally:
            proc.kill()
            proc.wait()
        events = [e["event"] for e in daemon.events()]
        assert "daemon.shutting_down" in events and "daemon.stopped" in events
        launched = daemon.find("daemon.head_start")[0]["extensions"]
        assert not any(alive(pid) for pid in launched.values())
        assert process.find_marked(daemon.instance) == set()

    def test_a_second_daemon_on_the_same_socket_spawns_nothing(
        self, daemons: Callable[..., Daemon], short_tmp: Path
    ) -> None:
        """The control socket is bound before the head start: a second daemon exits 1 without
        spawning or sweeping anything, and the first one's children run on."""
        first = daemons({"plain": extension_settings("quick.py")})
        before = first.wait_state("plain", "running")
        marked = process.find_marked(first.instance)
        config = short_tmp / "second.json"
        config.write_text(
            json.dumps({"socket": first.socket, "extensions": {"other": extension_settings("quick.py")}})
        )
        proc = zygote.run([*CLI, "daemon", "-c", str(config)], timeout=patience(60))
        assert proc.returncode == 1
        assert "another daemon is listening" in proc.stderr and "head_start" not in proc.stderr
        assert process.find_marked(first.instance) == marked
        assert first.status()["plain"]["pid"] == before["pid"]
        assert first.terminate() == 0

    def test_runs_no_watcher_took_end_with_the_daemon_that_could_not_serve(
        self, daemons: Callable[..., Daemon], short_tmp: Path
    ) -> None:
        """mcp.sock is taken: the daemon exits 1, and what its head start spawned is gone,
        sandbox directory included."""
        holder = socket.socket(socket.AF_UNIX)
        holder.bind(str(short_tmp / "mcp.sock"))
        holder.listen()
        try:
            daemon = daemons({"sdk": extension_settings("echo.py", sandbox={"network": "all"})}, start=False)
            daemon.start()
            assert daemon.proc is not None
            assert daemon.proc.wait(timeout=30) == 1
        finally:
            holder.close()
        launched = daemon.find("daemon.head_start")[0]["extensions"]
        until(lambda: not alive(launched["sdk"]), within=5)
        assert process.find_marked(daemon.instance) == set()
        assert not os.path.exists(sandbox.tmp_base(daemon.instance))
        assert "another daemon is listening" in str(daemon.find("daemon.socket_unavailable"))
