"""Operating a running daemon: reload, health, metrics, and state that stays bounded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.control import client
from supervisor.daemon.identity import instance_key
from supervisor.process import children as process
from tests.harness import Daemon, extension_settings, until
from tests.harness.backend import PROCESS_KEYS
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def daemon(daemons: Callable[..., Daemon]) -> Daemon:
    """A daemon of the test's, configured and started by the test."""
    return daemons(start=False, end="terminate")


class TestReload:
    async def test_changes_only_what_changed(self, daemon: Daemon) -> None:
        """Added starts, removed stops, changed restarts; an unchanged extension keeps its process."""
        daemon.write(
            {
                "same": extension_settings("quick.py"),
                "edited": extension_settings("quick.py"),
                "dropped": extension_settings("quick.py"),
            }
        )
        daemon.start()
        before = {name: (daemon.wait_state(name, "running"))["pid"] for name in ("same", "edited", "dropped")}
        daemon.write(
            {
                "same": extension_settings("quick.py"),
                "edited": extension_settings("quick.py", call_timeout=7),
                "new": extension_settings("quick.py"),
            }
        )
        report = daemon.request("reload")
        assert (report["added"], report["removed"], report["restarted"], report["unchanged"]) == (
            ["new"],
            ["dropped"],
            ["edited"],
            ["same"],
        )
        after = daemon.status()
        assert list(after) == ["same", "edited", "new"]
        assert after["same"]["pid"] == before["same"]
        assert (daemon.wait_state("edited", "running"))["pid"] != before["edited"]
        daemon.wait_state("new", "running")
        assert not process.find_marked(f"{instance_key(daemon.socket)}:{daemon.proc.pid}:dropped:")  # type: ignore[union-attr]

    async def test_a_broken_config_changes_nothing_and_says_why(self, daemon: Daemon) -> None:
        """On any error the daemon keeps the old config and the CLI prints every problem (exit 2)."""
        daemon.write({"fx": extension_settings("quick.py")})
        daemon.start()
        pid = (daemon.wait_state("fx", "running"))["pid"]
        daemon.config.write_text(
            json.dumps(
                {
                    "socket": daemon.socket,
                    "extensions": {"fx": {"command": "x", "restart": "sometimes"}, "b": {}},
                }
            )
        )
        result = daemon.cli("reload")
        errors = result.stderr.splitlines()
        assert result.returncode == 2
        assert errors[0] == "mcp-supervisor: the config is not valid; nothing was changed:"
        assert any("extensions.fx.restart" in line for line in errors) and any(
            "extensions.b" in line for line in errors
        )
        assert daemon.status()["fx"]["pid"] == pid

    async def test_a_manual_stop_survives_a_reload(self, daemon: Daemon) -> None:
        """A stopped extension stays stopped across a reload unless its entry changed."""
        daemon.write({"kept": extension_settings("quick.py"), "changed": extension_settings("quick.py")})
        daemon.start()
        for name in ("kept", "changed"):
            daemon.wait_state(name, "running")
            daemon.request("stop", {"name": name})
        daemon.write(
            {"kept": extension_settings("quick.py"), "changed": extension_settings("quick.py", log_lines=10)}
        )
        daemon.request("reload")
        assert daemon.status()["kept"]["state"] == "stopped"
        daemon.wait_state("changed", "running")

    async def test_sighup_reloads(self, daemon: Daemon) -> None:
        """SIGHUP does what `reload` does."""
        daemon.write({"fx": extension_settings("quick.py")})
        daemon.start()
        daemon.wait_state("fx", "running")
        daemon.write({"fx": extension_settings("quick.py"), "hup": extension_settings("quick.py")})
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_state("hup", "running")

    async def test_settings_that_need_a_restart_are_reported_not_applied(self, daemon: Daemon) -> None:
        """Changing the spool directory is reported under needs_restart; the socket stays put."""
        daemon.write({"fx": extension_settings("quick.py")})
        daemon.start()
        daemon.wait_state("fx", "running")
        daemon.write(
            {"fx": extension_settings("quick.py")}, spool={"dir": str(daemon.directory / "elsewhere")}
        )
        assert (daemon.request("reload"))["needs_restart"] == ["spool"]


