"""A child's questions mid-call, for 2026-07-28 clients: input-required results and their retries.

A real daemon runs ``tests/servers/plain_asker.py`` (``asker.py``, the SDK's server, in the first
test), whose tools ask their client mid-call. Real SDK
``Client`` objects in the 2026-07-28 mode call through ``mcp.sock`` and streamable HTTP: their
input-required driver answers the questions and retries, unchanged. Some tests drive the rounds
by hand (``client.session.call_tool(..., allow_input_required=True)``) to check each rule.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError

from supervisor.gateway.asks import inputrequired
from supervisor.gateway.asks.inputrequired import MAX_PARKED, MAX_PARKED_PER_CLIENT
from supervisor.gateway.asks.parked import Parked
from supervisor.gateway.asks.requeststate import HANDLE_BYTES, Seal
from tests.harness import (
    ANSWERING,
    Daemon,
    eventually,
    extension_settings,
    first_text,
    gateway_session,
    unix_transport,
)
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),  # roots and sampling
]

ASKER = extension_settings("plain_asker.py")  # asker.py on the standard library: no SDK to import
SDK_ASKER = extension_settings("asker.py")
MODERN = "2026-07-28"


def logs(daemon: Daemon) -> str:
    return daemon.cli("logs", "asker").stdout


@pytest.fixture
def start(gateway: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """A daemon on the given extensions, once they run (mcp.sock)."""
    return gateway


@pytest.fixture
def start_http(http_gateway: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """A daemon on the given extensions with its HTTP listener."""
    return http_gateway


@asynccontextmanager
async def modern(daemon: Daemon, **callbacks: Any) -> AsyncIterator[Client]:
    """A 2026-07-28 SDK Client on the daemon's mcp.sock."""
    async with Client(unix_transport(daemon.mcp_sock), mode=MODERN, **callbacks) as client:
        await client.list_tools()
        yield client


async def ask(
    client: Client, tool: str, **arguments: Any
) -> types.CallToolResult | types.InputRequiredResult:
    """One round by hand: the call's result or its input-required result."""
    result = await client.session.call_tool(f"asker__{tool}", arguments, allow_input_required=True)
    assert isinstance(result, types.CallToolResult | types.InputRequiredResult), result
    return result


async def retry(
    client: Client, tool: str, state: str | None, answers: dict[str, Any] | None = None, **arguments: Any
) -> types.CallToolResult | types.InputRequiredResult:
    result = await client.session.call_tool(
        f"asker__{tool}",
        arguments,
        input_responses=answers,
        request_state=state,
        allow_input_required=True,
    )
    assert isinstance(result, types.CallToolResult | types.InputRequiredResult), result
    return result


ACCEPT = types.ElicitResult(action="accept", content={"answer": "by hand"})


class TestDriver:
    async def test_a_stock_client_completes_each_kind_of_question_on_mcp_sock(self, start) -> None:
        daemon = start({"asker": SDK_ASKER})
        async with modern(daemon, **ANSWERING) as client:
            elicited = await client.call_tool("asker__elicit", {"message": "go?"})
            assert first_text(elicited) == 'accept {"answer": "yes to go?"}'
            assert first_text(await client.call_tool("asker__sample", {"prompt": "hello"})) == "m1 hi"
            roots = await client.call_tool("asker__roots", {})
            assert json.loads(first_text(roots)) == ["file:///home/client"]
        assert "asker: elicit -> accept" in logs(daemon)

    async def test_a_stock_client_completes_the_call_over_http(self, start_http) -> None:
        http = start_http({"asker": ASKER})
        async with Client(http.mcp(), mode=MODERN, **ANSWERING) as client:
            elicited = await client.call_tool("asker__elicit", {"message": "over http?"})
            assert first_text(elicited) == 'accept {"answer": "yes to over http?"}'
            assert first_text(await client.call_tool("asker__sample", {"prompt": "x"})) == "m1 hi"
            first = await ask(client, "elicit", message="where from?")
            assert isinstance(first, types.InputRequiredResult)
        async with modern(http, **ANSWERING) as other:  # on mcp.sock
            with pytest.raises(MCPError, match="issued to another client connection"):
                await retry(other, "elicit", first.request_state, {"r1": ACCEPT}, message="where from?")

    async def test_a_per_client_instance_lives_as_long_as_the_connection(self, start) -> None:
        """A 2026-07-28 request has an SDK connection of its own; its per-client instance is the
        mcp.sock connection's, so it outlives the request that parked its call."""
        daemon = start({"asker": {**ASKER, "instances": "per-client"}})
        async with modern(daemon, **ANSWERING) as client:
            elicited = await client.call_tool("asker__elicit", {"message": "mine?"})
            assert first_text(elicited) == 'accept {"answer": "yes to mine?"}'
            assert first_text(await client.call_tool("asker__sample", {"prompt": "p"})) == "m1 hi"
            assert len(daemon.status()["asker"]["instances"]) == 1  # one for the connection, still there
        await eventually(lambda: daemon.status()["asker"]["instances"] == [])  # gone with it

    async def test_over_http_a_per_client_extension_refuses_a_sessionless_call(self, start_http) -> None:
        """2026-07-28 HTTP has no sessions: a per-client extension says so rather than spawn a child
        for the call (which its rounds would otherwise have to keep)."""
        http = start_http({"asker": {**ASKER, "instances": "per-client"}})
        async with Client(http.mcp(), mode=MODERN, **ANSWERING) as client:
            refused = await client.call_tool("asker__elicit", {"message": "http?"})
            assert refused.is_error and "is per-client (one child per client session" in first_text(refused)
        assert http.status()["asker"]["instances"] == []


