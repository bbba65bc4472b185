"""Tasks (2025-11-25) through the gateway: task-augmented calls and tasks/*, routed by namespaced id.

A real daemon runs ``tests/servers/tasks.py`` (twice, as ``alpha`` and ``beta``, whose own task
ids clash). The SDK's ``ClientSession`` cannot take a ``CreateTaskResult`` for ``tools/call``
(it checks the result against ``CallToolResult``), so the handshake-era client here speaks
plain JSON-RPC on mcp.sock; the SDK's session is used where it can be (``tasks/get`` with
``send_request``), and the SDK's 2026-07-28 ``Client`` for that era.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client, MCPError
from pydantic import TypeAdapter

from supervisor import sockets
from supervisor.gateway.tasks.ids import MAX_ID_LENGTH, parse_task_id, task_id
from supervisor.gateway.tasks.owners import Owners
from supervisor.gateway.tasks.router import MAX_LIST_REQUESTS, MAX_PAGE
from tests.harness import MAX_LINE, Daemon, extension_settings, first_text, gateway_session, unix_transport
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TASKS = extension_settings("tasks.py")
ID = re.compile(r"(?P<ext>[a-z]+):(?P<run>[0-9a-f]{12}):(?P<child>task-\d+)")
RAW = TypeAdapter(dict[str, Any])


class Failed(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.code: int = error["code"]
        self.message: str = error.get("message", "")
        self.data: Any = error.get("data")


class RawClient:
    """A 2025-11-25 client in plain JSON-RPC on one mcp.sock connection; requests may overlap."""

    def __init__(self, stream: Any, tg: anyio.abc.TaskGroup) -> None:
        self._stream = stream
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self.asked: list[dict[str, Any]] = []  # the gateway's requests to us, answered "accept"
        tg.start_soon(self._read)

    async def _read(self) -> None:
        buffered = BufferedByteReceiveStream(self._stream)
        while True:
            try:
                message = json.loads(await buffered.receive_until(b"\n", MAX_LINE))
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            if "method" in message and "id" in message:
                self.asked.append(message)
                answer = {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"action": "accept", "content": {}},
                }
                await self._stream.send(json.dumps(answer).encode() + b"\n")
            waiter = self._waiting.pop(message.get("id"), None) if "method" not in message else None
            if waiter is not None:
                waiter[1].append(message)
                waiter[0].set()

    async def request(self, method: str, params: dict[str, Any] | None = None, within: float = 10) -> Any:
        """The result of *method*; :class:`Failed` for an error answer."""
        request_id = next(self._ids)
        done, box = anyio.Event(), []
        self._waiting[request_id] = (done, box)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        await self._stream.send(json.dumps(message).encode() + b"\n")
        with fail_after(within):
            await done.wait()
        if "error" in box[0]:
            raise Failed(box[0]["error"])
        return box[0]["result"]

    async def create(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """Call *tool* as a task; the task object of its CreateTaskResult."""
        result = await self.request(
            "tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 60000}}
        )
        return result["task"]

    async def wait_status(self, task_id: str, status: str, within: float = 5.0) -> dict[str, Any]:
        """Poll ``tasks/get`` until the task has *status*; the last answer."""
        deadline = time.monotonic() + within
        while True:
            task = await self.request("tasks/get", {"taskId": task_id})
            if task["status"] == status or time.monotonic() > deadline:
                assert task["status"] == status, task
                return task
            await anyio.sleep(0.02)


@asynccontextmanager
async def raw_client(
    daemon: Daemon, capabilities: dict[str, Any] | None = None
) -> AsyncIterator[tuple[RawClient, dict[str, Any]]]:
    """An initialized :class:`RawClient` declaring *capabilities*, and the gateway's initialize result."""
    async with await sockets.connect(daemon.mcp_sock) as stream, anyio.create_task_group() as tg:
        client = RawClient(stream, tg)
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities or {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        initialized = await client.request("initialize", hello)
        await stream.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        yield client, initialized
        tg.cancel_scope.cancel()


@pytest.fixture
def start(gateway: Callable[..., Daemon]) -> Callable[..., Daemon]:
    return gateway


def list_all_pages(pages: list[dict[str, Any]]) -> list[str]:
    return [task["taskId"] for page in pages for task in page["tasks"]]


class TestIds:
    @pytest.mark.parametrize("child", ["task-1", "a:b:c", "786512e2-9e0d-44bd", " ", "é/字"])
    def test_any_child_id_round_trips(self, child: str) -> None:
        """Pure and reversible: the child's id comes back whole, colons and all."""
        assert parse_task_id(task_id("fx-1", "0123456789ab", child)) == ("fx-1", "0123456789ab", child)

    @pytest.mark.parametrize(
        "value", ["", "fx", "fx:0123456789ab", "fx:0123456789ab:", "f x:0123456789ab:1", "fx:0123:1", "fx::1"]
    )
    def test_what_the_gateway_never_hands_out_is_refused(self, value: str) -> None:
        assert parse_task_id(value) is None


class TestRequiredTaskTool:
    async def test_create_poll_until_completed_then_result(self, start) -> None:
        """The capability is declared; a required-task tool answers a namespaced task, polled to a result."""
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, initialized):
            assert initialized["capabilities"]["tasks"] == {
                "list": {},
                "cancel": {},
                "requests": {"tools": {"call": {}}},
            }
            tools = {t["name"]: t for t in (await client.request("tools/list"))["tools"]}
            assert tools["tasks__slow"]["execution"] == {"taskSupport": "required"}
            task = await client.create("tasks__slow", seconds=0.3, text="hello")
            match = ID.fullmatch(task["taskId"])
            assert match and match["ext"] == "tasks" and match["child"] == "task-1", task
            assert task["status"] == "working" and task["pollInterval"] == 50
            done = await client.wait_status(task["taskId"], "completed")
            assert done["taskId"] == task["taskId"]
            result = await client.request("tasks/result", {"taskId": task["taskId"]})
            assert result["content"] == [{"type": "text", "text": "done: hello"}]
            assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
        # the child's notifications/tasks/status on the way: not forwarded, and no cause for a warning
        assert [e for e in daemon.events() if e["level"] in ("warning", "error")] == []

    async def test_result_blocks_until_the_task_ends(self, start) -> None:
        """tasks/result asked at once waits for the work (0.5 s), while tasks/get still answers."""
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _), anyio.create_task_group() as tg:
            task = await client.create("tasks__slow", seconds=0.5, text="later")
            started, results = time.monotonic(), []

            async def wait_result() -> None:
                results.append(await client.request("tasks/result", {"taskId": task["taskId"]}))

            tg.start_soon(wait_result)
            assert (await client.request("tasks/get", {"taskId": task["taskId"]}))["status"] == "working"
        assert results[0]["content"][0]["text"] == "done: later"
        assert time.monotonic() - started >= 0.4

    async def test_without_task_the_childs_own_error_passes_through(self, start) -> None:
        """A plain call of a task-required tool gets the child's -32601, with its message."""
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            for meta in ({}, {"_meta": {"test": "take the SDK's path"}}):  # the fast path, the SDK's
                with pytest.raises(Failed) as failed:
                    await client.request("tools/call", {"name": "tasks__slow", "arguments": {}, **meta})
                assert failed.value.code == -32601
                assert "Tool slow must be called as a task" in failed.value.message

    async def test_optional_tool_runs_plainly_or_as_a_task(self, start) -> None:
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            plain = await client.request("tools/call", {"name": "tasks__quick", "arguments": {"text": "now"}})
            assert plain["content"] == [{"type": "text", "text": "quick: now"}]
            task = await client.create("tasks__quick", seconds=0, text="later")
            assert ID.fullmatch(task["taskId"])
            result = await client.request("tasks/result", {"taskId": task["taskId"]})
            assert result["content"][0]["text"] == "done: later"

    async def test_a_tool_without_task_support_is_refused_at_once(self, start) -> None:
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            with pytest.raises(Failed) as failed:
                params = {"name": "tasks__plain", "arguments": {}, "task": {}}
                await client.request("tools/call", params, within=1)
            assert failed.value.code == -32601 and "execution.taskSupport is absent" in failed.value.message


