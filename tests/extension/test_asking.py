"""A child's elicitation, sampling and roots requests, through the gateway to the calling client.

A real daemon runs ``tests/servers/plain_asker.py`` (``asker.py``, the SDK's server, in the first
test), whose tools ask their client mid-call; real SDK
clients answer on mcp.sock (both the fast path and the SDK's path), and through ``connect``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from pydantic import ValidationError

from supervisor.config.settings import StdioConfig
from supervisor.control import client
from supervisor.control.methods import PROGRESS_INTERVAL
from supervisor.extension import asking as callers
from supervisor.extension.asking import MAX_ABANDONED
from supervisor.gateway.session import MAX_ASKS
from supervisor.upstream.wire import Watched
from tests.harness import (
    ANSWERING,
    CLI,
    INITIALIZE,
    RICH,
    Daemon,
    eventually,
    extension_settings,
    first_text,
    gateway_session,
    list_home,
)
from tests.harness.timing import fail_after, patience

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),  # roots and sampling: handshake era
]

ASKER = extension_settings("plain_asker.py")  # asker.py on the standard library: no SDK to import
SDK_ASKER = extension_settings("asker.py")


@pytest.fixture
def start(gateway: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """A daemon on the given extensions, once they run (the gateway fixture)."""
    return gateway


# A _meta member besides progressToken makes the gateway serve a call on the SDK's path.
PATHS = {"fast": None, "sdk": {"test": "take the SDK's path"}}


def logs(daemon: Daemon) -> str:
    return daemon.cli("logs", "asker").stdout


async def call(
    session: ClientSession, tool: str, path: str = "fast", **arguments: Any
) -> types.CallToolResult:
    return await session.call_tool(f"asker__{tool}", arguments, meta=PATHS[path])


class TestAnswered:
    @pytest.mark.parametrize("path", list(PATHS))
    async def test_each_request_reaches_the_calling_client_and_its_answer_the_child(
        self, start, path
    ) -> None:
        daemon = start({"asker": SDK_ASKER})
        async with gateway_session(daemon.mcp_sock, **ANSWERING) as session:
            await session.list_tools()  # opens the fast path
            elicited = await call(session, "elicit", path, message="go?")
            assert first_text(elicited) == 'accept {"answer": "yes to go?"}'
            assert first_text(await call(session, "sample", path, prompt="hello")) == "m1 hi"
            assert json.loads(first_text(await call(session, "roots", path))) == ["file:///home/client"]
        assert "asker: elicit -> accept" in logs(daemon)

    async def test_a_stock_client_through_connect_is_asked(self, start) -> None:
        daemon = start({"asker": ASKER})
        command = [sys.executable, "-m", "supervisor", "connect", "--socket", daemon.socket]
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write, **ANSWERING) as session:
            await session.initialize()
            await session.list_tools()
            assert first_text(await call(session, "elicit", message="via connect")).startswith("accept")

    async def test_waiting_for_the_client_holds_the_inactivity_budget_not_the_cap(self, start) -> None:
        """A 1 s call_timeout does not cut a 1.5 s answer; a 2.5 s call_timeout_max cuts a 4 s one."""
        patient = {**ASKER, "call_timeout": 1, "call_timeout_max": 2.5}
        daemon = start({"asker": patient})
        delay = 1.5

        async def slow(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            await anyio.sleep(delay)
            return types.ElicitResult(action="decline")

        async with gateway_session(daemon.mcp_sock, elicitation_callback=slow) as session:
            assert first_text(await call(session, "elicit", message="slow")).startswith("decline")
            delay = 4
            started = time.monotonic()
            result = await call(session, "elicit", message="too slow")
            assert result.is_error and "call_timeout_max (2.5s)" in first_text(result)
            assert time.monotonic() - started < 3.5
        await eventually(
            lambda: "asker: elicit -> cancelled" in logs(daemon) or "elicit -> error" in logs(daemon)
        )


class TestRefused:
    @pytest.mark.parametrize("path", list(PATHS))
    async def test_a_client_without_the_capability_gets_the_child_an_error_at_once(self, start, path) -> None:
        daemon = start({"asker": ASKER})
        async with gateway_session(daemon.mcp_sock) as session:
            await session.list_tools()
            for tool, capability in (("elicit", "elicitation"), ("sample", "sampling")):
                started = time.monotonic()
                result = await call(session, tool, path)
                assert time.monotonic() - started < 0.5
                assert result.is_error
                assert f"did not declare the {capability} capability" in first_text(result)
                assert first_text(result).startswith(f"error {types.INVALID_REQUEST}: mcp-supervisor cannot")

    async def test_roots_fall_back_to_the_config_then_to_none(self, start) -> None:
        daemon = start({"asker": {**ASKER, "roots": ["/srv/work", "/srv/a b"]}, "bare": ASKER})
        async with gateway_session(daemon.mcp_sock) as session:
            assert json.loads(first_text(await session.call_tool("asker__roots", {}))) == [
                "file:///srv/work",
                "file:///srv/a%20b",
            ]
            assert json.loads(first_text(await session.call_tool("bare__roots", {}))) == []

    async def test_a_call_from_the_control_socket_cannot_be_asked(self, start) -> None:
        daemon = start({"asker": ASKER})
        result = daemon.cli("call", "asker", "elicit", "--json")
        assert "control socket" in result.stdout, result

    async def test_a_request_outside_any_call_is_refused(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with gateway_session(daemon.mcp_sock, **ANSWERING) as session:
            assert first_text(await session.call_tool("asker__later", {"delay": 0.2})) == "later"
            await eventually(lambda: "asker: later ->" in logs(daemon))
        assert "outside any call" in logs(daemon)

    async def test_calls_from_two_clients_in_flight_make_it_ambiguous(self, start) -> None:
        """A waits in a call; B's elicitation cannot be told from A's: the child gets an error."""
        daemon = start({"asker": ASKER})
        asked: list[str] = []

        async def record(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.append(params.message)
            return types.ElicitResult(action="accept", content={"answer": "a guess"})

        sock = daemon.mcp_sock
        async with (
            gateway_session(sock, elicitation_callback=record) as a,
            gateway_session(sock, elicitation_callback=record) as b,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(a.call_tool, "asker__wait", {"seconds": 30})
            await eventually(lambda: daemon.status()["asker"]["in_flight"] == 1)
            result = await b.call_tool("asker__elicit", {"message": "whose?"})
            assert result.is_error and "calls from 2 clients are in flight" in first_text(result)
            tg.cancel_scope.cancel()
        assert asked == []  # nobody was asked a question that may not be theirs

    async def test_per_client_instances_ask_each_client_its_own_question(self, start) -> None:
        """With `instances: per-client` each client's calls have a child of their own: two clients
        eliciting at once are each asked their own question, answered in the other's presence."""
        daemon = start({"asker": {**ASKER, "instances": "per-client"}})
        asked: dict[str, str] = {}
        both_asked = anyio.Event()

        def answering(label: str) -> Any:
            async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
                asked[label] = params.message
                if len(asked) == 2:
                    both_asked.set()
                with fail_after(20):
                    await both_asked.wait()  # both questions are out at once
                return types.ElicitResult(action="accept", content={"answer": label})

            return answer

        results: dict[str, str] = {}

        async def client(label: str) -> None:
            async with gateway_session(daemon.mcp_sock, elicitation_callback=answering(label)) as session:
                await session.list_tools()
                results[label] = first_text(await call(session, "elicit", message=f"for {label}?"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(client, "a")
            tg.start_soon(client, "b")
        assert asked == {"a": "for a?", "b": "for b?"}
        assert results == {"a": 'accept {"answer": "a"}', "b": 'accept {"answer": "b"}'}

    async def test_a_clients_asks_are_bounded(self, start) -> None:
        """Past MAX_ASKS questions waiting for one client, more are refused at once."""
        daemon = start({"asker": ASKER})
        release = anyio.Event()
        waiting = 0

        async def hold(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            nonlocal waiting
            waiting += 1
            await release.wait()
            return types.ElicitResult(action="cancel")

        results: list[str] = []

        async def one(session: ClientSession) -> None:
            results.append(first_text(await session.call_tool("asker__elicit", {"message": "n"})))

        async with (
            gateway_session(daemon.mcp_sock, elicitation_callback=hold) as session,
            anyio.create_task_group() as tg,
        ):
            for _ in range(MAX_ASKS):
                tg.start_soon(one, session)
            await eventually(lambda: waiting == MAX_ASKS)
            await one(session)
            assert f"{MAX_ASKS} requests waiting already" in results[0]
            release.set()
        assert sum(text.startswith("cancel") for text in results) == MAX_ASKS


ASKS_AFTER_CANCEL = {**ASKER, "env": {"ASKER_IGNORE_CANCEL": "1"}}  # goes on with a cancelled call


def accept_as(who: str, asked: list[str]) -> Any:
    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": who})

    return answer


class TestAbandoned:
    """A call the gateway stopped waiting for may still be served, and ask: never for another client."""

    @pytest.mark.parametrize("path", list(PATHS))
    async def test_a_question_for_a_cancelled_call_never_reaches_another_client(self, start, path) -> None:
        """B cancels its call; the child goes on and asks while only A has a call in flight: the
        child gets an error, A is never asked. Once the child answered B's call, A is asked again."""
        daemon = start({"asker": ASKS_AFTER_CANCEL})
        asked: list[str] = []
        sock = daemon.mcp_sock
        async with (
            gateway_session(sock, elicitation_callback=accept_as("a", asked)) as a,
            gateway_session(sock, elicitation_callback=accept_as("b", asked)) as b,
            anyio.create_task_group() as tg,
        ):
            await b.list_tools()  # opens the fast path
            tg.start_soon(a.call_tool, "asker__wait", {"seconds": 30})
            await eventually(lambda: daemon.status()["asker"]["in_flight"] == 1)
            async with anyio.create_task_group() as gives_up:  # it asks well within CANCEL_GRACE
                gives_up.start_soon(functools.partial(call, b, "slow", path, delay=0.5, message="b's"))
                await eventually(lambda: daemon.status()["asker"]["in_flight"] == 2)
                gives_up.cancel_scope.cancel()
            await eventually(lambda: "asker: slow -> " in logs(daemon), within=10)
            assert "asker: cancel ignored" in logs(daemon)
            assert "slow -> error -32600" in logs(daemon) and "calls from 2 clients are in flight" in logs(
                daemon
            )
            assert asked == []  # nobody was asked a question that may not be theirs
            with fail_after(10):  # the child answered b's call: it no longer counts
                while (mine := await a.call_tool("asker__elicit", {"message": "a's"})).is_error:  # noqa: ASYNC110
                    await anyio.sleep(0.1)  # its answer may still be on its way to the daemon
            assert first_text(mine) == 'accept {"answer": "a"}' and asked == ["a's"]
            tg.cancel_scope.cancel()

    async def test_a_question_for_a_timed_out_call_never_reaches_another_client(self, start) -> None:
        """B's call hits call_timeout (2 s) and is cancelled; the child asks for it a moment later
        (within CANCEL_GRACE), while A's call waits for A's own answer: A is asked its own
        question only."""
        daemon = start({"asker": {**ASKS_AFTER_CANCEL, "call_timeout": 2}})
        asked: list[str] = []
        release = anyio.Event()

        async def hold(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.append(params.message)
            await release.wait()
            return types.ElicitResult(action="decline")

        sock = daemon.mcp_sock
        async with (
            gateway_session(sock, elicitation_callback=hold) as a,
            gateway_session(sock, **ANSWERING) as b,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(a.call_tool, "asker__elicit", {"message": "a's"})
            await eventually(lambda: asked == ["a's"])
            timed_out = await b.call_tool("asker__slow", {"delay": 2.3, "message": "b's"})
            assert timed_out.is_error and "did not answer within 2s" in first_text(timed_out)
            await eventually(lambda: "asker: slow -> " in logs(daemon), within=10)
            assert "calls from 2 clients are in flight" in logs(daemon)
            assert asked == ["a's"]
            release.set()

    @pytest.mark.parametrize("leaves", [False, True], ids=["cancels", "goes"])
    async def test_a_call_its_client_gave_up_stops_counting_after_the_grace(self, start, leaves) -> None:
        """A cancels its long call (or goes away); the child follows the spec and never answers
        it. B's own question reaches B within seconds, not after A's call_timeout (60 s)."""
        assert ASKER.get("call_timeout", 60) >= 60
        daemon = start({"asker": ASKER})
        asked: list[str] = []
        sock = daemon.mcp_sock
        async with gateway_session(sock, elicitation_callback=accept_as("b", asked)) as b:
            if leaves:  # a raw client that closes its connection with the call in flight, unsaid
                async with await anyio.connect_unix(sock) as a_raw:
                    params = {"name": "asker__wait", "arguments": {"seconds": 3600}}
                    for message in (
                        INITIALIZE,
                        {"jsonrpc": "2.0", "method": "notifications/initialized"},
                        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
                    ):
                        await a_raw.send(json.dumps(message).encode() + b"\n")
                    await eventually(lambda: daemon.status()["asker"]["in_flight"] == 1)
            else:
                async with gateway_session(sock, elicitation_callback=accept_as("a", asked)) as a:
                    async with anyio.create_task_group() as gives_up:
                        gives_up.start_soon(a.call_tool, "asker__wait", {"seconds": 3600})
                        await eventually(lambda: daemon.status()["asker"]["in_flight"] == 1)
                        gives_up.cancel_scope.cancel()  # the SDK sends notifications/cancelled
                    await a.list_tools()  # A stays connected, with nothing in flight
            await eventually(lambda: daemon.status()["asker"]["in_flight"] == 0)
            started = time.monotonic()
            with fail_after(20):  # refused for CANCEL_GRACE, then answered: until then, retry
                while (mine := await b.call_tool("asker__elicit", {"message": "b's"})).is_error:
                    assert "calls from 2 clients are in flight" in first_text(mine)
                    await anyio.sleep(0.1)
        assert first_text(mine) == 'accept {"answer": "b"}' and asked == ["b's"]
        assert time.monotonic() - started < 20  # where it took call_timeout (60 s) before

    @pytest.mark.parametrize("path", list(PATHS))
    async def test_once_a_question_is_answered_silence_ends_the_call_after_call_timeout(
        self, start, path
    ) -> None:
        """A question holds the budget (a person may take long); answered, call_timeout counts again."""
        daemon = start({"asker": {**ASKER, "call_timeout": 1, "call_timeout_max": 40}})

        async def slow_answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            await anyio.sleep(1.5)  # past call_timeout: the question held the call
            return types.ElicitResult(action="accept", content={"answer": "late"})

        async with gateway_session(daemon.mcp_sock, elicitation_callback=slow_answer) as session:
            await session.list_tools()
            started = time.monotonic()
            result = await call(session, "stall", path, message="go?")
            elapsed = time.monotonic() - started
        assert result.is_error and "did not answer within 1s" in first_text(result), first_text(result)
        assert 2.5 <= elapsed < 10  # the answer at 1.5 s, then 1 s of silence; never call_timeout_max
        assert "asker: stall -> accept" in logs(daemon)

    async def test_abandoned_calls_are_bounded_per_run(self) -> None:
        """Past MAX_ABANDONED, the one due to end first is folded into a time of ambiguity."""
        watched = Watched()
        left = callers._Abandoned(watched)
        for n in range(MAX_ABANDONED + 10):
            call = callers._Call(None, callers.Budget(anyio.CancelScope(), 60 + n, 600))
            call.sending(f"mcpsv-{n}")
            left.add(call)
        assert len(left) == MAX_ABANDONED and len(watched.ids) == MAX_ABANDONED
        assert left in left.clients()  # what was folded in makes any question ambiguous
        last = f"mcpsv-{MAX_ABANDONED + 9}"
        until = left._left[last].until
        progress = {"progressToken": last, "progress": 1}
        watched.see({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
        assert left._left[last].until > until  # the child still works on it: it counts longer
        watched.see({"jsonrpc": "2.0", "id": last, "result": {}})  # the child answered it: it goes
        assert len(left) == MAX_ABANDONED - 1 and last not in watched.ids


class TestDisconnect:
    @pytest.mark.parametrize("path", list(PATHS))
    async def test_a_disconnect_ends_what_the_child_waits_for_at_once(self, start, path) -> None:
        daemon = start({"asker": ASKER})
        asked = anyio.Event()

        async def never(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.set()
            await anyio.sleep_forever()
            raise AssertionError

        async with gateway_session(daemon.mcp_sock, elicitation_callback=never) as session:
            await session.list_tools()
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, session, "elicit", path)
                with fail_after(10):
                    await asked.wait()
                tg.cancel_scope.cancel()
        started = time.monotonic()  # a child left waiting would wait out call_timeout (60 s)
        await eventually(lambda: daemon.status()["asker"]["in_flight"] == 0, within=10)
        await eventually(lambda: "asker: elicit -> " in logs(daemon), within=10)
        assert time.monotonic() - started < patience(10)


class TestRootsChanged:
    async def test_a_clients_roots_change_reaches_children_that_got_its_roots(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with gateway_session(daemon.mcp_sock, list_roots_callback=list_home) as session:
            await session.send_roots_list_changed()  # the child never saw these roots: not told
            assert json.loads(first_text(await session.call_tool("asker__roots", {}))) == [
                "file:///home/client"
            ]
            assert "roots changed" not in logs(daemon)
            await session.send_roots_list_changed()
            await eventually(lambda: "asker: roots changed" in logs(daemon))

    @pytest.mark.parametrize("path", list(PATHS))
    async def test_a_clients_own_instance_hears_of_its_roots_change(self, start, path) -> None:
        """With `instances: per-client` the child that got the client's roots is the client's own."""
        daemon = start({"asker": {**ASKER, "instances": "per-client"}})

        def told() -> bool:
            return any(e.get("line") == "asker: roots changed" for e in daemon.events())

        async with gateway_session(daemon.mcp_sock, list_roots_callback=list_home) as session:
            await session.list_tools()  # opens the fast path
            assert json.loads(first_text(await call(session, "roots", path))) == ["file:///home/client"]
            assert len(daemon.status()["asker"]["instances"]) == 1
            await session.send_roots_list_changed()
            await eventually(told)


class TestConfig:
    def test_roots_are_absolute_paths(self) -> None:
        assert StdioConfig(command="x", roots=["/srv/a/../b", "/"]).roots == ["/srv/b", "/"]
        with pytest.raises(ValidationError, match="'src' is not an absolute path"):
            StdioConfig(command="x", roots=["src"])


class TestCallProgress:
    """`mcp-supervisor call` shows the child's progress on a terminal, and only there."""

    async def test_the_control_socket_sends_progress_before_the_result_and_bounds_it(self, start) -> None:
        daemon = start({"rich": RICH})
        seen: list[tuple[str, dict[str, Any]]] = []

        def on_notification(method: str, params: dict[str, Any]) -> None:
            seen.append((method, params))

        arguments = {"steps": 3, "interval": 0.3}
        params = {"name": "rich", "tool": "progress", "arguments": arguments, "progress": True}
        result = await client.request(daemon.socket, "call", params, on_notification=on_notification)
        assert result["content"][0]["text"] == "did 3 steps"
        assert seen == [("progress", {"progress": i, "total": 3, "message": f"step {i}"}) for i in (1, 2, 3)]
        seen.clear()
        started = time.monotonic()
        burst = {**params, "arguments": {"steps": 400, "interval": 0.001}}
        await client.request(daemon.socket, "call", burst, on_notification=on_notification)
        assert 1 <= len(seen) <= (time.monotonic() - started) / PROGRESS_INTERVAL + 1  # not one per step
        before = len(seen)
        quiet = {**params, "progress": False}
        await client.request(daemon.socket, "call", quiet, on_notification=on_notification)
        assert len(seen) == before  # none unless asked for

    async def test_the_cli_shows_one_status_line_on_a_terminal_and_nothing_elsewhere(self, start) -> None:
        daemon = start({"rich": RICH})
        command = [*CLI, "call", "rich", "progress", "--args", '{"steps": 2, "interval": 0.3}']
        command += ["--socket", daemon.socket]

        def on_a_terminal() -> tuple[str, bytes]:
            controller, terminal = os.openpty()
            with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=terminal) as proc:
                os.close(terminal)
                shown = b""
                with contextlib.suppress(OSError):  # EIO once the process closed the terminal
                    while chunk := os.read(controller, 4096):
                        shown += chunk
                stdout = proc.communicate(timeout=20)[0].decode()
            os.close(controller)
            return stdout, shown

        stdout, shown = await anyio.to_thread.run_sync(on_a_terminal)
        assert stdout == "did 2 steps\n"
        assert b"\r\x1b[Kprogress: 1/2 step 1" in shown and b"progress: 2/2 step 2" in shown
        assert shown.endswith(b"\r\x1b[K")  # erased before the result is printed
        plain = await anyio.to_thread.run_sync(
            lambda: subprocess.run(command, capture_output=True, timeout=20)
        )
        assert plain.stdout == b"did 2 steps\n" and plain.stderr == b""