class TestHealth:
    async def test_report_and_metrics_show_calls_and_errors(self, daemon: Daemon) -> None:
        """health counts calls and errors per extension; the Prometheus text has them by tool."""
        daemon.write({"fx": extension_settings("quick.py")})
        daemon.start()
        daemon.wait_state("fx", "running")
        for text in ("a", "b"):
            daemon.request("call", {"name": "fx", "tool": "echo", "arguments": {"text": text}})
        with pytest.raises(client.RemoteError):
            daemon.request("call", {"name": "fx", "tool": "nope"})
        report = daemon.request("health")
        assert set(report["process"]) == {"pid", *PROCESS_KEYS}
        process = report["process"]
        assert 1 <= process["worker_threads"] < process["threads"]  # the start ran blocking calls
        assert 0 <= process["blocking_calls"] <= process["worker_threads"]
        assert report["process"]["pid"] == daemon.proc.pid  # type: ignore[union-attr]
        fx = report["extensions"][0]
        assert (fx["name"], fx["state"], fx["calls"], fx["errors"], fx["in_flight"]) == (
            "fx",
            "running",
            3,
            1,
            0,
        )
        text = (daemon.request("health", {"format": "prometheus"}))["text"]
        assert 'mcp_supervisor_tool_calls_total{extension="fx",tool="echo"} 2.0' in text
        assert 'mcp_supervisor_tool_call_errors_total{extension="fx",tool="(unknown)"} 1.0' in text
        assert 'mcp_supervisor_extension_state{extension="fx",state="running"} 1.0' in text
        assert 'mcp_supervisor_tool_call_duration_seconds_count{extension="fx"} 3.0' in text
        assert "mcp_supervisor_spool_bytes 0.0" in text

    async def test_cli_health_table_json_and_prometheus(self, daemon: Daemon) -> None:
        """`health` prints a summary and a table; --json and --prometheus print the raw forms."""
        daemon.write({"fx": extension_settings("quick.py")})
        daemon.start()
        daemon.wait_state("fx", "running")
        table = daemon.cli("health").stdout.splitlines()
        assert table[0].startswith("daemon  pid ") and table[1].startswith("spool   0 files")
        assert re.search(r", \d+ threads \(\d+ in the worker pool\), \d+ blocking calls, ", table[0])
        assert table[2].split() == [
            "NAME",
            "STATE",
            "RESTARTS",
            "CALLS",
            "ERRORS",
            "IN-FLIGHT",
            "STDERR",
            "LINES",
            "PROCS",
            "RSS",
            "CPU",
            "SANDBOX",
        ]
        assert table[3].split()[0] == "fx" and " network all, " in table[3]
        assert table[3].endswith(", landlock 7, namespaces, seccomp")  # this kernel: every layer
        assert json.loads(daemon.cli("health", "--json").stdout)["extensions"][0]["name"] == "fx"
        assert "# TYPE mcp_supervisor_tool_calls_total counter" in daemon.cli("health", "--prometheus").stdout


def threads(pid: int) -> list[str]:
    """The names the kernel has for *pid*'s threads (Python's own are all the process's name;
    the kernel's io_uring workers, ``iou-wrk-PID``, are not)."""
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # gone since
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
    return sorted(names)


class TestMetrics:
    def test_series_of_a_forgotten_extension_start_over_when_it_returns(self) -> None:
        """The kept label children go with forget(): a reloaded extension's calls count again."""
        from supervisor.daemon.metrics import Metrics

        health = {
            "process": dict.fromkeys(PROCESS_KEYS, 0),
            "spool": {"bytes": 0, "files": 0},
            "extensions": [],
        }
        metrics = Metrics(lambda: health)
        metrics.observe_call("fx", "echo", 0.001, True)
        metrics.observe_call("fx", "echo", 0.001, False)
        metrics.forget("fx")
        assert "fx" not in metrics.render()
        metrics.observe_call("fx", "echo", 0.001, True)
        text = metrics.render()
        assert 'mcp_supervisor_tool_calls_total{extension="fx",tool="echo"} 1.0' in text
        assert 'mcp_supervisor_tool_call_duration_seconds_count{extension="fx"} 1.0' in text
        assert "mcp_supervisor_tool_call_errors_total{" not in text


