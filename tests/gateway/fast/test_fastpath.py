"""The gateway's fast path for tool calls: recognised from the line, answered without the SDK.

The SDK's path is the reference: every test of ``test_gateway.py`` runs through the fast path
once its client has listed tools (the SDK's ClientSession lists before it calls). Here: what the
fast path takes and leaves, that it is taken, and that both paths answer alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor import sockets
from supervisor.gateway.fast import parse as fastpath
from supervisor.gateway.fast.parse import FastCall
from supervisor.gateway.hello import HELLO_METHOD
from supervisor.gateway.links import expose_json as expose_links
from supervisor.gateway.unix import MAX_IN_FLIGHT
from tests.harness import ECHO, RICH, Daemon, eventually, extension_settings
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def start(gateway: Callable[..., Daemon]) -> Callable[..., Daemon]:
    return gateway


SPOOL = "file:///var/cache/spool/"


def _line(message: Any) -> bytes:
    return json.dumps(message).encode()


def _call(request_id: Any = 1, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


class TestParse:
    def test_a_plain_call_is_taken_with_its_progress_token(self) -> None:
        line = _line(_call(7, name="a__b", arguments={"x": [1, {"y": None}]}, _meta={"progressToken": "t"}))
        assert fastpath.parse(line) == FastCall(7, "a__b", {"x": [1, {"y": None}]}, "t")
        assert fastpath.parse(_line(_call("s", name="n"))) == FastCall("s", "n", None, None)

    @pytest.mark.parametrize(
        "message",
        [
            pytest.param({**_call(name="n"), "extra": 1}, id="unknown member"),
            pytest.param({**_call(name="n"), "jsonrpc": "1.0"}, id="not JSON-RPC 2.0"),
            pytest.param(_call(True, name="n"), id="boolean id"),
            pytest.param(_call(1.5, name="n"), id="float id"),
            pytest.param(_call(None, name="n"), id="no id"),
            pytest.param(_call(name=5), id="name not a string"),
            pytest.param(_call(name="n", arguments=[1]), id="arguments not an object"),
            pytest.param(_call(name="n", task={"ttl": 1}), id="task augmented"),
            pytest.param(
                _call(name="n", _meta={"io.modelcontextprotocol/protocolVersion": "x"}), id="2026 meta"
            ),
            pytest.param(_call(name="n", _meta={"progressToken": True}), id="boolean token"),
            pytest.param({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": "tools/call"}}),
            pytest.param(
                {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "n"}}, id="notification"
            ),
        ],
    )
    def test_anything_else_is_left_to_the_sdk(self, message: dict[str, Any]) -> None:
        assert fastpath.parse(_line(message)) is None

    @pytest.mark.parametrize(
        "line",
        [
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"n","arguments":{"x":NaN}}}',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800"}}',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"n"}',
            b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"n"}}]',
        ],
        ids=["NaN", "lone surrogate", "cut short", "batch"],
    )
    def test_what_strict_json_refuses_is_left_to_the_sdk(self, line: bytes) -> None:
        assert fastpath.parse(line) is None

    def test_cancelled_id(self) -> None:
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}
        assert fastpath.cancelled_id(_line(cancel)) == 3
        assert fastpath.cancelled_id(_line({**cancel, "params": {"requestId": False}})) is None
        assert fastpath.cancelled_id(_line({**cancel, "method": "x", "y": "notifications/cancelled"})) is None


_MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}


class TestParseModern:
    def test_a_call_as_the_sdks_client_sends_it_is_taken_with_what_it_declared(self) -> None:
        modern = fastpath.parse_modern(
            _line(_call(2, name="a__b", arguments={"t": "hi"}, _meta=_MODERN_META))
        )
        assert modern == fastpath.ModernCall(
            FastCall(2, "a__b", {"t": "hi"}, None), "2026-07-28", {"elicitation": {}}
        )
        assert (
            fastpath.parse(_line(_call(2, name="a__b", _meta=_MODERN_META))) is None
        )  # not a handshake-era one

    @pytest.mark.parametrize(
        "meta",
        [
            pytest.param({**_MODERN_META, "progressToken": 1}, id="progress token"),
            pytest.param({**_MODERN_META, "io.modelcontextprotocol/logLevel": "debug"}, id="log level"),
            pytest.param({**_MODERN_META, "io.modelcontextprotocol/protocolVersion": "2025-11-25"}, id="old"),
            pytest.param({**_MODERN_META, "io.modelcontextprotocol/clientCapabilities": []}, id="odd caps"),
            pytest.param({**_MODERN_META, "io.modelcontextprotocol/clientInfo": 5}, id="odd client info"),
            pytest.param({"progressToken": 1}, id="handshake era"),
            pytest.param(None, id="no meta"),
        ],
    )
    def test_anything_else_is_left_to_the_sdk(self, meta: dict[str, Any] | None) -> None:
        for _ in range(2):  # the verdict on a _meta is kept: the second time too
            assert fastpath.parse_modern(_line(_call(name="n", _meta=meta))) is None


class TestMetaVerdicts:
    def test_at_most_64_are_kept_and_never_a_big_one(self) -> None:
        """The SDK's verdict on a client's ``_meta`` is kept, as it sends the same every call;
        a flood of different ones keeps 64, and a big one (it could be megabytes) none."""
        for n in range(100):
            info = {"name": f"client {n}", "version": "1"}
            meta = {**_MODERN_META, "io.modelcontextprotocol/clientInfo": info}
            assert fastpath.parse_modern(_line(_call(name="n", _meta=meta))) is not None
        assert fastpath._valid_meta.cache_info().currsize == 64
        fastpath._valid_meta.cache_clear()
        capabilities = {"experimental": {"x": {"y": "z" * 10_000}}}
        big = {**_MODERN_META, "io.modelcontextprotocol/clientCapabilities": capabilities}
        assert fastpath.parse_modern(_line(_call(name="n", _meta=big))) is not None
        assert fastpath._valid_meta.cache_info().currsize == 0


class TestExposeLinks:
    def test_child_uris_are_exposed_and_spool_links_kept(self) -> None:
        content = [
            {"type": "text", "text": "resource_link"},
            {"type": "resource_link", "uri": "note://a", "name": "a"},
            {"type": "resource_link", "uri": SPOOL + "x/1.png", "name": "spooled"},
            {"type": "resource", "resource": {"uri": "note://b", "text": "B"}},
            {"type": "resource", "resource": "not an object"},
            "not an item",
        ]
        exposed = expose_links("ext", content, SPOOL)
        assert exposed[1]["uri"] == "mcp-supervisor://ext/note://a"
        assert exposed[3]["resource"] == {"uri": "mcp-supervisor://ext/note://b", "text": "B"}
        assert [exposed[i] for i in (0, 2, 4, 5)] == [content[i] for i in (0, 2, 4, 5)]
        assert content[1]["uri"] == "note://a"  # the input is not changed


class _Raw:
    """A client speaking raw JSON lines to mcp.sock; notifications are kept aside."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)
        self.notifications: list[dict[str, Any]] = []
        self._ids = iter(range(1, 1 << 30))

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send(_line(message) + b"\n")

    async def reply(self, request_id: Any, *, any_id: bool = False) -> dict[str, Any]:
        with fail_after(20):
            while True:
                message = json.loads(await self.reader.receive_until(b"\n", 64 << 20))
                if "id" in message and "method" not in message:
                    assert any_id or message["id"] == request_id, message
                    return message
                self.notifications.append(message)

    async def request(self, method: str, **params: Any) -> dict[str, Any]:
        request_id = next(self._ids)
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.reply(request_id)

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return await self.request("tools/call", name=tool, arguments=arguments)


