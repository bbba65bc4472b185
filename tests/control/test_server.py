"""The control socket: a real server on a real unix socket, driven by an in-memory backend."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from structlog.testing import capture_logs

from supervisor import sockets
from supervisor.control import client, codes
from supervisor.control import server as control
from supervisor.errors import SupervisorError
from tests.harness import FakeBackend, eventually
from tests.harness.timing import fail_after

WAIT = 5  # seconds any single step may take


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Captured log events."""
    with capture_logs() as events:
        yield events


@asynccontextmanager
async def serving(backend: FakeBackend, directory: Path, **options: Any) -> AsyncIterator[str]:
    """Run the control server on ``directory/run/control.sock`` for the block's duration."""
    path = str(directory / "run" / "control.sock")
    async with anyio.create_task_group() as tg:
        with fail_after(WAIT):
            await tg.start(partial(control.serve, backend, path, **options))
        yield path
        tg.cancel_scope.cancel()


class Wire:
    """A raw JSON-lines connection, to send what a real client never would."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)

    async def send(self, message: Any) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        with fail_after(WAIT):
            await self.stream.send(data)

    async def receive(self) -> dict[str, Any]:
        with fail_after(WAIT):
            return json.loads(await self.reader.receive_until(b"\n", 1 << 26))

    async def request(self, method: str, params: Any = None, request_id: Any = 1) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.receive()

    async def wait_closed(self) -> None:
        """Return once the server has closed the connection (EOF or reset, after any data)."""
        with fail_after(WAIT):
            try:
                while await self.stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return


@asynccontextmanager
async def wire(path: str) -> AsyncIterator[Wire]:
    async with await sockets.connect(path) as stream:
        yield Wire(stream)


def error_of(reply: dict[str, Any]) -> tuple[int, str]:
    return reply["error"]["code"], reply["error"]["message"]


@pytest.mark.anyio
class TestMethods:
    async def test_status_lists_every_extension(self, short_tmp: Path) -> None:
        """status without params returns every snapshot's record, in order."""
        backend = FakeBackend()
        async with serving(backend, short_tmp) as path, wire(path) as w:
            reply = await w.request("status")
        assert reply == {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {
                "extensions": [
                    {**s.as_dict(), "name_collisions": [], "tools_changed": []}
                    for s in backend.snapshots.values()
                ],
                "profiles": [],  # the gateway's views (none from this backend)
            },
        }

    async def test_status_of_one(self, short_tmp: Path) -> None:
        """status with a name returns that extension only."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("status", {"name": "beta"}, request_id="s-1")
        assert reply["id"] == "s-1"
        assert [record["name"] for record in reply["result"]["extensions"]] == ["beta"]
        assert reply["result"]["extensions"][0]["last_exit"]["code"] == 3

    @pytest.mark.parametrize(
        ("verb", "state"), [("start", "running"), ("stop", "stopped"), ("restart", "running")]
    )
    async def test_actions_return_the_record_and_pass_wait(
        self, short_tmp: Path, verb: str, state: str
    ) -> None:
        """start, stop and restart return the resulting record; wait defaults to true."""
        backend = FakeBackend()
        async with serving(backend, short_tmp) as path, wire(path) as w:
            first = await w.request(verb, {"name": "beta"})
            await w.request(verb, {"name": "beta", "wait": False}, request_id=2)
        assert first["result"]["name"] == "beta"
        assert first["result"]["state"] == state
        assert backend.actions == [(verb, "beta", True), (verb, "beta", False)]

    async def test_tools(self, short_tmp: Path) -> None:
        """tools lists each tool's whole definition, its extension and the name gateway clients see."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("tools")
        assert reply["result"] == {
            "tools": [
                {
                    "extension": "alpha",
                    "exposed": "alpha__echo",
                    "collision": None,
                    "changed": None,
                    "name": "echo",
                    "title": "Echo",
                    "description": "Echo text.",
                    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                    "outputSchema": {"type": "object"},
                    "annotations": {"readOnlyHint": True},
                }
            ],
            "profiles": [],
        }

    async def test_call_returns_the_wire_result(self, short_tmp: Path) -> None:
        """call returns content, structuredContent and isError in camelCase, without resultType."""
        backend = FakeBackend()
        async with serving(backend, short_tmp) as path, wire(path) as w:
            reply = await w.request("call", {"name": "alpha", "tool": "echo", "arguments": {"text": "hi"}})
            bare = await w.request("call", {"name": "alpha", "tool": "echo"}, request_id=2)
        assert reply["result"] == {
            "content": [{"type": "text", "text": '{"text": "hi"}'}],
            "structuredContent": {"echo": {"text": "hi"}},
            "isError": False,
        }
        assert bare["result"]["structuredContent"] == {"echo": {}}
        assert backend.calls == [("alpha", "echo", {"text": "hi"}), ("alpha", "echo", {})]

    async def test_logs_default_and_given_lines(self, short_tmp: Path) -> None:
        """logs returns 50 lines by default, or as many as asked."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            default = await w.request("logs", {"name": "alpha"})
            three = await w.request("logs", {"name": "alpha", "lines": 3}, request_id=2)
        assert default["result"] == {"lines": ["x"] * 50}
        assert three["result"] == {"lines": ["x"] * 3}

    async def test_reload_reports_what_changed(self, short_tmp: Path) -> None:
        """reload returns the daemon's report of what it added, removed and restarted."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("reload")
        assert reply["result"]["added"] == ["gamma"] and reply["result"]["unchanged"] == ["alpha"]

    async def test_reload_of_a_broken_config_lists_every_error(self, short_tmp: Path) -> None:
        """A config error is -32005 with every problem in data.errors."""
        backend = FakeBackend()
        backend.reload_errors = ["extensions.a.restart (line 3): bad", "extensions.b (line 9): bad"]
        async with serving(backend, short_tmp) as path, wire(path) as w:
            reply = await w.request("reload")
        assert error_of(reply) == (codes.CONFIG_INVALID, "the config is not valid; nothing was changed")
        assert reply["error"]["data"] == {"errors": backend.reload_errors}

    async def test_health_as_json_and_as_prometheus_text(self, short_tmp: Path) -> None:
        """health returns the report, or with format=prometheus the metrics text."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            report = await w.request("health")
            text = await w.request("health", {"format": "prometheus"}, request_id=2)
            bad = await w.request("health", {"format": "xml"}, request_id=3)
        assert report["result"]["process"] == {"pid": 1}
        assert "mcp_supervisor_spool_bytes 0.0" in text["result"]["text"]
        assert bad["error"]["code"] == codes.INVALID_PARAMS

    @pytest.mark.parametrize("method", ["shutdown", "gateway", ""])
    async def test_methods_outside_the_table_are_not_found(self, short_tmp: Path, method: str) -> None:
        """A method not in METHODS is -32601."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request(method)
        assert error_of(reply) == (codes.METHOD_NOT_FOUND, f"unknown method {method!r}")


