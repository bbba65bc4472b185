"""A remote server that misbehaves in the middle of an answer costs only itself: an answer that
starts and stalls, a stream of events without end, one event without end. Each is a clear error
for that call, the daemon stays bounded, and the server's next answers are served."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
import psutil
import pytest

from supervisor.control.client import RemoteError
from tests.harness import Daemon, first_text, gateway_session, until
from tests.harness.timing import fail_after, patience
from tests.remote import Remote, text, together

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

    @pytest.mark.parametrize("kind", ["events", "body", "gzip"])
    def test_an_answer_without_end_is_cut_and_the_daemon_stays_small(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], kind: str
    ) -> None:
        """``events``: log notifications as fast as the server can send them; ``body``: one event
        whose data never ends (cut at max_message_bytes); ``gzip``: a compressed JSON answer,
        each KiB decoding to a MiB (cut at max_message_bytes of what it decodes to)."""
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


class TestLongCalls:
    @pytest.mark.anyio
    @pytest.mark.parametrize("path", ["session", "raw"])
    async def test_a_call_renewed_by_progress_outlives_call_timeout_and_the_start_s(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], path: str
    ) -> None:
        """``call_timeout`` is an idle budget that progress renews, up to ``call_timeout_max``:
        the call's HTTP answer lives as long (it was given up past the longer of call_timeout
        and start_timeout, plus 2 s), through the SDK's session (the control socket's call)
        and beside it (a gateway client's plain call)."""
        remote = remotes("http")
        entry = remote.entry(call_timeout=patience(3))
        daemon = daemons({"far": entry})
        first = daemon.wait_state("far", "running")
        seconds = entry["start_timeout"] + 4  # past the old deadline: start_timeout + 2 s
        with fail_after(seconds + patience(30)):
            if path == "session":
                result = await anyio.to_thread.run_sync(lambda: daemon.call("far", "work", seconds=seconds))
                assert text(result) == "worked"
            else:
                async with gateway_session(daemon.mcp_sock) as session:
                    await session.list_tools()  # its plain calls take the raw path from then on
                    assert first_text(await session.call_tool("far__work", {"seconds": seconds})) == "worked"
        assert daemon.status()["far"]["restarts"] == first["restarts"]

    @pytest.mark.anyio
    @pytest.mark.timeout(150)
    async def test_more_long_calls_than_connections_leave_the_pings_theirs(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """70 calls at once that answer nothing for seconds, more than a run's pool of
        connections holds: the liveness pings still get through (a pool of their own), so the
        run is not ended as unresponsive, and every call is answered."""
        remote = remotes("http")
        entry = remote.entry(ping_interval=0.5, ping_timeout=patience(6))  # a loaded machine's ping
        daemon = daemons({"far": entry})
        first = daemon.wait_state("far", "running")
        seconds = patience(6) + 3  # past ping_timeout, without a word
        answers: list[str] = []

        async def calls() -> None:
            async with gateway_session(daemon.mcp_sock) as session:
                await session.list_tools()

                async def one() -> None:
                    answers.append(first_text(await session.call_tool("far__sleep", {"seconds": seconds})))

                async with anyio.create_task_group() as each:
                    for _ in range(35):
                        each.start_soon(one)

        with fail_after(3 * seconds + patience(60)):
            async with anyio.create_task_group() as clients:
                for _ in range(2):
                    clients.start_soon(calls)
        assert answers == ["slept"] * 70
        assert not daemon.find("extension.not_answering")
        assert daemon.status()["far"]["restarts"] == first["restarts"]

    @pytest.mark.anyio
    @pytest.mark.parametrize("mode", ["json", "http"])
    async def test_calls_are_answered_at_once_not_one_after_another(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], mode: str
    ) -> None:
        """The login's lock (OAuth on, as by default) is held to sign a request, not while it is
        answered: 8 calls that each wait for the 8 to run at once all do, where the answer is
        a JSON body (its headers come when the tool is done) as where it is an event stream."""
        remote = remotes(mode)
        daemon = daemons({"far": remote.entry()})
        daemon.wait_state("far", "running")
        assert await together(daemon, 8) == ["8"] * 8


class TestItsRequests:
    def test_a_flood_of_requests_whose_answers_it_never_takes_is_bounded(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """200 pings at once, each of the daemon's answers stalled by the server: at most 32 are
                answered at once (a task and a connection each), the rest dropped; the stalled answers
                are given up at the run's answer deadline (which ends that run: the SDK's transport stops at
        an answer it could not post), and the next run serves."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(call_timeout=patience(5))})
        first = daemon.wait_state("far", "running")
        tasks = daemon.request("health")["process"]["asyncio_tasks"]
        peak: list[int] = []

        def watch() -> None:
            while not done.is_set():
                peak.append(daemon.request("health")["process"]["asyncio_tasks"])
                done.wait(0.05)

        done = threading.Event()
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            assert text(daemon.call("far", "ping_flood", count=200)).startswith("answered")
        finally:
            done.set()
            watcher.join()
        assert max(peak) < tasks + 32 * 4 + 20, (tasks, max(peak))  # not one (or four) per ping
        assert daemon.find("extension.requests_dropped")
        until(lambda: daemon.request("health")["process"]["asyncio_tasks"] < tasks + 20, within=patience(15))
        record = daemon.wait_state("far", "running", within=patience(20))
        assert text(daemon.call("far", "echo", text="after")) == "after"
        assert record["restarts"] <= first["restarts"] + 1, record  # the stalled answers end one run