@asynccontextmanager
async def _raw_client(daemon: Daemon, *, list_tools: bool, profile: str | None = None) -> AsyncIterator[_Raw]:
    async with await sockets.connect(daemon.mcp_sock) as stream:
        raw = _Raw(stream)
        if profile is not None:  # as `connect --profile` opens
            assert "result" in await raw.request(HELLO_METHOD, name=profile)
        info = {"name": "raw", "version": "0"}
        await raw.request("initialize", protocolVersion="2025-11-25", capabilities={}, clientInfo=info)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if list_tools:
            assert "result" in await raw.request("tools/list")
        yield raw


def _child_id(answer: dict[str, Any]) -> Any:
    return json.loads(answer["result"]["content"][0]["text"])["id"]


class TestThroughTheDaemon:
    async def test_a_per_client_extensions_calls_go_fast_to_the_clients_own_instance(
        self, start: Callable[..., Daemon]
    ) -> None:
        daemon = start({"rich": {**RICH, "instances": "per-client"}})
        async with _raw_client(daemon, list_tools=True) as one, _raw_client(daemon, list_tools=True) as two:
            for raw in (one, two, one):
                assert str(_child_id(await raw.call("rich__request"))).startswith("mcpsv-")  # fast
            instances = daemon.status()["rich"]["instances"]
            assert len(instances) == 2 and len({instance["pid"] for instance in instances}) == 2
        await eventually(lambda: daemon.status()["rich"]["instances"] == [], within=10)

    async def test_calls_go_fast_once_the_client_listed_tools(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=False) as raw:
            assert isinstance(_child_id(await raw.call("rich__request")), int)  # the SDK's session
            assert "result" in await raw.request("tools/list")
            assert str(_child_id(await raw.call("rich__request"))).startswith("mcpsv-")

    async def test_a_profile_hides_on_the_fast_path_too(self, start: Callable[..., Daemon]) -> None:
        profiles = {"no-wait": {"tools": {"deny": ["rich__wait"]}}}
        daemon = start({"rich": RICH}, profiles=profiles)
        async with _raw_client(daemon, list_tools=True, profile="no-wait") as raw:
            assert str(_child_id(await raw.call("rich__request"))).startswith("mcpsv-")
            hidden = await raw.call("rich__wait", seconds=30)
            assert "error" in hidden or hidden["result"]["isError"] is True, hidden
            assert "rich__wait" in json.dumps(hidden)
            assert daemon.status()["rich"]["in_flight"] == 0

    async def test_both_paths_answer_alike(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"rich": RICH, "echo": ECHO})
        calls: list[tuple[str, dict[str, Any]]] = [
            ("rich__echo", {"text": "héllo ☃"}),
            ("rich__link", {}),
            ("echo__echo", {"text": "x" * 10_000}),
            ("rich__nope", {}),  # unknown: a JSON-RPC error
            ("rich__echo", {}),  # the child's own error
            ("rich__image", {"bytes": 100}),
        ]
        answers: dict[bool, list[dict[str, Any]]] = {}
        for fast in (False, True):
            async with _raw_client(daemon, list_tools=fast) as raw:
                answers[fast] = [await raw.call(tool, **arguments) for tool, arguments in calls]
        for slow, fast in zip(answers[False], answers[True], strict=True):
            assert {k: v for k, v in fast.items() if k != "id"} == {
                k: v for k, v in slow.items() if k != "id"
            }
        assert answers[True][1]["result"]["content"][0]["uri"] == "mcp-supervisor://rich/note://a"
        assert "error" in answers[True][3]

    async def test_spooled_media_and_progress_on_the_fast_path(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=True) as raw:
            image = (await raw.call("rich__image", bytes=100_000))["result"]["content"][1]
            assert image["type"] == "resource_link" and image["uri"].startswith("file://")
            read = await raw.request("resources/read", uri=image["uri"])
            assert "blob" in read["result"]["contents"][0]
            await raw.send(
                _call(99, name="rich__progress", arguments={"steps": 3}, _meta={"progressToken": "p"})
            )
            assert (await raw.reply(99))["result"]["content"][0]["text"] == "did 3 steps"
            progress = [n["params"] for n in raw.notifications if n["method"] == "notifications/progress"]
            assert progress and {p["progressToken"] for p in progress} == {"p"}
            assert progress[-1]["progress"] <= 3 and progress[-1]["total"] == 3

    async def test_a_crash_mid_call_fails_it_at_once(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=True) as raw:
            with fail_after(5):
                answer = await raw.call("rich__crash")
            assert answer["result"]["isError"] is True
            assert "may or may not have run" in answer["result"]["content"][0]["text"]

    async def test_cancelled_calls_reach_the_child_and_free_their_slots(
        self, start: Callable[..., Daemon]
    ) -> None:
        """More cancelled calls than a connection has slots: none stays behind, anywhere."""
        daemon = start({"rich": RICH})

        async def cancel(request_id: int) -> None:
            params = {"requestId": request_id, "reason": "test"}
            await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})

        async with _raw_client(daemon, list_tools=True) as raw:
            for request_id in (1000, 1001):  # in the child when cancelled: the child hears of it
                await raw.send(_call(request_id, name="rich__wait", arguments={"seconds": 60}))
                await eventually(lambda: daemon.status()["rich"]["in_flight"] == 1, within=10)
                await cancel(request_id)
                await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)
            await eventually(lambda: daemon.cli("logs", "rich").stdout.count("rich: cancelled") == 2)
            for request_id in range(2000, 2000 + MAX_IN_FLIGHT + 8):  # cancelled at any point
                await raw.send(_call(request_id, name="rich__wait", arguments={"seconds": 60}))
                await cancel(request_id)
            with fail_after(10):  # a leaked slot would leave this unread
                assert str(_child_id(await raw.call("rich__request"))).startswith("mcpsv-")
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)
            assert raw.notifications == []  # a cancelled request gets no answer