@pytest.mark.anyio
class TestApplicationErrors:
    async def test_unknown_extension(self, short_tmp: Path) -> None:
        """An unknown extension name is -32004 with the error's sentence."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("start", {"name": "nope"})
        assert error_of(reply) == (codes.UNKNOWN_EXTENSION, "no extension named 'nope' is configured")

    async def test_extension_unavailable_carries_state_and_retryable(self, short_tmp: Path) -> None:
        """ExtensionUnavailable is -32003 with data naming the state and whether to retry."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("call", {"name": "alpha", "tool": "unavailable"})
        assert reply["error"]["code"] == codes.EXTENSION_UNAVAILABLE
        assert reply["error"]["data"] == {"state": "backoff", "retryable": True}
        assert "try again shortly" in reply["error"]["message"]

    async def test_call_failed_carries_the_code(self, short_tmp: Path) -> None:
        """CallFailed is -32002 with the MCP error code as data."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("call", {"name": "alpha", "tool": "broken"})
        assert reply["error"] == {
            "code": codes.CALL_FAILED,
            "message": "the extension closed the connection",
            "data": {"code": -32000},
        }

    async def test_other_supervisor_errors(self, short_tmp: Path) -> None:
        """Any other SupervisorError is -32000 with its message."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("call", {"name": "alpha", "tool": "plain"})
        assert error_of(reply) == (codes.SUPERVISOR_ERROR, "something the daemon refuses")

    async def test_a_crashing_handler_is_an_internal_error_and_the_server_goes_on(
        self, short_tmp: Path, logs: list[dict[str, Any]]
    ) -> None:
        """A handler raising RuntimeError is -32603 with one line, is logged, and both connections go on."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w, wire(path) as other:
            reply = await w.request("call", {"name": "alpha", "tool": "explode"})
            after = await w.request("status", request_id=2)
            elsewhere = await other.request("status")
        assert error_of(reply) == (codes.INTERNAL_ERROR, "internal error: RuntimeError: boom")
        assert "result" in after
        assert "result" in elsewhere
        crashes = [e for e in logs if e["event"] == "control.handler_crashed"]
        assert [(e["method"], e["log_level"]) for e in crashes] == [("call", "error")]


@pytest.mark.anyio
class TestProtocolErrors:
    async def test_malformed_json_then_a_valid_request(self, short_tmp: Path) -> None:
        """Malformed JSON is -32700 with id null, and the same connection keeps working."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            await w.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
            broken = await w.receive()
            await w.send_raw(b"\xff\xfe\n")
            not_utf8 = await w.receive()
            await w.send_raw(b"[" * 100_000 + b"\n")
            deep = await w.receive()
            valid = await w.request("status", request_id=7)
        assert broken["id"] is None
        assert broken["error"]["code"] == codes.PARSE_ERROR
        assert error_of(not_utf8) == (codes.PARSE_ERROR, "parse error: the request is not valid UTF-8")
        assert deep["error"]["code"] == codes.PARSE_ERROR
        assert valid["id"] == 7
        assert "result" in valid

    @pytest.mark.parametrize(
        ("message", "reply_id", "text"),
        [
            (42, None, "a request must be a JSON object"),
            ({"jsonrpc": "1.0", "id": 3, "method": "status"}, 3, 'jsonrpc must be "2.0"'),
            ({"id": 3, "method": "status"}, 3, 'jsonrpc must be "2.0"'),
            (
                {"jsonrpc": "2.0", "id": [1], "method": "status"},
                None,
                "the id must be a string, an integer or null",
            ),
            (
                {"jsonrpc": "2.0", "id": 1.5, "method": "status"},
                None,
                "the id must be a string, an integer or null",
            ),
            (
                {"jsonrpc": "2.0", "id": True, "method": "status"},
                None,
                "the id must be a string, an integer or null",
            ),
            ({"jsonrpc": "2.0", "id": 3, "method": 5}, 3, "method must be a string"),
            ({"jsonrpc": "2.0", "method": 5}, None, "method must be a string"),
        ],
    )
    async def test_invalid_requests(self, short_tmp: Path, message: Any, reply_id: Any, text: str) -> None:
        """A request that is not a valid JSON-RPC 2.0 object is -32600; the id is echoed when readable."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            await w.send(message)
            reply = await w.receive()
        assert reply["id"] == reply_id
        assert error_of(reply) == (codes.INVALID_REQUEST, text)

    async def test_batches_are_refused(self, short_tmp: Path) -> None:
        """A JSON array is -32600 'batch requests are not supported'."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            await w.send([{"jsonrpc": "2.0", "id": 1, "method": "status"}])
            reply = await w.receive()
        assert error_of(reply) == (codes.INVALID_REQUEST, "batch requests are not supported")

    @pytest.mark.parametrize(
        ("method", "params", "problem"),
        [
            ("start", {}, "name: required parameter is missing"),
            ("status", {"nmae": "alpha"}, "nmae: unexpected parameter"),
            ("stop", {"name": "alpha", "wait": "yes"}, "wait: input should be a valid boolean"),
            ("logs", {"name": "alpha", "lines": 0}, "lines: input should be greater than or equal to 1"),
            (
                "logs",
                {"name": "alpha", "lines": 10_001},
                "lines: input should be less than or equal to 10000",
            ),
            ("logs", {"name": "alpha", "lines": "5"}, "lines: input should be a valid integer"),
            (
                "call",
                {"name": "alpha", "tool": "echo", "arguments": [1]},
                "arguments: input should be a valid dictionary",
            ),
        ],
    )
    async def test_invalid_params(self, short_tmp: Path, method: str, params: Any, problem: str) -> None:
        """Params failing their pydantic model are -32602 with a readable message."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request(method, params)
        assert error_of(reply) == (codes.INVALID_PARAMS, f"invalid params for {method!r}: {problem}")

    async def test_params_must_be_an_object(self, short_tmp: Path) -> None:
        """Positional (array) params are -32602."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            reply = await w.request("status", [1])
        assert error_of(reply) == (codes.INVALID_PARAMS, "params must be a JSON object")

    async def test_notifications_run_without_a_reply(self, short_tmp: Path) -> None:
        """A request without id is executed but answered by nothing, not even an error."""
        backend = FakeBackend()
        async with serving(backend, short_tmp) as path, wire(path) as w:
            await w.send({"jsonrpc": "2.0", "method": "stop", "params": {"name": "alpha"}})
            await w.send({"jsonrpc": "2.0", "method": "no-such-method"})
            await w.send({"jsonrpc": "2.0", "method": "call", "params": {"name": "alpha", "tool": "explode"}})
            await w.send_raw(b"\n   \n")  # blank lines are skipped
            reply = await w.request("status", {"name": "alpha"}, request_id=9)
        assert reply["id"] == 9
        assert backend.actions == [("stop", "alpha", True)]
        assert reply["result"]["extensions"][0]["state"] == "stopped"