class TestSystemdNotify:
    async def test_the_notify_protocol_through_a_daemon_lifetime(self, daemon: Daemon) -> None:
        """READY with a status, watchdog pings, STATUS on changes, RELOADING/READY and STOPPING.

        The test binds the datagram socket systemd would; children never see NOTIFY_SOCKET.
        """
        systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        systemd.bind(str(daemon.directory / "notify.sock"))
        systemd.setblocking(False)

        async def next_message(containing: str, value: str | None = None) -> dict[str, str]:
            """The next datagram with field *containing* (equal to *value*, if given); others are skipped."""
            with fail_after(30):  # 15 s was missed with two suites at once (pair 10)
                while True:
                    await anyio.wait_readable(systemd)
                    fields = dict(line.split("=", 1) for line in systemd.recv(4096).decode().split("\n"))
                    if containing in fields and value in (None, fields[containing]):
                        return fields

        with systemd:
            daemon.write({"fx": extension_settings("quick.py")})
            daemon.start({"NOTIFY_SOCKET": str(daemon.directory / "notify.sock"), "WATCHDOG_USEC": "200000"})
            ready = await next_message("READY")
            assert ready["READY"] == "1" and "STATUS" in ready
            assert (await next_message("WATCHDOG"))["WATCHDOG"] == "1"
            pid = (daemon.wait_state("fx", "running"))["pid"]
            environ = (await anyio.Path(f"/proc/{pid}/environ").read_bytes()).split(b"\0")
            assert not any(entry.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_")) for entry in environ)
            daemon.request("stop", {"name": "fx"})
            await next_message("STATUS", "1 stopped")
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGHUP)
            reloading = await next_message("RELOADING")
            assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0
            assert (await next_message("READY"))["STATUS"] == "1 stopped"
            daemon.proc.send_signal(signal.SIGTERM)
            assert (await next_message("STOPPING"))["STOPPING"] == "1"
            assert await anyio.to_thread.run_sync(daemon.proc.wait) == 0


# Each bound is reached many times over (a ring of 20 lines, the start slots, a call's tasks);
# more calls and restarts show nothing new and take minutes on a loaded machine (bench/soak.py
# runs for as long as asked).
CALLS, RESTARTS = 1_000, 100  # what they hold does not grow with more: bench/soak.py runs longer


class TestBounds:
    @pytest.mark.timeout(240)
    async def test_a_thousand_calls_and_a_hundred_restarts_leave_everything_within_bounds(
        self, daemon: Daemon
    ) -> None:
        """After 1,000 calls and 100 restarts every collection is within its bound, the daemon's
        tasks and fds are back to their idle counts, and so are its threads outside the pool of
        workers for blocking calls, in which no call is left running."""
        daemon.write(
            {
                "steady": extension_settings("quick.py", log_lines=20, env={"QUICK_STDERR_AT_START": "100"}),
                "flash": extension_settings("flash.sh", restart="always", log_lines=20, autostart=False),
            }
        )
        daemon.start()
        daemon.wait_state("steady", "running")

        def ring_full() -> bool:
            return (daemon.request("health"))["extensions"][0]["log_lines"] == 20

        until(ring_full, within=10)
        idle = (daemon.request("health"))["process"]

        daemon.request("start", {"name": "flash", "wait": False})
        async with client.Client(daemon.socket) as connection:
            for n in range(CALLS):
                params = {"name": "steady", "tool": "echo", "arguments": {"text": str(n)}}
                assert (await connection.request("call", params))["content"][0]["text"] == str(n)

        def restarted_enough() -> bool:
            return daemon.status()["flash"]["restarts"] >= RESTARTS

        until(restarted_enough, within=120, interval=0.2)
        daemon.request("stop", {"name": "flash"})

        report = daemon.request("health")
        steady, flash = report["extensions"]
        assert (steady["calls"], steady["errors"], steady["in_flight"]) == (CALLS, 0, 0)
        assert steady["log_lines"] == 20 and flash["log_lines"] <= 20
        text = (daemon.request("health", {"format": "prometheus"}))["text"]
        series = [line for line in text.splitlines() if line.startswith("mcp_supervisor_tool_calls_total{")]
        assert series == [f'mcp_supervisor_tool_calls_total{{extension="steady",tool="echo"}} {CALLS}.0']
        gauges = {line.split()[0] for line in text.splitlines() if line.startswith("mcp_supervisor_process_")}
        assert {"mcp_supervisor_process_worker_threads", "mcp_supervisor_process_blocking_calls"} <= gauges

        last: dict[str, Any] = {}

        def others(process: dict[str, Any]) -> int:
            return process["threads"] - process["worker_threads"]

        def back_to_idle() -> bool:
            # The pool's size is not a count to return to: it is the most blocking calls that
            # overlapped in the last 10 s (the run's cache check each second, a reload, a health
            # poll's...). A call that never ends is what leaks there, and it stays counted.
            now = (daemon.request("health"))["process"]
            last.update(now)
            back = all(now[key] <= idle[key] for key in ("asyncio_tasks", "open_fds"))
            return back and others(now) <= others(idle) and now["blocking_calls"] == 0

        assert idle["worker_threads"] >= 1  # the count sees anyio's workers (they ran the start)
        try:
            until(back_to_idle, within=30, interval=0.5)
        except AssertionError:
            named = threads(daemon.pid)
            raise AssertionError(f"not back to idle: {idle} -> {last}; threads: {named}") from None
