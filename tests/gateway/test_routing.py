"""Where a gateway name leads while extensions stop, start and restart (a real daemon, real clients).

A name belongs to its extension for as long as the config stands: it is assigned over every
configured extension's last known listing, so another extension stopping never hands it over.
A call to a configured extension on its way (starting, in backoff, in a restart) waits for it;
only a stop by hand and unknown names answer at once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp import Client

from tests.harness import INITIALIZE, Daemon, extension_settings, first_text, gateway_session
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

SLOW_META = {"test": "take the SDK's path"}  # a _meta member besides progressToken: the SDK's path
# quick.py's tools after a second of stderr progress: each start lasts, without the CPU of an SDK one
A_SECOND_TO_START = extension_settings("slow_start.py", env={"SLOW_START_SECONDS": "1"}, call_timeout=30)


def pid_of(daemon: Daemon, name: str = "echo") -> int:
    return int(daemon.status()[name]["pid"])


def exposed_names(daemon: Daemon, extension: str) -> set[str]:
    records = json.loads(daemon.cli("tools", "--json").stdout)["tools"]
    return {record["exposed"] for record in records if record["extension"] == extension}


class TestNames:
    async def test_a_name_stays_with_its_extension_when_another_stops(self, gateway) -> None:
        """`p` lists `_echo` and `p_` lists `echo`: both want `p___echo`, and `one` (sorting first)
        has it. Stopping `one` leaves `two`'s names as they were; `p___echo` answers that `one` is
        stopped, and never reaches `two`."""
        one = extension_settings("rich.py", prefix="p", env={"RICH_TOOL_PREFIX": "_"})
        daemon = gateway({"one": one, "two": {**extension_settings("rich.py"), "prefix": "p_"}})
        twos = exposed_names(daemon, "two")
        assert "p___echo" in exposed_names(daemon, "one") and len(twos) == 15  # rich.py's tools
        async with gateway_session(daemon.mcp_sock) as session:
            await session.list_tools()  # opens the fast path
            assert first_text(await session.call_tool("p___echo", {"text": "to one"})) == "to one"
            await anyio.to_thread.run_sync(daemon.cli, "stop", "one")
            after = {t.name for t in (await session.list_tools()).tools}
            assert after == twos and "p___echo" not in after  # two's names did not move
            for path in (None, SLOW_META):  # the fast path, the SDK's path
                result = await session.call_tool("p___echo", {"text": "to whom?"}, meta=path)
                assert result.is_error, result
                assert (
                    first_text(result)
                    == "extension 'one' is stopped; start it with `mcp-supervisor start one`"
                )
        assert "to whom?" not in daemon.cli("logs", "two").stdout

    async def test_names_outlive_a_daemon_restart(self, gateway) -> None:
        """Listings are saved for every extension: the next daemon assigns the same names while
        only the loser of a collision runs."""
        one = extension_settings("rich.py", prefix="p", env={"RICH_TOOL_PREFIX": "_"})
        two = {**extension_settings("rich.py"), "prefix": "p_"}
        daemon = gateway({"one": one, "two": two})
        twos = exposed_names(daemon, "two")
        assert daemon.terminate() == 0
        edited = json.loads(daemon.config.read_text())
        edited["extensions"]["one"]["autostart"] = False
        daemon.config.write_text(json.dumps(edited))
        daemon.start()
        daemon.wait_state("two", "running")
        async with gateway_session(daemon.mcp_sock) as session:
            listed = {t.name for t in (await session.list_tools()).tools}
        assert listed == twos


class TestRestarts:
    async def test_calls_during_a_restart_wait_for_it(self, gateway) -> None:
        """After `restart --no-wait`, calls on the fast path, the SDK's path and `mcp-supervisor call`
        wait for the new child (which takes a second to start) and get its answer."""
        daemon = gateway({"echo": A_SECOND_TO_START})
        old = pid_of(daemon)
        results: dict[str, str] = {}
        async with gateway_session(daemon.mcp_sock) as session:
            await session.list_tools()  # opens the fast path

            async def over(path: str, meta: dict[str, Any] | None) -> None:
                result = await session.call_tool("echo__pid", {}, meta=meta)
                results[path] = first_text(result) if not result.is_error else f"error: {first_text(result)}"

            async def by_cli() -> None:
                done = await anyio.to_thread.run_sync(daemon.cli, "call", "echo", "pid")
                results["cli"] = done.stdout.strip() if done.returncode == 0 else f"error: {done.stderr}"

            restarted = await anyio.to_thread.run_sync(daemon.cli, "restart", "echo", "--no-wait")
            assert restarted.returncode == 0, restarted.stderr
            async with anyio.create_task_group() as tg:
                tg.start_soon(over, "fast", None)
                tg.start_soon(over, "sdk", SLOW_META)
                tg.start_soon(by_cli)
        new = pid_of(daemon)
        assert new != old
        assert results == {"fast": str(new), "sdk": str(new), "cli": str(new)}

    async def test_a_call_over_http_during_a_restart_waits_for_it(self, http_gateway) -> None:
        http = http_gateway({"echo": A_SECOND_TO_START})
        old = pid_of(http)
        for mode in ("legacy", "2026-07-28"):
            async with Client(http.mcp(), mode=mode) as client:
                await client.list_tools()
                restarted = await anyio.to_thread.run_sync(http.cli, "restart", "echo", "--no-wait")
                assert restarted.returncode == 0, restarted.stderr
                result = await client.call_tool("echo__pid", {})
                assert not result.is_error, first_text(result)
                assert int(first_text(result)) not in (old, 0)
                old = int(first_text(result))

    async def test_a_stop_by_hand_and_an_unknown_name_answer_at_once(self, gateway) -> None:
        daemon = gateway({"echo": extension_settings("quick.py", call_timeout=30)})
        async with gateway_session(daemon.mcp_sock) as session:
            await session.list_tools()
            await anyio.to_thread.run_sync(daemon.cli, "stop", "echo")
            for meta in (None, SLOW_META):
                started = time.monotonic()
                result = await session.call_tool("echo__pid", {}, meta=meta)
                assert (
                    first_text(result)
                    == "extension 'echo' is stopped; start it with `mcp-supervisor start echo`"
                )
                result = await session.call_tool("echo__nothing_like_it", {}, meta=meta)
                assert "is stopped; start it with `mcp-supervisor start echo`" in first_text(result)
                assert time.monotonic() - started < 2


@asynccontextmanager
async def connect_process(daemon: Daemon) -> AsyncIterator[anyio.abc.Process]:
    argv = [sys.executable, "-m", "supervisor", "connect", "--socket", daemon.socket]
    async with await anyio.open_process(argv, env=dict(os.environ)) as process:
        try:
            yield process
        finally:
            if process.returncode is None:
                process.kill()


class Lines:
    """JSON lines from a process's stdout."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process, self.pending = process, b""

    async def send(self, *messages: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    async def answer(self, request_id: int) -> dict[str, Any]:
        assert self.process.stdout is not None
        with fail_after(30):
            while True:
                while b"\n" in self.pending:
                    line, _, self.pending = self.pending.partition(b"\n")
                    message = json.loads(line)
                    if message.get("id") == request_id:
                        return message
                self.pending += await self.process.stdout.receive()


class TestDaemonRestart:
    async def test_a_call_held_by_connect_waits_for_its_extension_to_start(self, gateway) -> None:
        """`connect` holds a call made while the daemon restarts and sends it once it is back; the
        extension is still starting then (for 3 s), and the call waits for it rather than fail."""
        slow = extension_settings("slow_start.py", env={"SLOW_START_SECONDS": "3"}, call_timeout=30)
        daemon = gateway({"echo": slow})
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "echo__pid", "arguments": {}},
        }
        async with connect_process(daemon) as process:
            lines = Lines(process)
            await lines.send(INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert "result" in await lines.answer(0)
            assert daemon.terminate() == 0
            await lines.send(call)  # held: nobody listens
            daemon.start()
            answer = await lines.answer(1)
        assert "result" in answer and not answer["result"].get("isError"), answer
        assert int(answer["result"]["content"][0]["text"]) == pid_of(daemon)