@pytest.mark.anyio
class TestIsolation:
    async def test_an_oversized_frame_closes_only_that_connection(self, short_tmp: Path) -> None:
        """A 2 MiB line gets -32600 and a closed connection while another client is still answered."""
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as big, wire(path) as other:

            async def flood() -> None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await big.stream.send(b"x" * (2 << 20) + b"\n")  # the server hangs up mid-send

            async with anyio.create_task_group() as tg:
                tg.start_soon(flood)
                reply = await big.receive()
                await big.wait_closed()
                served = await other.request("status")
        assert error_of(reply) == (codes.INVALID_REQUEST, "request too large (over 1 MiB)")
        assert reply["id"] is None
        assert "result" in served

    async def test_a_client_that_never_reads_blocks_nobody(self, short_tmp: Path) -> None:
        """While one client leaves a 10 MB reply unread, others are served; it can read it all later."""
        backend = FakeBackend()
        backend.log_line = "y" * 1000
        async with serving(backend, short_tmp) as path, wire(path) as lazy:
            await lazy.send(
                {"jsonrpc": "2.0", "id": 1, "method": "logs", "params": {"name": "alpha", "lines": 10_000}}
            )
            for n in range(5):
                async with wire(path) as busy:
                    assert "result" in await busy.request("status", request_id=n)
            late = await lazy.receive()
        assert len(late["result"]["lines"]) == 10_000

    async def test_a_slow_request_does_not_delay_other_connections(self, short_tmp: Path) -> None:
        """A start waiting on its extension holds only its own connection."""
        backend = FakeBackend()
        backend.gate = anyio.Event()
        async with serving(backend, short_tmp) as path, wire(path) as slow, wire(path) as quick:
            await slow.send({"jsonrpc": "2.0", "id": 1, "method": "start", "params": {"name": "beta"}})
            assert "result" in await quick.request("status")
            backend.gate.set()
            reply = await slow.receive()
        assert reply["result"]["state"] == "running"

    async def test_many_clients_at_once(self, short_tmp: Path) -> None:
        """Thirty clients, each sending three requests, all get their own answers."""
        async with serving(FakeBackend(), short_tmp) as path:

            async def chat(n: int) -> None:
                async with wire(path) as w:
                    for i in range(3):
                        reply = await w.request(
                            "logs", {"name": "alpha", "lines": n + 1}, request_id=f"{n}-{i}"
                        )
                        assert reply["id"] == f"{n}-{i}"
                        assert len(reply["result"]["lines"]) == n + 1

            with fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    for n in range(30):
                        tg.start_soon(chat, n)

    async def test_idle_connections_are_closed(self, short_tmp: Path) -> None:
        """A connection that sends nothing for idle_timeout seconds is closed."""
        async with serving(FakeBackend(), short_tmp, idle_timeout=0.2) as path, wire(path) as w:
            assert "result" in await w.request("status")
            await w.wait_closed()

    async def test_a_client_not_reading_is_dropped_after_the_reply_timeout(
        self, short_tmp: Path, logs: list[dict[str, Any]]
    ) -> None:
        """A reply left unread for reply_timeout seconds ends that connection."""
        backend = FakeBackend()
        backend.log_line = "y" * 1000
        async with serving(backend, short_tmp, reply_timeout=0.3) as path, wire(path) as lazy:
            await lazy.send(
                {"jsonrpc": "2.0", "id": 1, "method": "logs", "params": {"name": "alpha", "lines": 10_000}}
            )
            await _until_logged(logs, "control.client_not_reading")
            await lazy.wait_closed()

    async def test_at_the_limit_the_idlest_connection_makes_room(self, short_tmp: Path) -> None:
        """Over max_connections a new client is served; the idlest one is told why and closed."""
        async with (
            serving(FakeBackend(), short_tmp, max_connections=3) as path,
            wire(path) as oldest,
            wire(path) as older,
            wire(path) as recent,
        ):
            for w in (oldest, older, recent):  # activity in this order: oldest is the idlest
                assert "result" in await w.request("status")
            async with wire(path) as newcomer:
                assert "result" in await newcomer.request("status")
                notice = await oldest.receive()
                await oldest.wait_closed()
                for w in (older, recent, newcomer):
                    assert "result" in await w.request("status", request_id=2)
        assert notice["id"] is None
        assert error_of(notice) == (
            codes.SUPERVISOR_ERROR,
            "connection closed to make room for a new client (it was the idlest)",
        )

    async def test_a_connection_running_a_request_is_never_evicted(self, short_tmp: Path) -> None:
        """When every connection is running a request, the newcomer is refused, not them."""
        backend = FakeBackend()
        backend.gate = anyio.Event()
        async with serving(backend, short_tmp, max_connections=1) as path, wire(path) as slow:
            await slow.send({"jsonrpc": "2.0", "id": 1, "method": "start", "params": {"name": "beta"}})
            await eventually(lambda: backend.actions != [])
            async with wire(path) as newcomer:
                refusal = await newcomer.receive()
                await newcomer.wait_closed()
            backend.gate.set()
            reply = await slow.receive()
        assert error_of(refusal) == (
            codes.SUPERVISOR_ERROR,
            "too many connections, each with a request in progress",
        )
        assert reply["result"]["state"] == "running"

    async def test_the_idle_timeout_is_short_while_at_the_limit(self, short_tmp: Path) -> None:
        """At max_connections idle connections get crowded_idle_timeout; below it, idle_timeout again."""
        options = {"max_connections": 3, "crowded_idle_timeout": 0.3}
        async with serving(FakeBackend(), short_tmp, **options) as path:
            async with wire(path) as first, wire(path) as second, wire(path) as third:
                # At the limit an idle connection waits 0.3 s at most. Once one is closed the
                # others are below the limit again, back to idle_timeout: they may stay.
                closed = anyio.Event()

                async def close_of(connection: Wire) -> None:
                    await connection.wait_closed()
                    closed.set()

                async with anyio.create_task_group() as waiting:
                    for connection in (first, second, third):
                        waiting.start_soon(close_of, connection)
                    with fail_after(5):  # not idle_timeout (300 s)
                        await closed.wait()
                    waiting.cancel_scope.cancel()
            async with wire(path) as lone, wire(path) as other:
                async with wire(path) as crowding:
                    assert "result" in await crowding.request("status")
                # below the limit again: the others' deadline is back to idle_timeout (300 s)
                await anyio.sleep(0.6)  # an absence cannot be waited for; twice the short timeout
                assert "result" in await lone.request("status")
                assert "result" in await other.request("status")