class TestHostileChild:
    async def test_a_task_id_no_client_could_name_back_is_refused_not_kept(self, start) -> None:
        daemon = start({"tasks": {**TASKS, "env": {"TASK_ID_PAD": str(MAX_ID_LENGTH)}}})
        async with raw_client(daemon) as (client, _):
            with pytest.raises(Failed) as failed:
                await client.request("tools/call", {"name": "tasks__slow", "arguments": {}, "task": {}})
            assert failed.value.code == -32603
            assert f"task id over {MAX_ID_LENGTH} characters" in failed.value.message
            assert (await client.request("tasks/list", {}))["tasks"] == []


class TestCancel:
    async def test_cancel_then_get_says_cancelled_and_a_second_cancel_is_the_childs_error(
        self, start
    ) -> None:
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            task = await client.create("tasks__slow", seconds=30)
            cancelled = await client.request("tasks/cancel", {"taskId": task["taskId"]})
            assert cancelled["status"] == "cancelled" and cancelled["taskId"] == task["taskId"]
            assert (await client.request("tasks/get", {"taskId": task["taskId"]}))["status"] == "cancelled"
            with pytest.raises(Failed) as failed:
                await client.request("tasks/cancel", {"taskId": task["taskId"]})
            assert failed.value.code == -32602 and "it is cancelled" in failed.value.message
            with pytest.raises(Failed) as failed:
                await client.request("tasks/result", {"taskId": task["taskId"]})
            assert "was cancelled" in failed.value.message


