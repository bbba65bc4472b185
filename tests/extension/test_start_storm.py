"""A start storm through start slots: queued starts, all of them running, a prompt SIGTERM."""

from __future__ import annotations

import functools
import json
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.control import client
from tests.harness import Daemon, alive, extension_settings, gated_start, until
from tests.harness.timing import patience

pytestmark = pytest.mark.timeout(90)


def _storm(daemon: Daemon, **settings: Any) -> Daemon:
    """*daemon* started with top-level *settings* (start_slots, shutdown_timeout) in its config."""
    _storm_config(daemon, **settings)
    return daemon.start()


def _storm_config(daemon: Daemon, **settings: Any) -> None:
    config = json.loads(daemon.config.read_text())
    daemon.config.write_text(json.dumps({**config, **settings}))


def _request(daemon: Daemon, method: str, params: dict[str, Any] | None = None) -> Any:
    """*method* over the control socket from this process: polling with the CLI would eat the
    CPU that the starts under test need."""
    return anyio.run(functools.partial(client.request, daemon.socket, method, params, timeout=30))


def _status(daemon: Daemon) -> dict[str, dict[str, Any]]:
    return {record["name"]: record for record in _request(daemon, "status")["extensions"]}


def _shutdown_took(daemon: Daemon) -> float:
    """Seconds from ``daemon.shutting_down`` to ``daemon.stopped`` in the daemon's log."""
    (begun,), (ended,) = daemon.find("daemon.shutting_down"), daemon.find("daemon.stopped")
    took = datetime.fromisoformat(ended["timestamp"]) - datetime.fromisoformat(begun["timestamp"])
    return took.total_seconds()


def _never(short_tmp: Path, **overrides: Any) -> dict[str, Any]:
    """A start that never ends by itself: stderr progress, stdin unread (a wrapper downloading)."""
    env = {"SLOW_START_GATE": str(short_tmp / "never")}
    return extension_settings("slow_start.py", env=env, start_timeout=30, **overrides)