ODD = extension_settings("odd_answers.py", call_timeout=4)


async def _timed_call(raw: _Raw, tool: str, **params: Any) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    answer = await raw.request("tools/call", name=tool, arguments={}, **params)
    return time.monotonic() - started, answer


class TestOddChildren:
    """Answers a lenient child writes: each is answered at once on both paths, never after call_timeout."""

    @pytest.mark.parametrize("tool", ["odd__nan", "odd__bignan"])
    async def test_nan_is_null_on_both_paths(self, start: Callable[..., Daemon], tool: str) -> None:
        daemon = start({"odd": ODD})
        for fast in (False, True):
            async with _raw_client(daemon, list_tools=fast) as raw:
                took, answer = await _timed_call(raw, tool)
            assert took < 2 and answer["result"]["structuredContent"] == {"v": None}, (fast, answer)

    async def test_a_huge_progress_value_is_dropped(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"odd": ODD})
        async with _raw_client(daemon, list_tools=True) as raw:
            took, answer = await _timed_call(raw, "odd__bigint", _meta={"progressToken": "p"})
            assert took < 2 and answer["result"]["content"][0]["text"] == "ok"
            assert daemon.status()["odd"]["state"] == "running"

    async def test_an_unreadable_answer_fails_its_call_at_once(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"odd": ODD})
        async with _raw_client(daemon, list_tools=True) as raw:
            took, answer = await _timed_call(raw, "odd__surrogate")
        assert took < 2 and "not valid JSON" in answer["error"]["message"]

    async def test_an_error_code_that_is_no_integer(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"odd": ODD})
        async with _raw_client(daemon, list_tools=True) as raw:
            answer = (await _timed_call(raw, "odd__boolcode"))[1]
        assert (
            answer["result"]["isError"] is True and "invalid result" in answer["result"]["content"][0]["text"]
        )

    async def test_a_live_childs_own_error_minus_32000_is_its_own(self, start: Callable[..., Daemon]) -> None:
        """-32000 is also what we say when a child dies mid-call; a live child's is passed through."""
        daemon = start({"odd": ODD})
        pid = daemon.status()["odd"]["pid"]
        for fast in (False, True):
            async with _raw_client(daemon, list_tools=fast) as raw:
                answer = (await _timed_call(raw, "odd__busy"))[1]
            assert answer["error"] == {"code": -32000, "message": "odd: database is locked, retry in 5s"}, (
                fast
            )
        cli = daemon.cli("call", "odd", "busy")
        assert (
            cli.returncode == 1 and "database is locked" in cli.stderr and "may or may not" not in cli.stderr
        )
        assert (daemon.status()["odd"]["state"], daemon.status()["odd"]["pid"]) == ("running", pid)

    async def test_a_cancel_during_a_big_progress_line_cuts_nothing(
        self, start: Callable[..., Daemon]
    ) -> None:
        """The client reads the first byte of a 2 MiB progress line, nothing more while it goes out,
        then cancels: every line it reads afterwards is whole."""
        daemon = start({"odd": {**ODD, "call_timeout": 30}})
        async with _raw_client(daemon, list_tools=True) as raw:
            await raw.send(_call(7, name="odd__bigprogress", arguments={}, _meta={"progressToken": "p"}))
            with fail_after(10):  # the line has begun to go out (a cancel before it drops it)
                head = await raw.reader.receive_exactly(1)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
            await raw.send(cancel)  # the line goes out whole first (or the client is dropped)
            await raw.send(_call(8, name="odd__echo", arguments={"text": "after"}))
            with fail_after(10):
                progress = json.loads(head + await raw.reader.receive_until(b"\n", 64 << 20))
                after = json.loads(await raw.reader.receive_until(b"\n", 64 << 20))
            await eventually(lambda: daemon.status()["odd"]["in_flight"] == 0, within=10)
        assert (
            progress["method"] == "notifications/progress" and len(progress["params"]["message"]) == 2 << 20
        )
        assert after["id"] == 8 and after["result"]["content"][0]["text"] == "after"