class TestList:
    async def test_two_extensions_with_clashing_ids_are_merged_and_namespaced(self, start) -> None:
        """Both children call their first task task-1; clients see two ids, listed in name order."""
        daemon = start({"beta": TASKS, "alpha": TASKS})
        async with raw_client(daemon) as (client, _):
            beta = await client.create("beta__slow", seconds=30)
            alpha = await client.create("alpha__slow", seconds=30)
            assert ID.fullmatch(alpha["taskId"])["child"] == ID.fullmatch(beta["taskId"])["child"] == "task-1"
            assert alpha["taskId"] != beta["taskId"]
            listed = await client.request("tasks/list")
            assert [t["taskId"] for t in listed["tasks"]] == [alpha["taskId"], beta["taskId"]]
            assert "nextCursor" not in listed
            for task in (alpha, beta):  # each routes back to its own extension
                await client.request("tasks/cancel", {"taskId": task["taskId"]})
                assert (await client.request("tasks/get", {"taskId": task["taskId"]}))[
                    "status"
                ] == "cancelled"

    async def test_pages_are_bounded_and_deterministic(self, start) -> None:
        """Child pages of 1 (alpha, 9 tasks) and of 500 (beta, 101): our pages hold at most
        MAX_LIST_REQUESTS child pages and MAX_PAGE tasks, and the cursors walk every task once."""
        assert (MAX_LIST_REQUESTS, MAX_PAGE) == (8, 100)  # the counts below are worked out for these
        daemon = start(
            {"alpha": extension_settings("tasks.py", "1"), "beta": extension_settings("tasks.py", "500")}
        )
        async with raw_client(daemon) as (client, _):
            created = [(await client.create("alpha__slow", seconds=30))["taskId"] for _ in range(9)]
            created += [(await client.create("beta__slow", seconds=30))["taskId"] for _ in range(101)]

            async def walk() -> list[dict[str, Any]]:
                pages, cursor = [], None
                while True:
                    page = await client.request("tasks/list", {"cursor": cursor} if cursor else {})
                    pages.append(page)
                    if (cursor := page.get("nextCursor")) is None:
                        return pages

            pages = await walk()
            assert [len(page["tasks"]) for page in pages] == [8, 100, 2]
            assert list_all_pages(pages) == created
            assert await walk() == pages
            with pytest.raises(Failed) as failed:
                await client.request("tasks/list", {"cursor": "not-a-cursor"})
            assert failed.value.code == -32602 and "invalid cursor" in failed.value.message