async def _until_logged(logs: list[dict[str, Any]], event: str) -> None:
    with fail_after(WAIT):
        while not any(e["event"] == event for e in logs):  # noqa: ASYNC110 - polling with a deadline
            await anyio.sleep(0.01)


async def _status_or_refusal(path: str) -> dict[str, Any]:
    async with wire(path) as w:
        try:
            return await w.request("status")
        except anyio.BrokenResourceError:
            return {}


@pytest.mark.anyio
class TestSocketFile:
    async def test_modes(self, short_tmp: Path) -> None:
        """The missing directory is created 0700 and the socket is 0600."""
        async with serving(FakeBackend(), short_tmp) as path:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert os.listdir(os.path.dirname(path)) == []

    @pytest.mark.parametrize("mode", [0o777, 0o755, 0o750, 0o711, 0o701], ids=lambda mode: f"{mode:04o}")
    async def test_an_open_directory_is_refused(self, short_tmp: Path, mode: int) -> None:
        """An existing directory open to group or others is refused, left as it was, and nothing is bound."""
        (short_tmp / "run").mkdir()
        os.chmod(short_tmp / "run", mode)
        path = str(short_tmp / "run" / "control.sock")
        with fail_after(WAIT), pytest.raises(SupervisorError) as caught:
            await control.serve(FakeBackend(), path)
        assert str(caught.value) == (
            f"refusing socket directory {short_tmp / 'run'}: its mode is {mode:04o}, open to other users"
            f" (run 'chmod 700 {short_tmp / 'run'}')"
        )
        assert stat.S_IMODE(os.stat(short_tmp / "run").st_mode) == mode
        assert os.listdir(short_tmp / "run") == []

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
    async def test_a_directory_of_another_user_is_refused(self, short_tmp: Path) -> None:
        """A 0700 directory pre-created by another user (the /tmp hijack) is refused."""
        (short_tmp / "run").mkdir(mode=0o700)
        os.chown(short_tmp / "run", 65534, 65534)
        path = str(short_tmp / "run" / "control.sock")
        with fail_after(WAIT), pytest.raises(SupervisorError) as caught:
            await control.serve(FakeBackend(), path)
        assert str(caught.value) == (
            f"refusing socket directory {short_tmp / 'run'}: it belongs to uid 65534, not {os.geteuid()};"
            " another user may have created it (remove it or choose another --socket)"
        )
        assert os.listdir(short_tmp / "run") == []

    async def test_a_symlink_for_a_directory_is_refused(self, short_tmp: Path) -> None:
        """The socket directory must be a directory itself, not a link someone could re-point."""
        (short_tmp / "real").mkdir(mode=0o700)
        (short_tmp / "run").symlink_to(short_tmp / "real")
        with fail_after(WAIT), pytest.raises(SupervisorError, match="it is not a directory"):
            await control.serve(FakeBackend(), str(short_tmp / "run" / "control.sock"))

    async def test_a_stale_socket_is_replaced(self, short_tmp: Path) -> None:
        """A socket file nobody listens on is removed and bound again."""
        (short_tmp / "run").mkdir(mode=0o700)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(short_tmp / "run" / "control.sock"))
        stale.close()
        async with serving(FakeBackend(), short_tmp) as path, wire(path) as w:
            assert "result" in await w.request("status")

    async def test_a_live_socket_is_refused(self, short_tmp: Path) -> None:
        """A second server on a socket someone answers on fails, and leaves the first one alone."""
        async with serving(FakeBackend(), short_tmp) as path:
            with fail_after(WAIT), pytest.raises(SupervisorError) as caught:
                await control.serve(FakeBackend(), path)
            assert str(caught.value) == f"another daemon is listening on {path}"
            async with wire(path) as w:
                assert "result" in await w.request("status")

    async def test_a_file_that_is_not_a_socket_is_left_alone(self, short_tmp: Path) -> None:
        """A regular file at the socket path is an error, not something to delete."""
        path = short_tmp / "control.sock"
        path.write_text("precious")
        with fail_after(WAIT), pytest.raises(SupervisorError, match="exists and is not a socket"):
            await control.serve(FakeBackend(), str(path))
        assert path.read_text() == "precious"

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
    async def test_other_users_are_refused(self, short_tmp: Path) -> None:
        """A peer whose uid is neither ours nor root gets one error and a closed connection."""
        async with serving(FakeBackend(), short_tmp) as path:
            for where, mode in ((short_tmp, 0o755), (short_tmp / "run", 0o755), (Path(path), 0o666)):
                os.chmod(where, mode)
            sock = socket.socket(socket.AF_UNIX)
            os.seteuid(65534)  # SO_PEERCRED records the effective uid at connect()
            try:
                sock.connect(path)
            finally:
                os.seteuid(0)
            sock.settimeout(WAIT)
            with sock, sock.makefile("rb") as replies:
                reply = json.loads(await anyio.to_thread.run_sync(replies.readline))
                rest = await anyio.to_thread.run_sync(replies.read)
        assert error_of(reply) == (
            codes.SUPERVISOR_ERROR,
            "permission denied: uid 65534 may not use this socket",
        )
        assert rest == b""