class TestOddClients:
    async def test_a_json_array_naming_cancelled_is_an_error_not_a_crash(
        self, start: Callable[..., Daemon]
    ) -> None:
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=True) as raw:
            await raw.stream.send(b'["notifications/cancelled"]\n')
            assert (await raw.reply(None))["error"]["code"] == -32600
            assert (await raw.call("rich__echo", text="still"))["result"]["content"][0]["text"] == "still"
        assert not [e for e in daemon.events() if e["event"] == "gateway.connection_crashed"]

    async def test_a_cancel_mentioning_tools_call_still_cancels(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=True) as raw:
            await raw.send(_call(5, name="rich__wait", arguments={"seconds": 60}))
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 1, within=10)
            params = {"requestId": 5, "reason": 'a "tools/call" that is no longer needed'}
            await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)

    async def test_a_repeated_id_frees_the_right_slot(self, start: Callable[..., Daemon]) -> None:
        """Two calls with one id, the second answered first, the first cancelled: no slot is lost."""
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=True) as raw:
            for request_id in range(10_000, 10_000 + MAX_IN_FLIGHT + 4):
                await raw.send(_call(request_id, name="rich__wait", arguments={"seconds": 60}))
                await raw.send(_call(request_id, name="rich__echo", arguments={"text": "b"}))
                with fail_after(10):  # a leaked slot leaves the connection unread
                    await raw.reply(request_id)
                params = {"requestId": request_id, "reason": "test"}
                await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)