class TestUnknownIds:
    @pytest.mark.parametrize(
        ("task_id", "says"),
        [
            ("nonsense", "look like EXTENSION:RUN:ID"),
            ("tasks:xyz:task-1", "look like EXTENSION:RUN:ID"),
            ("nope:0123456789ab:task-1", "unknown task id 'nope:0123456789ab:task-1'"),
            ("tasks:0123456789ab:task-1", "unknown task id 'tasks:0123456789ab:task-1'"),
        ],
    )
    async def test_a_clear_error_in_milliseconds(self, start, task_id: str, says: str) -> None:
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            await client.request("ping")
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                started = time.monotonic()
                with pytest.raises(Failed) as failed:
                    await client.request(method, {"taskId": task_id}, within=1)
                assert time.monotonic() - started < 0.5
                assert failed.value.code == -32602 and says in failed.value.message, failed.value.message

    async def test_a_deeply_nested_cursor_is_invalid_params(self, start) -> None:
        """json.loads of '[' * 3000 raises RecursionError: still the client's mistake, -32602."""
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            cursor = base64.urlsafe_b64encode(b"[" * 3000).decode()
            assert len(cursor) <= MAX_ID_LENGTH
            with pytest.raises(Failed) as failed:
                await client.request("tasks/list", {"cursor": cursor})
            assert failed.value.code == -32602 and "invalid cursor" in failed.value.message


class TestRestart:
    async def test_a_restart_loses_the_tasks_and_their_ids_say_so(self, start) -> None:
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (client, _):
            task = await client.create("tasks__slow", seconds=30)
            restarted = await anyio.to_thread.run_sync(daemon.cli, "restart", "tasks")
            assert restarted.returncode == 0, restarted.stderr
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                with pytest.raises(Failed) as failed:
                    await client.request(method, {"taskId": task["taskId"]}, within=1)
                assert failed.value.code == -32602
                assert "extension 'tasks' restarted since the task was created" in failed.value.message
                assert failed.value.data["reason"] == "restarted"
            fresh = await client.create("tasks__slow", seconds=0)  # the new run numbers from 1 again
            assert ID.fullmatch(fresh["taskId"])["child"] == "task-1" and fresh["taskId"] != task["taskId"]
            assert [t["taskId"] for t in (await client.request("tasks/list"))["tasks"]] == [fresh["taskId"]]
            stopped = await anyio.to_thread.run_sync(daemon.cli, "stop", "tasks")
            assert stopped.returncode == 0, stopped.stderr
            with pytest.raises(Failed) as failed:
                await client.request("tasks/get", {"taskId": fresh["taskId"]}, within=1)
            assert "extension 'tasks' is stopped" in failed.value.message
            assert (await client.request("tasks/list")) == {"tasks": []}


class TestSdkClients:
    async def test_a_handshake_session_polls_with_send_request(self, start) -> None:
        """What the SDK's ClientSession can do: tasks/get and tasks/list with a custom result type
        (of a task it made: another connection's are not its own)."""
        daemon = start({"tasks": TASKS})
        async with gateway_session(daemon.mcp_sock) as session:
            capabilities = session.server_capabilities
            assert capabilities is not None and capabilities.tasks is not None
            params = {"name": "tasks__slow", "arguments": {"seconds": 0}, "task": {}}
            task = (await session._dispatcher.send_raw_request("tools/call", params, {}))[
                "task"
            ]  # typed: refused
            request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task["taskId"]))
            got = await session.send_request(request, RAW)  # a task of 0 s: done once it is listed below
            listed = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            assert [t.task_id for t in listed.tasks] == [task["taskId"]] == [got["taskId"]]

    async def test_a_2026_client_calls_plainly_and_gets_a_clear_error_for_tasks(self, start) -> None:
        """2026-07-28: no tasks capability; the optional tool runs plainly, the required one gets the
        child's error, and tasks/* say the tasks extension is not supported."""
        daemon = start({"tasks": TASKS})
        async with Client(unix_transport(daemon.mcp_sock), mode="2026-07-28") as client:
            assert client.protocol_version == "2026-07-28"
            assert getattr(client.server_capabilities, "tasks", None) is None
            assert first_text(await client.call_tool("tasks__quick", {"text": "modern"})) == "quick: modern"
            with pytest.raises(MCPError) as failed:
                await client.call_tool("tasks__slow", {})
            assert failed.value.error.code == -32601
            request = types.GetTaskRequest(
                params=types.GetTaskRequestParams(task_id="tasks:0123456789ab:task-1")
            )
            started = time.monotonic()
            with pytest.raises(MCPError) as failed:
                await client.session.send_request(request, RAW)
            assert time.monotonic() - started < 0.5
            assert failed.value.error.code == -32601
            assert "io.modelcontextprotocol/tasks" in failed.value.error.message