@pytest.mark.anyio
class TestClient:
    async def test_request_returns_the_result(self, short_tmp: Path) -> None:
        """client.request returns the result member."""
        async with serving(FakeBackend(), short_tmp) as path:
            with fail_after(WAIT):
                result = await client.request(path, "logs", {"name": "alpha", "lines": 2})
        assert result == {"lines": ["x", "x"]}

    async def test_errors_become_remote_errors(self, short_tmp: Path) -> None:
        """An error reply raises RemoteError with code, message and data."""
        async with serving(FakeBackend(), short_tmp) as path:
            with fail_after(WAIT), pytest.raises(client.RemoteError) as caught:
                await client.request(path, "call", {"name": "alpha", "tool": "unavailable"})
        assert caught.value.code == codes.EXTENSION_UNAVAILABLE
        assert caught.value.data == {"state": "backoff", "retryable": True}
        assert str(caught.value) == "extension 'alpha' is backoff (restart in 1s); try again shortly"

    async def test_one_client_many_requests(self, short_tmp: Path) -> None:
        """A Client sends several requests over one connection."""
        async with serving(FakeBackend(), short_tmp) as path:
            with fail_after(WAIT):
                async with client.Client(path) as c:
                    states = [
                        (await c.request("status", {"name": n}))["extensions"][0]["state"]
                        for n in ("alpha", "beta")
                    ]
        assert states == ["running", "stopped"]

    async def test_a_missing_socket_is_unreachable(self, short_tmp: Path) -> None:
        """A socket path with nothing there raises DaemonUnreachable naming it."""
        path = str(short_tmp / "nothing.sock")
        with fail_after(WAIT), pytest.raises(client.DaemonUnreachable) as caught:
            await client.request(path, "status")
        assert str(caught.value) == f"no daemon is listening on {path}"

    async def test_a_stale_socket_is_unreachable(self, short_tmp: Path) -> None:
        """A socket file nobody listens on, or a plain file, raises DaemonUnreachable."""
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(short_tmp / "stale.sock"))
        stale.close()
        (short_tmp / "plain").write_text("")
        for name in ("stale.sock", "plain"):
            with (
                fail_after(WAIT),
                pytest.raises(client.DaemonUnreachable, match="no daemon is listening"),
            ):
                await client.request(str(short_tmp / name), "status")

    async def test_a_hang_up_without_reply(self, short_tmp: Path) -> None:
        """A daemon closing the connection without replying is a clear SupervisorError."""
        path = str(short_tmp / "rude.sock")
        async with await anyio.create_unix_listener(path) as listener, anyio.create_task_group() as tg:

            async def hang_up() -> None:
                stream = await listener.accept()
                await stream.aclose()

            tg.start_soon(hang_up)
            with fail_after(WAIT), pytest.raises(SupervisorError) as caught:
                await client.request(path, "status")
        assert str(caught.value) == "the daemon closed the connection without replying to 'status'"

    async def test_a_timeout(self, short_tmp: Path) -> None:
        """No reply within the timeout is a SupervisorError naming the method and the limit."""
        path = str(short_tmp / "mute.sock")
        async with await anyio.create_unix_listener(path) as listener, anyio.create_task_group() as tg:
            accepted: list[anyio.abc.SocketStream] = []

            async def accept() -> None:
                accepted.append(await listener.accept())

            tg.start_soon(accept)
            with fail_after(WAIT), pytest.raises(SupervisorError) as caught:
                await client.request(path, "status", timeout=0.2)
            for stream in accepted:
                await stream.aclose()
        assert str(caught.value) == "the daemon did not answer 'status' within 0.2 s"