class TestRounds:
    async def test_the_retry_resumes_the_same_child_call(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            first = await ask(client, "elicit", message="once?")
            assert isinstance(first, types.InputRequiredResult) and first.input_requests
            [(key, request)] = first.input_requests.items()
            assert isinstance(request, types.ElicitRequest) and request.params.message == "once?"
            done = await retry(client, "elicit", first.request_state, {key: ACCEPT}, message="once?")
            assert isinstance(done, types.CallToolResult)
            assert first_text(done) == 'accept {"answer": "by hand"}'
        assert logs(daemon).count("asker: elicit ->") == 1  # one child call, never replayed

    async def test_answering_some_of_several_questions_gets_the_rest_asked(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            args = {"message": "both?", "prompt": "p"}
            first = await ask(client, "both", **args)
            pending = dict(first.input_requests or {}) if isinstance(first, types.InputRequiredResult) else {}
            with fail_after(5):
                while len(pending) < 2:  # the second question came after that round went out
                    assert isinstance(first, types.InputRequiredResult)
                    await anyio.sleep(0.05)
                    first = await retry(client, "both", first.request_state, None, **args)
                    assert isinstance(first, types.InputRequiredResult) and first.input_requests
                    pending = dict(first.input_requests)
            assert sorted(type(r).__name__ for r in pending.values()) == [
                "CreateMessageRequest",
                "ElicitRequest",
            ]
            elicit = next(key for key, r in pending.items() if isinstance(r, types.ElicitRequest))
            rest = await retry(client, "both", first.request_state, {elicit: ACCEPT}, **args)
            assert isinstance(rest, types.InputRequiredResult) and rest.input_requests
            [(sample, request)] = rest.input_requests.items()
            assert isinstance(request, types.CreateMessageRequest) and sample != elicit
            answer = types.CreateMessageResult(
                role="assistant", content=types.TextContent(text="ok"), model="m2"
            )
            done = await retry(client, "both", rest.request_state, {sample: answer}, **args)
            assert isinstance(done, types.CallToolResult)
            assert first_text(done) == 'accept {"answer": "by hand"} | m2 ok'

    async def test_answers_are_validated_before_they_reach_the_child(self, start) -> None:
        """An answer of the wrong shape, or to a question not asked, is refused; the call still waits."""
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            first = await ask(client, "elicit", message="shape?")
            assert isinstance(first, types.InputRequiredResult) and first.input_requests
            [key] = first.input_requests
            wrong = types.CreateMessageResult(
                role="assistant", content=types.TextContent(text="x"), model="m"
            )
            with pytest.raises(MCPError) as refused:
                await retry(client, "elicit", first.request_state, {key: wrong}, message="shape?")
            assert refused.value.code == types.INVALID_PARAMS
            assert "is not an answer to elicitation/create" in refused.value.message
            with pytest.raises(MCPError, match="which is not asked"):
                await retry(client, "elicit", first.request_state, {"r99": ACCEPT}, message="shape?")
            assert "asker: elicit ->" not in logs(daemon)  # nothing reached the child
            done = await retry(client, "elicit", first.request_state, {key: ACCEPT}, message="shape?")
            assert first_text(done) == 'accept {"answer": "by hand"}'  # type: ignore[arg-type]

    async def test_progress_reaches_the_request_that_waits_for_the_call(self, start) -> None:
        daemon = start({"asker": ASKER})
        seen: list[tuple[float, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            seen.append((value, message))

        async with modern(daemon, **ANSWERING) as client:
            result = await client.call_tool(
                "asker__work", {"message": "go?", "steps": 3}, progress_callback=on_progress
            )
            assert first_text(result) == 'accept {"answer": "yes to go?"}; worked 3'
            await eventually(lambda: len(seen) >= 1)
            assert seen[-1] == (3, "step 3")

    async def test_a_prompt_asks_through_input_required_rounds_too(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            prompt = await client.get_prompt("asker__confirm", {"message": "prompt?"})
            assert prompt.messages[0].content.text == 'accept {"answer": "yes to prompt?"}'  # type: ignore[union-attr]


class TestRequestState:
    async def test_a_state_is_good_for_one_retry_of_its_request_from_its_connection(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client, modern(daemon, **ANSWERING) as other:
            first = await ask(client, "elicit", message="mine")
            assert isinstance(first, types.InputRequiredResult) and first.input_requests
            state, [key] = first.request_state, list(first.input_requests)
            assert state is not None
            cases = {
                "another client connection": retry(other, "elicit", state, {key: ACCEPT}, message="mine"),
                "issued for another request": retry(client, "elicit", state, {key: ACCEPT}, message="other"),
                "not issued by this daemon": retry(
                    client, "elicit", state[:-2] + "AA", {key: ACCEPT}, message="mine"
                ),
            }
            for expected, attempt in cases.items():
                with pytest.raises(MCPError) as refused, fail_after(2):  # at once, not after a timeout
                    await attempt
                assert refused.value.code == types.INVALID_PARAMS and expected in refused.value.message
            done = await retry(client, "elicit", state, {key: ACCEPT}, message="mine")
            assert isinstance(done, types.CallToolResult)
            with pytest.raises(MCPError, match="its result was delivered"):
                await retry(client, "elicit", state, {key: ACCEPT}, message="mine")  # replayed after use
        assert logs(daemon).count("asker: elicit ->") == 1

    async def test_a_used_state_is_refused_once_the_next_round_is_out(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            args = {"message": "both?", "prompt": "p"}
            first = await ask(client, "both", **args)
            assert isinstance(first, types.InputRequiredResult)
            second = await retry(client, "both", first.request_state, None, **args)
            assert isinstance(second, types.InputRequiredResult)
            with pytest.raises(MCPError, match="was used already"):
                await retry(client, "both", first.request_state, None, **args)

    async def test_a_daemon_restart_voids_every_state_with_a_clear_error(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            first = await ask(client, "elicit", message="before")
            assert isinstance(first, types.InputRequiredResult) and first.input_requests
        assert daemon.terminate() == 0
        daemon.start()
        daemon.wait_state("asker", "running")
        async with modern(daemon, **ANSWERING) as client:
            with pytest.raises(MCPError) as refused, fail_after(5):
                await retry(client, "elicit", first.request_state, {"r1": ACCEPT}, message="before")
            assert refused.value.code == types.INVALID_PARAMS
            assert "restarted since" in refused.value.message


class TestBounds:
    async def test_a_parked_call_without_a_retry_within_call_timeout_ends(self, start) -> None:
        """A retry within call_timeout resumes the call; a call left without one ends then, not at
        call_timeout_max: the child hears of it, a late retry is told why, and another client's
        question on that child is answered again (a client that walked away blocks nobody)."""
        daemon = start({"asker": {**ASKER, "call_timeout": 1.5, "call_timeout_max": 60}})
        async with (
            modern(daemon, **ANSWERING) as client,
            gateway_session(daemon.mcp_sock, **ANSWERING) as other,
        ):
            first = await ask(client, "elicit", message="in time")
            assert isinstance(first, types.InputRequiredResult)
            done = await retry(client, "elicit", first.request_state, {"r1": ACCEPT}, message="in time")
            assert first_text(done) == 'accept {"answer": "by hand"}'  # type: ignore[arg-type]
            never = await ask(client, "elicit", message="never")
            assert isinstance(never, types.InputRequiredResult)
            await eventually(lambda: "asker: elicit -> cancelled" in logs(daemon), within=10)
            events = [e for e in daemon.events() if e.get("event") == "gateway.parked_call_ended"]
            assert any("got no retry within call_timeout (1.5s)" in e["reason"] for e in events), events
            with pytest.raises(MCPError, match=r"got no retry within call_timeout \(1.5s\)"):
                await retry(client, "elicit", never.request_state, {"r1": ACCEPT}, message="never")
            with fail_after(10):  # the child call let go of, another client is asked again
                while (answered := await other.call_tool("asker__elicit", {"message": "mine"})).is_error:  # noqa: ASYNC110
                    await anyio.sleep(0.2)  # for call_timeout after the cancel, the child may still ask
            assert first_text(answered) == 'accept {"answer": "yes to mine"}'

    async def test_a_question_for_a_cancelled_2026_call_never_reaches_another_client(self, start) -> None:
        """A 2026-07-28 client cancels its call; the child goes on and asks while a handshake-era
        client's call is in flight: the child gets an error, that client is never asked."""
        daemon = start({"asker": {**ASKER, "env": {"ASKER_IGNORE_CANCEL": "1"}}})
        asked: list[str] = []

        async def record(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.append(params.message)
            return ACCEPT

        async with (
            modern(daemon, **ANSWERING) as client,
            gateway_session(daemon.mcp_sock, elicitation_callback=record) as other,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(other.call_tool, "asker__wait", {"seconds": 30})
            await eventually(lambda: daemon.status()["asker"]["in_flight"] == 1)
            async with anyio.create_task_group() as gives_up:
                gives_up.start_soon(functools.partial(ask, client, "slow", delay=1.5, message="modern's"))
                await eventually(lambda: daemon.status()["asker"]["in_flight"] == 2)
                gives_up.cancel_scope.cancel()
            await eventually(lambda: "asker: slow -> " in logs(daemon), within=10)
            assert "calls from 2 clients are in flight" in logs(daemon) and asked == []
            tg.cancel_scope.cancel()

    async def test_a_closed_connection_ends_its_parked_calls_at_once(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            assert isinstance(await ask(client, "elicit", message="bye"), types.InputRequiredResult)
        await eventually(lambda: "asker: elicit -> cancelled" in logs(daemon), within=3)

    async def test_two_calls_in_flight_on_one_shared_child_make_its_question_ambiguous(self, start) -> None:
        """Each 2026-07-28 call is a client of its own: the child's question is refused, never put on
        a parked call that it may not belong to."""
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client, anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(ask, client, "wait", seconds=30))
            await eventually(lambda: daemon.status()["asker"]["in_flight"] == 1)
            with fail_after(5):
                result = await client.call_tool("asker__elicit", {"message": "whose?"})
            assert result.is_error and "calls from 2 clients are in flight" in first_text(result)
            tg.cancel_scope.cancel()

    async def test_a_call_parked_for_its_retry_still_counts_as_a_client_in_flight(self, start) -> None:
        """Until its retry (or call_timeout_max), another client's question on that child is refused."""
        daemon = start({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as parker, modern(daemon, **ANSWERING) as other:
            first = await ask(parker, "elicit", message="later")
            assert isinstance(first, types.InputRequiredResult)
            with fail_after(5):
                refused = await other.call_tool("asker__elicit", {"message": "mine?"})
            assert refused.is_error and "calls from 2 clients are in flight" in first_text(refused)
            [key] = first.input_requests or {}
            done = await retry(parker, "elicit", first.request_state, {key: ACCEPT}, message="later")
            assert first_text(done) == 'accept {"answer": "by hand"}'  # type: ignore[arg-type]
            with fail_after(5):  # the parked call is over: the other client is asked now
                result = await other.call_tool("asker__elicit", {"message": "mine?"})
            assert not result.is_error

    async def test_a_client_without_the_capability_gets_the_child_an_error_at_once(self, start) -> None:
        daemon = start({"asker": ASKER})
        async with modern(daemon) as client:
            with fail_after(2):
                result = await client.call_tool("asker__elicit", {"message": "?"})
            assert result.is_error and "did not declare the elicitation capability" in first_text(result)


class TestTable:
    """The table's own bounds, in process: reaching 128 parked calls through a daemon takes as many
    children (a shared child's question with two calls in flight is refused as ambiguous)."""

    async def test_parked_calls_are_bounded_per_client_and_in_all(self) -> None:
        table = inputrequired.InputRequired()
        question = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message="?", requested_schema={"type": "object", "properties": {}}
            )
        )

        def park(client: object) -> Any:
            call = Parked(os.urandom(16), client, ("tools/call", "t", ""), None)
            table._calls[call.handle] = call
            assert table.room_for(call) is None
            table.ask(call, question)
            return call

        first = [park("a") for _ in range(MAX_PARKED_PER_CLIENT)]
        extra = Parked(os.urandom(16), "a", ("tools/call", "t", ""), None)
        assert f"has {MAX_PARKED_PER_CLIENT} calls waiting" in str(table.room_for(extra))
        table._retire(first[0], "done")  # a slot comes free
        assert table.room_for(extra) is None
        assert first[0].pending == {} or all(p.answered.is_set() for p in first[0].pending.values())
        for n in range(1, MAX_PARKED // MAX_PARKED_PER_CLIENT):
            for _ in range(MAX_PARKED_PER_CLIENT):
                park(n)
        park("a")
        assert len(table) == MAX_PARKED
        stranger = Parked(os.urandom(16), "b", ("tools/call", "t", ""), None)
        assert f"{MAX_PARKED} calls of 2026-07-28 clients wait for input already" in str(
            table.room_for(stranger)
        )

    async def test_at_a_bound_the_call_left_unanswered_longest_makes_room(self) -> None:
        """A client that walked away never starves one still answering: the oldest unattended
        parked call is ended (its child's question fails) to make room; attended ones never are."""
        table = inputrequired.InputRequired()
        question = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message="?", requested_schema={"type": "object", "properties": {}}
            )
        )
        calls = []
        for n in range(MAX_PARKED_PER_CLIENT):
            call = Parked(os.urandom(16), "http", ("tools/call", "t", ""), None)
            table._calls[call.handle] = call
            assert table.room_for(call) is None
            waiting = table.ask(call, question)
            call.parked_at = float(n)  # its input-required result went out at n, unanswered since
            calls.append((call, waiting))
        calls[0][0].attended = True  # its client is retrying right now: not to be ended
        newcomer = Parked(os.urandom(16), "http", ("tools/call", "t", ""), None)
        assert table.room_for(newcomer) is None
        (kept, _), (ended, its_question) = calls[0], calls[1]
        assert ended.scope.cancel_called and ended.handle not in table._calls
        assert its_question.answered.is_set() and "to make room" in str(its_question.error)
        assert kept.handle in table._calls and not kept.scope.cancel_called
        assert len(table) == MAX_PARKED_PER_CLIENT - 1  # the newcomer takes the slot when it asks

    async def test_an_answer_to_a_question_withdrawn_meanwhile_is_dropped_not_refused(self) -> None:
        table = inputrequired.InputRequired()
        call = Parked(os.urandom(16), "c", ("tools/call", "t", ""), None)
        question = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message="?", requested_schema={"type": "object", "properties": {}}
            )
        )
        table._calls[call.handle] = call
        table.ask(call, question)  # r1: put to the client, then withdrawn by the child
        call.pending.pop("r1")
        table.ask(call, question)  # r2: still waiting
        answers = table._validated(call, {"r1": ACCEPT, "r2": ACCEPT})
        assert list(answers) == ["r2"]
        with pytest.raises(MCPError, match="which is not asked"):
            table._validated(call, {"r3": ACCEPT})  # never put to the client
        for odd in ("r²", "r" + "9" * 5000, "r", "x1"):  # an invalid-params error, never an internal one
            with pytest.raises(MCPError, match="which is not asked") as refused:
                table._validated(call, {odd: ACCEPT})
            assert refused.value.code == types.INVALID_PARAMS


class TestSeal:
    def test_a_state_opens_only_unaltered_and_under_its_own_key(self) -> None:
        seal, handle = Seal(), os.urandom(HANDLE_BYTES)
        state = seal.seal(handle, 3)
        assert state.startswith("msv1.") and seal.open(state) == (handle, 3)
        assert Seal().open(state) is None  # another daemon run
        flipped = state[:-1] + ("A" if state[-1] != "A" else "B")
        for bad in (flipped, state + "x", "msv1.", "", "v2." + state[5:], "msv1." + "A" * 200):
            assert seal.open(bad) is None, bad