class TestHttp:
    async def test_a_task_over_streamable_http(self, http_gateway) -> None:
        """The same routing for a handshake-era client over HTTP (the SDK client's raw requests:
        its typed ones refuse a CreateTaskResult)."""
        http = http_gateway({"tasks": TASKS})
        async with Client(http.mcp(), mode="legacy") as client:
            send = client.session._dispatcher.send_raw_request
            params = {"name": "tasks__slow", "arguments": {"seconds": 0.2, "text": "http"}, "task": {}}
            created = await send("tools/call", params, {})
            assert ID.fullmatch(created["task"]["taskId"])
            result = await send("tasks/result", {"taskId": created["task"]["taskId"]}, {})
            assert result["content"] == [{"type": "text", "text": "done: http"}]
            listed = await send("tasks/list", {}, {})
            assert [t["taskId"] for t in listed["tasks"]] == [created["task"]["taskId"]]


class TestIdleStop:
    IDLE = 2.0  # idle_stop: polls every 0.1 s come well within it, even on a loaded machine

    async def test_a_working_task_holds_off_idle_stop_until_it_ends(self, start) -> None:
        """idle_stop never ends a task: the child is asked (tasks/list) before it is stopped as idle.
        The client does not poll here, so no call renews the idle period meanwhile."""
        daemon = start({"tasks": {**TASKS, "idle_stop": 0.3}})
        async with raw_client(daemon) as (client, _):
            created = time.monotonic()
            await client.create("tasks__slow", seconds=2.0)
            with fail_after(20):
                while (await anyio.to_thread.run_sync(daemon.status))["tasks"]["state"] == "running":  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert time.monotonic() - created >= 2.0  # not before the task ended
        assert "extension.idle_stop" in [e.get("event") for e in daemon.events()]

    async def test_polling_tasks_list_does_not_keep_it_alive(self, start) -> None:
        """A client polling tasks/list every 0.1 s (its ended task listed) lets idle_stop (2 s) act.

        The polls are shown to have come more often than idle_stop all along, however slow a
        loaded machine made them: otherwise the stop would prove nothing."""
        daemon = start({"tasks": {**TASKS, "idle_stop": self.IDLE}})
        async with raw_client(daemon) as (client, _), anyio.create_task_group() as tg:
            task = await client.create("tasks__slow", seconds=0)
            await client.wait_status(task["taskId"], "completed")
            listed: list[dict[str, Any]] = []
            answered = [time.monotonic()]

            async def poll() -> None:
                while True:
                    listed.append(await client.request("tasks/list"))
                    answered.append(time.monotonic())
                    await anyio.sleep(0.1)

            tg.start_soon(poll)
            with fail_after(self.IDLE + 10):
                while (await anyio.to_thread.run_sync(daemon.status))["tasks"]["state"] == "running":  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            answered.append(time.monotonic())  # seen stopped
            tg.cancel_scope.cancel()
        assert {"taskId": task["taskId"]}.items() <= listed[0]["tasks"][0].items()
        assert max(later - earlier for earlier, later in itertools.pairwise(answered)) < self.IDLE
        assert "extension.idle_stop" in [e.get("event") for e in daemon.events()]


