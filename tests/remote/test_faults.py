"""A remote server that misbehaves in the middle of an answer costs only itself: an answer that
starts and stalls, a stream of events without end, one event without end. Each is a clear error
for that call, the daemon stays bounded, and the server's next answers are served."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil
import pytest

from supervisor.control.client import RemoteError
from tests.harness import Daemon, until
from tests.harness.timing import patience
from tests.remote import Remote, text

pytestmark = pytest.mark.timeout(90)
MiB = 1 << 20


def responsive(daemon: Daemon) -> float:
    """Seconds a status request takes now."""
    started = time.monotonic()
    daemon.status()
    return time.monotonic() - started


def busy(daemon: Daemon, window: float) -> float:
    """The share of one core the daemon used over *window* seconds (less on a loaded machine)."""
    process = psutil.Process(daemon.pid)
    before = sum(process.cpu_times()[:2])
    time.sleep(window)  # a measurement over a window, not a wait for an event
    return (sum(process.cpu_times()[:2]) - before) / window


class TestMidAnswer:
    def test_an_answer_that_stalls_fails_its_call_at_call_timeout(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(call_timeout=patience(2))})
        daemon.wait_state("far", "running")
        assert text(daemon.call("far", "stall_next")) == "armed"
        failed: list[BaseException] = []

        def call() -> None:
            try:
                daemon.call("far", "echo", text="never")
            except RemoteError as exc:
                failed.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert responsive(daemon) < patience(2)  # the daemon answers while the answer stalls
        caller.join(patience(20))
        assert not caller.is_alive() and failed, "the stalled call was not ended"
        assert "did not answer within" in str(failed[0]), failed
        assert text(daemon.call("far", "echo", text="next")) == "next"

    @pytest.mark.parametrize("kind", ["events", "body"])
    def test_an_answer_without_end_is_cut_and_the_daemon_stays_small(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], kind: str
    ) -> None:
        """``events``: log notifications as fast as the server can send them; ``body``: one event
        whose data never ends (cut at max_message_bytes)."""
        remote = remotes("http")
        entry = remote.entry(call_timeout=patience(3), max_message_bytes=4 * MiB)
        daemon = daemons({"far": entry, "near": remotes("http").entry()})
        daemon.wait_running("far", "near")
        rss = daemon.rss()
        assert text(daemon.call("far", "flood_next", kind=kind)) == "armed"
        with pytest.raises(RemoteError):
            daemon.call("far", "echo", text="never")
        assert daemon.rss() - rss < 64 * MiB, "the flood was held in memory"
        until(lambda: busy(daemon, window=0.5) < 0.5, within=patience(10))  # cut: call_timeout + 2 s
        assert text(daemon.call("near", "echo", text="other")) == "other"  # another extension: served
        daemon.wait_state("far", "running", within=patience(20))
        assert text(daemon.call("far", "echo", text="next")) == "next"
        assert len(daemon.request("logs", {"name": "far", "lines": 10_000})["lines"]) <= 500  # log_lines
        assert not daemon.problems()
