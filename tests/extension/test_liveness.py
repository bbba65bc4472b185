"""Liveness: ping_interval / ping_timeout restart a child that stops answering, and only such a child."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import pydantic
import pytest
from anyio.abc import TaskGroup
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from supervisor.config.settings import StdioConfig
from supervisor.errors import CallFailed
from supervisor.extension.liveness import is_unresponsive
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from tests.harness import extension_settings, fast_config, first_text, gateway_session, running
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MakeExtension = Callable[..., Extension]
INTERVAL, TIMEOUT = 0.3, 0.6
TEARDOWN = 2.5  # stop_timeout 1 s (the hung loop never reads stdin's close), then SIGTERM; and load


class TestVerdict:
    def test_answered_ping_is_alive(self) -> None:
        """An answered ping clears the child, busy or not, however long since a call was answered."""
        assert not is_unresponsive(answered=True, in_flight=0, since_answer=1e6, timeout=1)
        assert not is_unresponsive(answered=True, in_flight=3, since_answer=1e6, timeout=1)

    def test_idle_and_silent_is_unresponsive(self) -> None:
        """No calls in flight and no answer to the ping: not answering."""
        assert is_unresponsive(answered=False, in_flight=0, since_answer=0.0, timeout=1)

    def test_busy_serial_server_answering_calls_is_alive(self) -> None:
        """A one-request-at-a-time server cannot answer a ping during a call; a recent answer counts."""
        assert not is_unresponsive(answered=False, in_flight=2, since_answer=0.5, timeout=1)

    def test_busy_with_every_call_silent_is_unresponsive(self) -> None:
        """Calls in flight and none answered within the timeout: not answering."""
        assert is_unresponsive(answered=False, in_flight=2, since_answer=1.0, timeout=1)


class TestConfig:
    def test_off_by_default(self) -> None:
        config = StdioConfig(command="x")
        assert (config.ping_interval, config.ping_timeout) == (None, 10.0)

    @pytest.mark.parametrize("key", ["ping_interval", "ping_timeout"])
    @pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "soon"])
    def test_positive_finite_numbers_only(self, key: str, value: object) -> None:
        with pytest.raises(pydantic.ValidationError, match=key):
            StdioConfig.model_validate({"command": "x", key: value})


class TestRestart:
    async def test_idle_child_that_stops_answering_is_restarted(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A child whose loop hangs while idle is restarted within about interval + timeout."""
        config = fast_config(
            "hang.py", ping_interval=INTERVAL, ping_timeout=TIMEOUT, env={"HANG_AFTER": "0.5"}
        )
        ext = make_extension(config)
        with capture_logs(processors=[merge_contextvars]) as logs:
            first = await running(ext, task_group)
            frozen = time.monotonic() + 0.5
            with fail_after(0.5 + INTERVAL + TIMEOUT + TEARDOWN + 2):
                after = await ext.wait_for(lambda s: s.state is not State.RUNNING)
            detected = time.monotonic() - frozen
            assert after.last_error is not None and after.last_error.startswith("not answering"), after
            assert after.unresponsive == 1
            # Seen from outside: it left RUNNING within about one interval + timeout of freezing.
            assert detected <= INTERVAL + TIMEOUT + 1.0, detected
            with fail_after(10):
                again = await ext.wait_for(lambda s: s.state is State.RUNNING and s.pid != first.pid)
        assert again.restarts == 1 and again.unresponsive == 1
        assert again.as_dict()["unresponsive"] == 1
        events = [e for e in logs if e["event"] == "extension.not_answering"]
        assert events and events[0]["extension"] == "fx"
        await ext.stop()

    async def test_call_that_never_answers_restarts_and_fails_the_call(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """All calls in flight silent (and pings too) for ping_timeout: restarted; the call says why."""
        ext = make_extension(fast_config("hang.py", ping_interval=INTERVAL, ping_timeout=TIMEOUT))
        first = await running(ext, task_group)
        started = time.monotonic()
        with pytest.raises(CallFailed, match="not answering"):
            await ext.call_tool("sleep", {})  # quick.py's loop blocks for an hour; call_timeout is 10 s
        assert time.monotonic() - started <= INTERVAL + TIMEOUT + TEARDOWN
        with fail_after(10):
            again = await ext.wait_for(lambda s: s.state is State.RUNNING and s.pid != first.pid)
        assert again.unresponsive == 1
        await ext.stop()

    async def test_healthy_slow_call_is_not_restarted(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A call longer than ping_timeout on a child that answers pings meanwhile is left alone."""
        ext = make_extension(fast_config("rich.py", ping_interval=0.2, ping_timeout=0.5))
        first = await running(ext, task_group)
        result = await ext.call_tool("sleep", {"seconds": 2.0})  # four ping timeouts long
        assert first_text(result) == "slept"
        after = ext.snapshot()
        assert (after.state, after.pid, after.restarts, after.unresponsive) == (
            State.RUNNING,
            first.pid,
            0,
            0,
        )
        await ext.stop()

    @pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")
    async def test_child_waiting_for_a_clients_answer_is_alive(self, gateway) -> None:
        """A serial child blocked on its elicitation (no pings answered) while the client thinks."""
        settings = extension_settings("hang.py", ping_interval=0.2, ping_timeout=0.5)
        daemon = gateway({"hang": settings})

        async def slow(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            await anyio.sleep(1.5)  # three ping timeouts
            return types.ElicitResult(action="decline")

        async with gateway_session(daemon.mcp_sock, elicitation_callback=slow) as session:
            result = await session.call_tool("hang__ask", {"message": "well?"})
            assert first_text(result) == "decline", result
        status = daemon.status()["hang"]
        assert (status["state"], status["restarts"], status["unresponsive"]) == ("running", 0, 0)