class TestOwnership:
    async def test_another_clients_task_is_unknown_and_unlisted(self, start) -> None:
        """Bound to its creator: to another client a task is as unknown as a made-up id."""
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon) as (alice, _), raw_client(daemon) as (bob, _):
            mine = await alice.create("tasks__slow", seconds=30, text="alice-secret")
            made_up = mine["taskId"].replace("task-1", "task-99")
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                for task in (mine["taskId"], made_up):
                    with pytest.raises(Failed) as failed:
                        await bob.request(method, {"taskId": task}, within=1)
                    assert failed.value.code == -32602
                    assert failed.value.message == f"unknown task id {task!r}"  # nothing tells them apart
            assert await bob.request("tasks/list") == {"tasks": []}
            his = await bob.create("tasks__slow", seconds=30)
            assert [t["taskId"] for t in (await bob.request("tasks/list"))["tasks"]] == [his["taskId"]]
            assert [t["taskId"] for t in (await alice.request("tasks/list"))["tasks"]] == [mine["taskId"]]
            assert (await alice.request("tasks/get", {"taskId": mine["taskId"]}))["status"] == "working"

    async def test_tasks_requests_make_no_per_client_instance(self, start) -> None:
        """tasks/list and tasks/get of a client with no instance take none of max_instances."""
        daemon = start({"tasks": {**TASKS, "instances": "per-client", "max_instances": 1}})
        async with raw_client(daemon) as (alice, _), raw_client(daemon) as (bob, _):
            assert await alice.request("tasks/list") == {"tasks": []}
            with pytest.raises(Failed) as failed:
                await alice.request("tasks/get", {"taskId": "tasks:0123456789ab:task-1"})
            assert failed.value.code == -32602
            result = await bob.request("tools/call", {"name": "tasks__quick", "arguments": {"text": "b"}})
            assert result["content"] == [{"type": "text", "text": "quick: b"}], result
            task = await bob.create("tasks__slow", seconds=0)
            assert (await bob.request("tasks/result", {"taskId": task["taskId"]}))["content"]

    def test_the_table_is_bounded_and_forgets_a_closed_client(self) -> None:
        """Oldest first over a client's bound and over the total; all of a client's when it closes."""

        class Client:
            def __init__(self) -> None:
                self.closes: list[Callable[[], None]] = []

            def on_close(self, callback: Callable[[], None]) -> None:
                self.closes.append(callback)

        owners, a, b = Owners(per_client=3, total=5), Client(), Client()
        for n in range(4):
            owners.add(a, f"a{n}")
        assert owners.of(a) == ["a1", "a2", "a3"] and not owners.owns(a, "a0")
        for n in range(3):
            owners.add(b, f"b{n}")
        assert len(owners) == 5 and owners.of(a) == ["a2", "a3"]  # the total's oldest went: a1
        assert owners.owns(b, "b0") and not owners.owns(b, "a2") and not owners.owns(a, "b0")
        assert len(a.closes) == len(b.closes) == 1  # hooked once each
        a.closes[0]()
        assert len(owners) == 3 and owners.of(a) == [] and owners.of(b) == ["b0", "b1", "b2"]


class TestQuestionsDuringResult:
    async def test_the_related_task_id_is_the_one_the_client_knows(self, start) -> None:
        """A child asking its client during tasks/result names the task: by our id, not its own."""
        daemon = start({"tasks": TASKS})
        async with raw_client(daemon, {"elicitation": {"form": {}}}) as (client, _):
            task = await client.create("tasks__ask")
            result = await client.request("tasks/result", {"taskId": task["taskId"]})
            assert result["content"] == [{"type": "text", "text": "answered: accept"}]
            [asked] = client.asked
            assert asked["method"] == "elicitation/create"
            assert asked["params"]["_meta"]["io.modelcontextprotocol/related-task"] == {
                "taskId": task["taskId"]
            }


class TestBlockingResult:
    async def test_result_outlasts_call_timeout(self, start) -> None:
        """tasks/result waits for the task (2.5 s) past call_timeout (1 s): nothing renews it."""
        daemon = start({"tasks": {**TASKS, "call_timeout": 1}})
        async with raw_client(daemon) as (client, _):
            task = await client.create("tasks__slow", seconds=2.5, text="long")
            started = time.monotonic()
            result = await client.request("tasks/result", {"taskId": task["taskId"]})
            assert result["content"] == [{"type": "text", "text": "done: long"}]
            assert time.monotonic() - started >= 2.0

    async def test_call_timeout_max_still_ends_it(self, start) -> None:
        daemon = start({"tasks": {**TASKS, "call_timeout": 0.5, "call_timeout_max": 1.5}})
        async with raw_client(daemon) as (client, _):
            task = await client.create("tasks__slow", seconds=30)
            started = time.monotonic()
            with pytest.raises(Failed) as failed:
                await client.request("tasks/result", {"taskId": task["taskId"]})
            assert 1.4 <= time.monotonic() - started < 5
            assert "call_timeout_max" in failed.value.message, failed.value.message
