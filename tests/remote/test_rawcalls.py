"""A remote extension's plain tool calls through the gateway (supervisor/remote/rawcalls.py):
posted beside the SDK's session, and answered, asked, cancelled and failed as through it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession, MCPError

from tests.harness import Daemon, first_text, gateway_session, until
from tests.harness.timing import fail_after, patience
from tests.remote import Remote, text

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@asynccontextmanager
async def listed(path: str, **session_args: Any) -> AsyncIterator[ClientSession]:
    """A gateway session that listed tools: its plain calls take the fast path from then on."""
    async with gateway_session(path, **session_args) as session:
        await session.list_tools()
        yield session


class TestBeside:
    @pytest.mark.parametrize("mode", ["http", "json"])
    async def test_plain_calls_go_beside_the_session_and_80_at_once_are_all_answered(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], mode: str
    ) -> None:
        """A gateway client's plain call is posted with a raw id (the control socket's call goes
        through the SDK's session, with its integer id); more at once than a run posts go the
        SDK's way, and every one gets its own answer."""
        remote = remotes(mode)
        daemon = daemons({"far": remote.entry()})
        daemon.wait_state("far", "running")
        assert text(daemon.call("far", "request_id")).isdigit()
        async with listed(daemon.mcp_sock) as session:
            for _ in range(2):  # and still after the first: nothing in its streams makes it stop
                assert first_text(await session.call_tool("far__request_id", {})).startswith("mcpsv-")
            answers: dict[int, str] = {}

            async def one(n: int) -> None:
                answers[n] = first_text(await session.call_tool("far__echo", {"text": f"call {n}"}))

            with fail_after(60):
                async with anyio.create_task_group() as calls:
                    for n in range(80):
                        calls.start_soon(one, n)
        assert answers == {n: f"call {n}" for n in range(80)}
        assert daemon.status()["far"]["in_flight"] == 0

    async def test_a_question_on_the_call_s_stream_reaches_its_client(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """The server's sampling request, sent on the raw call's own event stream, goes to the
        session and on to the client that made the call; its answer goes back to the server."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        daemon.wait_state("far", "running")
        asked: list[str] = []

        async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            content = params.messages[0].content
            asked.append(content.text if isinstance(content, types.TextContent) else "?")
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(text="sampled"), model="test"
            )

        async with listed(daemon.mcp_sock, sampling_callback=sample) as session:
            with fail_after(30):
                result = await session.call_tool("far__ask", {"prompt": "a question"})
        assert first_text(result) == "sampled" and asked == ["a question"]

    async def test_a_log_message_on_the_call_s_stream_is_what_logs_shows(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        daemon.wait_state("far", "running")
        async with listed(daemon.mcp_sock) as session:
            assert first_text(await session.call_tool("far__log", {"text": "from a raw call"})) == "logged"
        lines = lambda: daemon.request("logs", {"name": "far"})["lines"]  # noqa: E731
        until(lambda: any("from a raw call" in line for line in lines()), within=patience(10))


class TestEnds:
    async def test_a_cancelled_call_is_cancelled_at_the_server(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """The client gives up: the server gets notifications/cancelled for the raw id, and its
        handler ends; the run serves on."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        first = daemon.wait_state("far", "running")
        async with listed(daemon.mcp_sock) as session:
            with anyio.move_on_after(patience(1)):
                await session.call_tool("far__sleep", {"seconds": 60})
            cancelled = lambda: json.loads(text(daemon.call("far", "cancelled")))  # noqa: E731
            seen = lambda: any(i.startswith("mcpsv-") for i in cancelled())  # noqa: E731
            await anyio.to_thread.run_sync(until, seen, 10)  # the session's cancel goes meanwhile
            assert first_text(await session.call_tool("far__echo", {"text": "on"})) == "on"
        assert daemon.status()["far"]["restarts"] == first["restarts"]

    async def test_an_answer_it_cannot_decode_fails_that_call_only_and_is_no_crash(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry()})
        first = daemon.wait_state("far", "running")
        async with listed(daemon.mcp_sock) as session:
            assert text(daemon.call("far", "flood_next", kind="garbled")) == "armed"
            with fail_after(30), pytest.raises(MCPError, match="unreadable"):
                await session.call_tool("far__echo", {"text": "never"})
            assert first_text(await session.call_tool("far__echo", {"text": "still"})) == "still"
        assert daemon.status()["far"]["restarts"] == first["restarts"]
        assert not daemon.find("extension.raw_call_crashed")

    async def test_an_answer_over_the_limit_fails_that_call_only(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(max_message_bytes=100_000)})
        first = daemon.wait_state("far", "running")
        async with listed(daemon.mcp_sock) as session:
            with fail_after(30), pytest.raises(MCPError, match="100000 bytes"):  # the limit, named
                await session.call_tool("far__big_text", {"bytes": 500_000})
            assert first_text(await session.call_tool("far__echo", {"text": "still"})) == "still"
        assert daemon.status()["far"]["restarts"] == first["restarts"]

    async def test_a_server_that_dies_mid_call_fails_it_at_once(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(call_timeout=120)})
        daemon.wait_state("far", "running")
        outcome: list[Any] = []
        ended = anyio.Event()
        async with listed(daemon.mcp_sock) as session, anyio.create_task_group() as tasks:

            async def call() -> None:
                try:
                    outcome.append(await session.call_tool("far__sleep", {"seconds": 60}))
                except MCPError as exc:
                    outcome.append(exc)
                ended.set()

            tasks.start_soon(call)
            sent = lambda: daemon.status()["far"]["in_flight"] == 1  # noqa: E731
            await anyio.to_thread.run_sync(until, sent, 10)  # the call goes meanwhile
            remote.kill()
            with fail_after(15):
                await ended.wait()
        (failed,) = outcome
        message = first_text(failed) if isinstance(failed, types.CallToolResult) else str(failed)
        assert "may or may not have run" in message, failed

    async def test_a_lost_session_fails_the_call_and_the_next_run_serves(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote]
    ) -> None:
        """A 404 for the session ends the run as it is read: the call fails at once (it never
        waits for call_timeout), and a new run initializes and serves raw calls again."""
        remote = remotes("http")
        daemon = daemons({"far": remote.entry(call_timeout=120)})
        first = daemon.wait_state("far", "running")
        async with listed(daemon.mcp_sock) as session:
            assert first_text(await session.call_tool("far__forget", {})) == "forgotten"
            with fail_after(15):
                lost = await session.call_tool("far__echo", {"text": "lost"})
            assert lost.is_error, lost
            until(lambda: daemon.status()["far"]["restarts"] > first["restarts"], within=patience(10))
            daemon.wait_state("far", "running")
            assert first_text(await session.call_tool("far__request_id", {})).startswith("mcpsv-")
