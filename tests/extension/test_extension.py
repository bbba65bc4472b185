"""Extension: the state machine, the watcher and calls, against real fixture servers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import anyio
import anyio.lowlevel
import mcp_types as types
import psutil
import pytest
from anyio.abc import TaskGroup
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from supervisor.errors import CallFailed, ExtensionUnavailable
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from tests.harness import eventually, fast_config, first_text, running
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MakeExtension = Callable[..., Extension]


def in_state(*states: State) -> Callable[[Snapshot], bool]:
    return lambda snapshot: snapshot.state in states


async def wait_state(ext: Extension, *states: State, within: float = 10) -> Snapshot:
    with fail_after(within):
        return await ext.wait_for(in_state(*states))


class TestStart:
    async def test_running_only_after_handshake_and_tools(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Start goes stopped -> starting -> running, with the tool list loaded and a live pid."""
        ext = make_extension(fast_config("quick.py"))
        assert ext.snapshot().state is State.STOPPED
        await ext.start(task_group)
        assert ext.snapshot().state is State.STARTING
        snapshot = await wait_state(ext, State.RUNNING)
        assert snapshot.tools == len(ext.tools()) > 0
        assert snapshot.pid is not None and psutil.pid_exists(snapshot.pid)
        await ext.stop()

    async def test_tools_are_a_copy(self, make_extension: MakeExtension, task_group: TaskGroup) -> None:
        """Changing the returned tool list or its tools does not change the cache."""
        ext = make_extension(fast_config("quick.py"))
        await running(ext, task_group)
        tools = ext.tools()
        tools[0].name = "mutated"
        tools.clear()
        assert "mutated" not in {tool.name for tool in ext.tools()}
        assert len(ext.tools()) == ext.snapshot().tools > 0
        await ext.stop()

    async def test_second_start_is_a_no_op(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Starting a running extension keeps the same child."""
        ext = make_extension(fast_config("quick.py"))
        pid = (await running(ext, task_group)).pid
        await ext.start(task_group)
        assert ext.snapshot().pid == pid and ext.snapshot().state is State.RUNNING
        await ext.stop()

    async def test_command_not_found_fails_at_once(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A permanent error goes to failed without retrying, and names the command."""
        ext = make_extension(fast_config("quick.py", command="no-such-command-xyz", restart="always"))
        await ext.start(task_group)
        snapshot = await wait_state(ext, State.FAILED)
        assert snapshot.last_error == "command 'no-such-command-xyz' not found"
        assert snapshot.restarts == 0

    async def test_handshake_timeout_backs_off(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A server that never answers initialize is killed after start_timeout and retried."""
        config = fast_config("hang_init.py", start_timeout=0.5, backoff={"initial": 30, "jitter": 0})
        ext = make_extension(config)
        await ext.start(task_group)
        snapshot = await wait_state(ext, State.BACKOFF)
        # A loaded machine may still be starting its interpreter at 0.5 s: busy, so judged a slow
        # start, and ended once idle. Either way it never answered initialize (pair 44).
        assert snapshot.last_error in (
            "no MCP handshake within 0.5s (no answer to initialize)",
            "slow start: busy past 0.5s, then idle without an MCP handshake (no answer to initialize)",
        ), snapshot.last_error
        assert snapshot.next_restart is not None and snapshot.failures == 1
        await ext.stop()

    async def test_exit_during_startup_names_the_exit(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A child that exits before the handshake reports its exit code and its last stderr line
        (a confined one also where to see its grants)."""
        ext = make_extension(fast_config("exit_now.py", "7", restart="never"))
        await ext.start(task_group)
        snapshot = await wait_state(ext, State.FAILED)
        explain = "`mcp-supervisor check-config --explain fx` shows what it may reach"
        assert (
            snapshot.last_error == f"exited with code 7 during startup: exit_now: bye (confined: {explain})"
        )
        assert snapshot.last_exit is not None and snapshot.last_exit.returncode == 7

    async def test_max_restarts_then_failed(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """max_restarts=2 means three attempts in all, then failed."""
        ext = make_extension(fast_config("exit_now.py", restart="always", max_restarts=2))
        await ext.start(task_group)
        snapshot = await wait_state(ext, State.FAILED)
        assert (snapshot.restarts, snapshot.failures) == (2, 3)

    async def test_failed_extension_can_start_again(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """start() after failed begins a new lifetime with a fresh failure budget."""
        ext = make_extension(fast_config("exit_now.py", restart="never"))
        await ext.start(task_group)
        await wait_state(ext, State.FAILED)
        await ext.start(task_group)
        assert ext.snapshot().failures == 0
        assert (await wait_state(ext, State.FAILED)).failures == 1

    @pytest.mark.parametrize("restart", ["never", "on-failure"])
    async def test_a_start_while_the_watcher_ends_on_its_own_takes_effect(
        self, restart: str, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A start during the watcher's own ending (it gave up, or a clean exit) starts anew after it."""
        ext = make_extension(fast_config("quick.py", restart=restart))
        first = await running(ext, task_group)
        assert first.pid is not None

        async def clean_exit() -> None:
            with pytest.raises(CallFailed):
                await ext.call_tool("crash", {"code": 0})

        if restart == "never":
            os.kill(first.pid, signal.SIGKILL)  # gives up: failed
        else:
            task_group.start_soon(clean_exit)  # exit 0 under on-failure: stopped
        with fail_after(5):
            await ext.wait_for(in_state(State.STOPPING))  # ending on its own: no stop was asked for
        await ext.start(task_group)
        again = await wait_state(ext, State.RUNNING, State.FAILED, State.STOPPED)
        assert again.state is State.RUNNING and again.pid != first.pid
        await ext.stop()


class TestCrash:
    async def test_kill_9_is_noticed_and_restarted(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """SIGKILL of the child leaves running within milliseconds; a new child answers."""
        ext = make_extension(fast_config("quick.py"))
        first = await running(ext, task_group)
        assert first.pid is not None
        killed_at = time.time()
        os.kill(first.pid, signal.SIGKILL)
        with fail_after(5):
            left = await ext.wait_for(lambda s: s.state is not State.RUNNING)
        assert left.last_exit is not None and left.last_exit.signal_name == "SIGKILL"
        assert left.last_exit.at.timestamp() - killed_at < 0.5
        second = await wait_state(ext, State.RUNNING)
        assert second.pid != first.pid and second.restarts == 1
        assert first_text(await ext.call_tool("echo", {"text": "again"})) == "again"
        await ext.stop()

    async def test_crash_noticed_while_grandchild_holds_stdout(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A crash is noticed although a grandchild keeps the stdout pipe open; the tree is killed."""
        ext = make_extension(fast_config("tree.py", restart="never"))
        await running(ext, task_group)
        with (
            pytest.raises(
                CallFailed, match="exited during the call to tool 'crash'; it may or may not have run"
            ),
            fail_after(5),
        ):
            await ext.call_tool("crash", {"code": 3})
        snapshot = await wait_state(ext, State.FAILED)
        assert snapshot.last_exit is not None and snapshot.last_exit.returncode == 3
        # the marker_prefix fixture asserts the grandchild and great-grandchild are gone

    async def test_backoff_shows_no_pid(self, make_extension: MakeExtension, task_group: TaskGroup) -> None:
        """In backoff the dead child's pid is gone from the status."""
        ext = make_extension(fast_config("quick.py", backoff={"initial": 30, "jitter": 0}))
        first = await running(ext, task_group)
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)
        backoff = await wait_state(ext, State.BACKOFF)
        assert backoff.pid is None and backoff.last_exit is not None
        await ext.stop()

    async def test_clean_exit_under_on_failure_stops(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Exit code 0 with restart on-failure ends as stopped, not failed."""
        ext = make_extension(fast_config("quick.py", restart="on-failure"))
        await running(ext, task_group)
        with pytest.raises(CallFailed):
            await ext.call_tool("crash", {"code": 0})
        snapshot = await wait_state(ext, State.STOPPED)
        assert snapshot.last_exit is not None and snapshot.last_exit.returncode == 0

    async def test_oversized_message_restarts_with_clear_error(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A stdout line over max_message_bytes ends the run with an error naming the limit."""
        config = fast_config("garbage.py", max_message_bytes=64 * 1024, backoff={"initial": 30, "jitter": 0})
        ext = make_extension(config)
        await running(ext, task_group)
        with pytest.raises(CallFailed), fail_after(10):
            await ext.call_tool("huge", {"bytes": 1 << 20})
        snapshot = await wait_state(ext, State.BACKOFF)
        assert snapshot.last_error == "it sent a message over the 65536-byte limit"
        await ext.stop()

    async def test_garbage_lines_do_not_break_the_session(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Non-JSON-RPC lines on stdout are logged and skipped; calls keep working."""
        ext = make_extension(fast_config("garbage.py"))
        await running(ext, task_group)
        assert first_text(await ext.call_tool("noise", {})) != ""
        assert first_text(await ext.call_tool("echo", {"text": "still here"})) == "still here"
        assert ext.snapshot().state is State.RUNNING
        await ext.stop()


class TestStop:
    @pytest.mark.parametrize("phase", ["starting", "running", "backoff"])
    async def test_ten_concurrent_stops_share_one_teardown(
        self, phase: str, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Ten concurrent stop() calls all return once the single teardown is over."""
        script, overrides = {
            "starting": ("hang_init.py", {"start_timeout": 30}),
            "running": ("quick.py", {}),
            "backoff": ("exit_now.py", {"restart": "always", "backoff": {"initial": 30, "jitter": 0}}),
        }[phase]
        ext = make_extension(fast_config(script, **overrides))
        await ext.start(task_group)
        await wait_state(ext, State(phase))
        with capture_logs(processors=[merge_contextvars]) as logs, fail_after(5):
            async with anyio.create_task_group() as stoppers:
                for _ in range(10):
                    stoppers.start_soon(ext.stop)
        assert ext.snapshot().state is State.STOPPED
        transitions = [e["state"] for e in logs if e["event"] == "extension.state"]
        assert transitions.count("stopped") == 1
        assert {e.get("extension") for e in logs if e["event"] == "extension.state"} == {"fx"}

    async def test_stop_during_backoff_acts_at_once(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A 30 s backoff does not delay a stop."""
        ext = make_extension(fast_config("exit_now.py", restart="always", backoff={"initial": 30}))
        await ext.start(task_group)
        await wait_state(ext, State.BACKOFF)
        started = time.monotonic()
        await ext.stop()
        assert time.monotonic() - started < 1
        assert ext.snapshot().state is State.STOPPED

    async def test_stop_escalates_for_a_stubborn_child(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A child ignoring stdin EOF and SIGTERM is killed after stop_timeout plus the TERM grace."""
        ext = make_extension(fast_config("stubborn.py", stop_timeout=0.2))
        await running(ext, task_group)
        with fail_after(6):
            await ext.stop()
        assert ext.snapshot().state is State.STOPPED

    async def test_request_stop_returns_at_once_and_the_watcher_finishes(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """request_stop() does not wait; the watcher still tears down and ends stopped."""
        ext = make_extension(fast_config("quick.py"))
        await running(ext, task_group)
        ext.request_stop()
        assert ext.snapshot().state is not State.STOPPED  # the teardown is still to come
        assert (await wait_state(ext, State.STOPPED)).pid is None

    async def test_stop_when_stopped_returns(self, make_extension: MakeExtension) -> None:
        """stop() on a never-started extension returns at once."""
        ext = make_extension(fast_config("quick.py"))
        with fail_after(1):
            await ext.stop()
        assert ext.snapshot().state is State.STOPPED

    async def test_restart_gives_a_new_child(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """restart() stops the tree and starts a new child; a call during it waits and succeeds."""
        ext = make_extension(fast_config("quick.py"))
        first = await running(ext, task_group)
        results: list[str] = []

        async def call_during_restart() -> None:
            await wait_state(ext, State.STOPPING, State.STOPPED, State.STARTING)
            results.append(first_text(await ext.call_tool("echo", {"text": "waited"})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_during_restart)
            await anyio.lowlevel.checkpoint()
            await ext.restart(task_group)
        assert (await wait_state(ext, State.RUNNING)).pid != first.pid
        assert results == ["waited"]
        await ext.stop()


class TestCalls:
    async def test_call_on_stopped_extension_is_not_retryable(self, make_extension: MakeExtension) -> None:
        """A call to a stopped extension fails at once, naming the state."""
        ext = make_extension(fast_config("quick.py"))
        with pytest.raises(ExtensionUnavailable, match="extension 'fx' is stopped") as info:
            await ext.call_tool("echo", {"text": "x"})
        assert not info.value.retryable

    async def test_call_waits_for_start(self, make_extension: MakeExtension, task_group: TaskGroup) -> None:
        """A call made while starting waits for running and succeeds."""
        ext = make_extension(fast_config("quick.py"))
        await ext.start(task_group)
        assert first_text(await ext.call_tool("echo", {"text": "early"})) == "early"
        await ext.stop()

    async def test_call_during_long_backoff_times_out_retryable(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A call waiting on a restart past call_timeout gets a retryable error naming the state."""
        config = fast_config("exit_now.py", restart="always", backoff={"initial": 30}, call_timeout=0.3)
        ext = make_extension(config)
        await ext.start(task_group)
        await wait_state(ext, State.BACKOFF)
        with pytest.raises(ExtensionUnavailable, match="is backoff") as info:
            await ext.call_tool("echo", {"text": "x"})
        assert info.value.retryable
        await ext.stop()

    async def test_slow_tool_times_out_and_session_survives(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A tool slower than call_timeout fails with a timeout; the next call works."""
        ext = make_extension(fast_config("rich.py", call_timeout=0.5))
        await running(ext, task_group)
        with pytest.raises(CallFailed, match=r"did not answer within 0\.5s") as info:
            await ext.call_tool("sleep", {"seconds": 30})
        assert info.value.code == types.REQUEST_TIMEOUT
        assert first_text(await ext.call_tool("echo", {"text": "ok"})) == "ok"
        assert ext.snapshot().in_flight == 0
        await ext.stop()

    @pytest.mark.parametrize("action", ["stop", "restart"])
    async def test_a_call_cut_by_stop_or_restart_says_so(
        self, action: str, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A call in flight when the extension is stopped (or restarted) says so."""
        ext = make_extension(fast_config("quick.py"))
        await running(ext, task_group)
        failures: list[CallFailed] = []

        async def call() -> None:
            with pytest.raises(CallFailed) as failed:
                await ext.call_tool("sleep", {"seconds": 30})
            failures.append(failed.value)

        async with anyio.create_task_group() as callers:
            callers.start_soon(call)
            await wait_state(ext, State.RUNNING)
            await eventually(lambda: ext.snapshot().in_flight == 1)
            await (ext.stop() if action == "stop" else ext.restart(task_group))
        word = "stopped" if action == "stop" else "restarted"
        assert (
            str(failures[0])
            == f"extension 'fx' was {word} during the call to tool 'sleep'; it may or may not have run"
        )
        await ext.stop()

    async def test_unknown_tool(self, make_extension: MakeExtension, task_group: TaskGroup) -> None:
        """Calling a tool the extension does not list fails clearly without a round trip."""
        ext = make_extension(fast_config("quick.py"))
        await running(ext, task_group)
        with pytest.raises(CallFailed, match="has no tool 'nope'"):
            await ext.call_tool("nope", {})
        await ext.stop()

    async def test_tool_error_result_passes_through(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A handler exception in the server arrives as a JSON-RPC error, not a crash."""
        ext = make_extension(fast_config("rich.py"))
        await running(ext, task_group)
        with pytest.raises(CallFailed, match="boom"):
            await ext.call_tool("fail", {})
        assert ext.snapshot().state is State.RUNNING
        await ext.stop()

    async def test_tools_refreshed_on_list_changed(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """tools/list_changed from the child refreshes the cached tool list."""
        ext = make_extension(fast_config("rich.py"))
        await running(ext, task_group)
        assert "extra" not in {t.name for t in ext.tools()}
        await ext.call_tool("toggle_tool", {})
        with fail_after(5):
            await ext.wait_for(lambda s: "extra" in {t.name for t in ext.tools()})
        await ext.stop()


class TestStderr:
    async def test_ring_keeps_only_the_last_lines(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """With log_lines=10, 50 stderr lines leave the last 10, each also logged with the name bound."""
        config = fast_config("quick.py", log_lines=10, env={"QUICK_STDERR_AT_START": "50"})
        ext = make_extension(config)
        with capture_logs(processors=[merge_contextvars]) as logs:
            await running(ext, task_group)
            await eventually(lambda: bool(ext.logs(1)) and ext.logs(1)[0].endswith("line 50"))
        lines = ext.logs(100)
        assert len(lines) == 10 and lines[0].endswith("line 41") and lines[-1].endswith("line 50")
        stderr_events = [e for e in logs if e["event"] == "extension.stderr"]
        assert len(stderr_events) >= 50 and all(e["extension"] == "fx" for e in stderr_events)
        await ext.stop()