class TestStartSlots:
    def test_a_storm_queues_and_every_extension_runs(
        self,
        daemons: Callable[..., Daemon],
    ) -> None:
        """Five SDK servers, two slots: the rest wait as `queued`, then all run with few restarts."""
        names = [f"sdk{i}" for i in range(5)]
        extensions = {n: extension_settings("echo.py") for n in names}
        daemon = _storm(daemons(extensions, start=False), start_slots=2)
        seen: dict[str, Any] = {}

        def queued() -> bool:
            for record in _status(daemon).values():
                if record["queued"]:
                    seen.update(record)
                    return True
            return False

        until(queued, within=30)
        assert seen["state"] == "starting" and seen["pid"] is None
        assert seen["detail"] == "queued for a start slot"
        assert _request(daemon, "health")["start_slots"]["slots"] == 2

        until(lambda: all(r["state"] == "running" for r in _status(daemon).values()), within=60)
        records = _status(daemon).values()
        assert sum(r["restarts"] for r in records) <= 2, [(r["name"], r["last_error"]) for r in records]
        assert all(r["queued"] is None and r["detail"] is None for r in records)
        assert daemon.terminate() == 0

    def test_queued_in_the_table_a_stop_of_it_at_once_and_a_reload_adds_slots(
        self,
        daemons: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """One slot held by a start that never ends: the others wait in line; a stop of one takes
        no time, and a reload with more slots starts the other."""
        quick = extension_settings("quick.py")
        extensions = {"first": _never(short_tmp), "second": quick, "third": quick}
        daemon = _storm(daemons(extensions, start=False), start_slots=1)

        def queued() -> bool:  # the slot's holder has a pid once its sandbox is ready and it spawned
            status = _status(daemon)
            return [r["queued"] for r in status.values()] == [None, 1, 2] and bool(status["first"]["pid"])

        until(queued, within=30)
        table = daemon.cli("status").stdout
        assert "for a start slot (place 2)" in table, table

        started = time.monotonic()
        record = _request(daemon, "stop", {"name": "third"})
        assert time.monotonic() - started < 2
        assert (record["state"], record["pid"], record["queued"]) == ("stopped", None, None)
        assert _request(daemon, "health")["start_slots"] == {"slots": 1, "in_use": 1, "queued": 1}
        assert "starts  1 of 1 start slots in use, 1 queued" in daemon.cli("health").stdout

        _storm_config(daemon, start_slots=2)
        assert daemon.cli("reload").returncode == 0
        until(lambda: _status(daemon)["second"]["state"] == "running", within=30)
        assert _request(daemon, "health")["start_slots"] == {"slots": 2, "in_use": 1, "queued": 0}
        assert daemon.terminate() == 0

    def test_start_timeout_counts_from_the_slots_grant(
        self,
        daemons: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """Queued longer than its start_timeout (3 s) behind a start that holds the only slot, a
        quick start still runs once it gets the slot: the wait is free."""
        gate, ahead = gated_start(short_tmp, start_timeout=60, restart="never")
        behind = extension_settings("quick.py", start_timeout=3, restart="never")
        daemon = _storm(daemons({"ahead": ahead, "behind": behind}, start=False), start_slots=1)
        until(lambda: _status(daemon)["behind"]["queued"] == 1, within=30)  # until the gate opens
        queued_at = time.monotonic()
        until(lambda: time.monotonic() - queued_at > 4 and _status(daemon)["behind"]["queued"] == 1)
        gate.touch()  # ahead runs, and passes the slot on
        until(lambda: _status(daemon)["behind"]["state"] not in ("stopped", "starting"), within=30)
        behind_now = _status(daemon)["behind"]
        assert (behind_now["state"], behind_now["restarts"], behind_now["last_error"]) == ("running", 0, None)
        assert daemon.terminate() == 0


class TestShutdownDuringAStorm:
    def test_sigterm_with_starts_half_done_and_queued_exits_within_shutdown_timeout(
        self,
        daemons: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """Children that never read stdin mid-start (stop_timeout 20) and ten queued: out in time."""
        half = {f"half{i}": _never(short_tmp, stop_timeout=20) for i in range(2)}
        queued = {f"sdk{i}": extension_settings("echo.py") for i in range(10)}
        daemon = _storm(daemons({**half, **queued}, start=False), start_slots=2, shutdown_timeout=3)

        def storming() -> bool:
            status = _status(daemon)
            return all(status[n]["pid"] and status[n]["last_stderr"] for n in half) and all(
                status[n]["queued"] for n in queued
            )

        until(storming, within=30)
        pids = [_status(daemon)[n]["pid"] for n in half]
        assert daemon.proc is not None
        sent = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=30) == 0
        took = time.monotonic() - sent
        assert took < 3.0, f"exited {took:.1f}s after SIGTERM, shutdown_timeout is 3"
        assert not any(alive(pid) for pid in pids)
        events = [e["event"] for e in daemon.events()]
        assert "daemon.shutdown_timeout" not in events  # not even the forced phase was needed

    def test_a_child_that_ignores_everything_still_ends_within_shutdown_timeout(
        self,
        daemons: Callable[..., Daemon],
    ) -> None:
        """A running child outliving stdin EOF and SIGTERM: the daemon still exits in shutdown_timeout."""
        stubborn = extension_settings("stubborn.py", stop_timeout=30)
        daemon = _storm(daemons({"stubborn": stubborn}, start=False), shutdown_timeout=3)
        until(lambda: _status(daemon)["stubborn"]["state"] == "running", within=30)
        pid = _status(daemon)["stubborn"]["pid"]
        until(lambda: "stubborn: ready" in (_status(daemon)["stubborn"]["last_stderr"] or ""), within=30)
        assert daemon.proc is not None
        sent = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=30) == 0
        took = time.monotonic() - sent
        # shutdown_timeout (3 s), and the kill after it: far from the child's stop_timeout (30 s)
        assert _shutdown_took(daemon) < 3 + patience(2)  # by its own clock: SIGTERM to the last line
        took_most = 3 + patience(4)  # and the interpreter's end after its last line
        assert took < took_most, f"exited {took:.1f}s after SIGTERM"
        assert not alive(pid)
        assert "daemon.shutdown_timeout" in [e["event"] for e in daemon.events()]