class TestInline:
    """A call without a progress token is served by callbacks, not a task: the same behaviour."""

    async def test_it_times_out_on_call_timeout_and_the_child_is_told(
        self, start: Callable[..., Daemon]
    ) -> None:
        daemon = start({"rich": {**RICH, "call_timeout": 1}})
        async with _raw_client(daemon, list_tools=True) as raw:
            started = time.monotonic()
            answer = await raw.call("rich__wait", seconds=60)
            elapsed = time.monotonic() - started
            assert answer["result"]["isError"] is True, answer  # a tool error, as on the awaited path
            assert "did not answer within 1s" in answer["result"]["content"][0]["text"]
            assert 1 <= elapsed < 5
            await eventually(lambda: "rich: cancelled" in daemon.cli("logs", "rich").stdout)
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)
            assert (await raw.call("rich__echo", text="after"))["result"]["content"][0]["text"] == "after"
        text = daemon.request("health", {"format": "prometheus"})["text"]  # counted as awaited calls are
        assert 'mcp_supervisor_tool_calls_total{extension="rich",tool="wait"} 1.0' in text
        assert 'mcp_supervisor_tool_call_errors_total{extension="rich",tool="wait"} 1.0' in text
        assert 'mcp_supervisor_tool_calls_total{extension="rich",tool="echo"} 1.0' in text

    async def test_progress_keeps_it_alive_past_call_timeout(self, start: Callable[..., Daemon]) -> None:
        daemon = start({"rich": {**RICH, "call_timeout": 1}})
        async with _raw_client(daemon, list_tools=True) as raw:
            started = time.monotonic()
            answer = await raw.call("rich__progress", steps=5, interval=0.5)
            elapsed = time.monotonic() - started
            assert answer["result"]["content"][0]["text"] == "did 5 steps", answer
            assert elapsed >= 2.5
            assert raw.notifications == []  # it asked for no progress

    async def test_a_client_gone_mid_call_cancels_it_in_the_child_and_spares_the_other(
        self, start: Callable[..., Daemon]
    ) -> None:
        daemon = start({"rich": RICH})
        async with _raw_client(daemon, list_tools=True) as other:
            async with _raw_client(daemon, list_tools=True) as gone:
                for request_id in (1, 2, 3):
                    await gone.send(_call(request_id, name="rich__wait", arguments={"seconds": 60}))
                await eventually(lambda: daemon.status()["rich"]["in_flight"] == 3, within=10)
                assert (await other.call("rich__echo", text="meanwhile"))["result"]["content"][0]["text"]
            await eventually(lambda: daemon.cli("logs", "rich").stdout.count("rich: cancelled") == 3)
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)
            assert (await other.call("rich__echo", text="after"))["result"]["content"][0]["text"] == "after"

    async def test_answers_the_socket_cannot_take_at_once_arrive_whole(
        self, start: Callable[..., Daemon]
    ) -> None:
        """Many big answers to a client that reads none for a while: each line whole, none lost."""
        daemon = start({"rich": RICH})
        text = "x" * (256 << 10)
        async with _raw_client(daemon, list_tools=True) as raw:
            ids = list(range(100, 100 + MAX_IN_FLIGHT))
            for request_id in ids:
                await raw.send(_call(request_id, name="rich__echo", arguments={"text": text}))
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=20)  # all answered
            assert await _echoes(raw, len(ids), text) == set(ids)

    async def test_a_client_not_reading_is_not_read_past_its_slots(
        self, start: Callable[..., Daemon]
    ) -> None:
        """An answer waiting for the socket keeps its request's slot: no queue of answers grows."""
        daemon = start({"rich": RICH})
        text = "x" * (64 << 10)
        async with _raw_client(daemon, list_tools=True) as raw, anyio.create_task_group() as senders:

            async def send() -> None:  # until the daemon stops reading us: then this send blocks
                for request_id in range(1000, 1000 + 8 * MAX_IN_FLIGHT):
                    await raw.send(_call(request_id, name="rich__echo", arguments={"text": text}))

            senders.start_soon(send)
            await eventually(lambda: _calls(daemon, "echo") >= MAX_IN_FLIGHT, within=30)
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 0, within=10)
            answered = await _settled(lambda: _calls(daemon, "echo"))
            assert answered <= 2 * MAX_IN_FLIGHT  # the slots, and what the socket buffers
            assert len(await _echoes(raw, answered, text)) == answered  # every answer whole
            await eventually(lambda: _calls(daemon, "echo") > answered, within=10)
            senders.cancel_scope.cancel()


async def _echoes(raw: _Raw, count: int, text: str) -> set[Any]:
    """The ids of the next *count* answers, each checked to echo *text*."""
    ids = set()
    with fail_after(20):
        for _ in range(count):
            message = json.loads(await raw.reader.receive_until(b"\n", 64 << 20))
            assert message["result"]["content"][0]["text"] == text
            ids.add(message["id"])
    return ids


async def _settled(read: Callable[[], int], quiet: float = 1.0) -> int:
    """*read*'s value once it has stayed the same for *quiet* seconds (a value that stops growing)."""
    with fail_after(30):
        value, since = read(), time.monotonic()
        while time.monotonic() - since < quiet:
            await anyio.sleep(0.1)
            if (now := read()) != value:
                value, since = now, time.monotonic()
    return value


def _calls(daemon: Daemon, tool: str) -> int:
    text = daemon.request("health", {"format": "prometheus"})["text"]
    series = f'mcp_supervisor_tool_calls_total{{extension="rich",tool="{tool}"}} '
    return next((int(float(line.split()[-1])) for line in text.splitlines() if line.startswith(series)), 0)
