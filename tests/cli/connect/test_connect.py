"""``mcp-supervisor connect``: real MCP clients through a real connect process to a real socket server.

``tests/servers/socket_server.py`` stands in for the daemon's gateway socket; killing it and
starting it again on the same path is a daemon restart as connect sees it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
import psutil
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client, ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.subscriptions import ToolsListChanged

from supervisor import cli
from supervisor.cli.connect.pump import MAX_CLIENT_LINE, MAX_HELD_LINES
from supervisor.process.children import MARKER_ENV
from tests.harness import INITIALIZE, SERVERS, zygote
from tests.harness.timing import fail_after

pytestmark = pytest.mark.anyio
WAIT = 60  # seconds any single step may take: a fixture's start on a loaded machine (30 s was missed)

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(request_id: int, tool: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


class Fixture:
    """The socket server, started (and started again) on one path.

    It is forked from the worker's zygote (``zygote.popen``), which has imported the SDK
    already: 19 starts of 1.4 s of CPU each as processes of their own. Its stdout and stderr are
    read as non-blocking pipes; the fixture kills it and waits for it, so no marker is needed to
    see it outlive a test."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.process: zygote.Forked | subprocess.Popen[bytes] | None = None
        self.calls: list[str] = []  # tools called, in order, across restarts
        self._changed = anyio.Event()

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        argv = [sys.executable, str(SERVERS / "socket_server.py"), str(self.path)]
        self.process = process = zygote.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout is not None and process.stderr is not None
        with fail_after(WAIT):
            ready = await _read(process.stdout)
        assert ready.startswith(b"listening"), ready
        tg.start_soon(self._read_stderr, process.stderr)

    async def _read_stderr(self, stderr: IO[bytes]) -> None:
        with stderr:  # closed here, where it is waited on: at its end, or when cancelled
            while chunk := await _read(stderr):
                self.calls += [text.removeprefix("call ") for text in chunk.decode().split("\n") if text]
                self._changed.set()
                self._changed = anyio.Event()

    async def wait_called(self, tool: str, times: int = 1) -> None:
        with fail_after(WAIT):
            while self.calls.count(tool) < times:
                await self._changed.wait()

    async def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            with fail_after(WAIT):
                await anyio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
        if process is not None and process.stdout is not None:
            process.stdout.close()


async def _read(pipe: IO[bytes]) -> bytes:
    """What the pipe holds once it holds something; b"" at its end."""
    os.set_blocking(pipe.fileno(), False)
    while True:
        await anyio.wait_readable(pipe.fileno())
        with contextlib.suppress(BlockingIOError):
            return os.read(pipe.fileno(), 1 << 16)


Running = tuple[Fixture, anyio.abc.TaskGroup]  # the server, and the task group reading its stderr


@pytest.fixture
async def fixture(short_tmp: Path) -> AsyncIterator[Running]:
    async with anyio.create_task_group() as tg:
        server = Fixture(short_tmp / "mcp.sock")
        try:
            yield server, tg
        finally:
            await server.kill()
            tg.cancel_scope.cancel()


def connect_argv(short_tmp: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "supervisor",
        "connect",
        "--socket",
        str(short_tmp / "control.sock"),
        *extra,
    ]


@asynccontextmanager
async def session_through_connect(
    short_tmp: Path, marker: str, *extra: str, on_message: Callable[[Any], Any] | None = None
) -> AsyncIterator[ClientSession]:
    """A handshake-era SDK session whose server is a real ``mcp-supervisor connect`` process."""
    argv = connect_argv(short_tmp, *extra)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env={MARKER_ENV: marker + "connect"})

    async def handler(message: Any) -> None:
        if on_message is not None:
            on_message(message)

    with (short_tmp / "connect.err").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, message_handler=handler) as session,
        ):
            with fail_after(WAIT):
                await session.initialize()
            yield session


class Raw:
    """A connect process driven line by line, for exit codes and exact bytes."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self._pending = b""
        self._stderr = b""

    async def send(self, *messages: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"".join(line(message) for message in messages))

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        with fail_after(WAIT):
            while b"\n" not in self._pending:
                self._pending += await self.process.stdout.receive()
        first, _, self._pending = self._pending.partition(b"\n")
        return json.loads(first)

    async def stderr(self, until: str | None = None) -> str:
        """What connect wrote to stderr: up to *until*, or all of it (until it exits)."""
        assert self.process.stderr is not None
        with fail_after(WAIT):
            while until is None or until.encode() not in self._stderr:
                try:
                    self._stderr += await self.process.stderr.receive()
                except anyio.EndOfStream:
                    break
        return self._stderr.decode()


@asynccontextmanager
async def raw_connect(
    short_tmp: Path, marker: str, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[Raw]:
    env = {**os.environ, **(env or {}), MARKER_ENV: marker + "connect"}
    async with await anyio.open_process(connect_argv(short_tmp, *extra), env=env) as process:
        try:
            yield Raw(process)
        finally:
            if process.returncode is None:
                process.kill()


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


class TestSession:
    async def test_list_and_call(self, fixture: Running, short_tmp: Path, marker_prefix: str) -> None:
        """An SDK client lists and calls tools through connect as if it spoke to the server itself."""
        server, tg = fixture
        await server.start(tg)
        async with session_through_connect(short_tmp, marker_prefix) as session:
            tools = await session.list_tools()
            assert {"echo", "slow", "big", "pid"} <= {tool.name for tool in tools.tools}
            assert text_of(await session.call_tool("echo", {"text": "héllo"})) == "héllo"
            assert [prompt.name for prompt in (await session.list_prompts()).prompts] == ["greet"]

    async def test_a_big_answer_streams_through_intact(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """A 5 MB answer (over the 1 MiB streaming threshold) arrives whole, then calls go on."""
        server, tg = fixture
        await server.start(tg)
        async with session_through_connect(short_tmp, marker_prefix) as session:
            assert text_of(await session.call_tool("big", {"bytes": 5_000_000})) == "x" * 5_000_000
            assert text_of(await session.call_tool("echo", {"text": "after"})) == "after"

    async def test_modern_era_client(self, fixture: Running, short_tmp: Path, marker_prefix: str) -> None:
        """A 2026-07-28 client (server/discover, _meta per request, no handshake) lists and calls."""
        server, tg = fixture
        await server.start(tg)
        argv = connect_argv(short_tmp)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env={MARKER_ENV: marker_prefix + "c"})
        with fail_after(WAIT):
            async with Client(params, mode="2026-07-28") as client:
                assert client.protocol_version == "2026-07-28"
                assert "echo" in {tool.name for tool in (await client.list_tools()).tools}
                assert text_of(await client.call_tool("echo", {"text": "modern"})) == "modern"


class TestExits:
    @pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
    def test_a_bad_reconnect_timeout_is_a_usage_error(
        self, value: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["connect", "--reconnect-timeout", value]) == 2
        assert "--reconnect-timeout" in capsys.readouterr().err

    def test_no_listener_is_exit_3_with_one_line(self, short_tmp: Path) -> None:
        """Nobody on mcp.sock: one line naming the socket, exit 3, nothing on stdout."""
        done = subprocess.run(connect_argv(short_tmp), input=b"", capture_output=True, timeout=WAIT)
        assert done.returncode == 3
        assert done.stdout == b""
        assert done.stderr.decode() == f"mcp-supervisor: no daemon is listening on {short_tmp / 'mcp.sock'}\n"

    async def test_stdin_eof_is_exit_0_after_the_answers_due(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """Input ends with a call in flight: its answer is still written, then connect exits 0."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix) as raw:
            await raw.send(INITIALIZE, INITIALIZED, call(1, "slow", seconds=0.3))
            assert raw.process.stdin is not None
            await raw.process.stdin.aclose()
            assert (await raw.receive())["id"] == 0
            assert (await raw.receive())["result"]["content"][0]["text"] == "done"
            with fail_after(WAIT):
                assert await raw.process.wait() == 0

    async def test_a_client_that_closes_its_end_of_stdout_ends_connect(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """Nobody reads the answers any more: connect notices at once, with nothing to write, and ends."""
        server, tg = fixture
        await server.start(tg)
        env = {**os.environ, MARKER_ENV: marker_prefix + "connect"}
        pipes = subprocess.PIPE  # Popen's: anyio's aclose of a process's stdout leaves its fd open
        with subprocess.Popen(connect_argv(short_tmp), stdin=pipes, stdout=pipes, env=env) as process:  # noqa: ASYNC220
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(line(INITIALIZE))
                process.stdin.flush()
                answer = await anyio.to_thread.run_sync(process.stdout.readline)
                assert json.loads(answer)["id"] == 0
                process.stdout.close()  # stdin stays open
                assert await anyio.to_thread.run_sync(functools.partial(process.wait, WAIT)) == 0
            finally:
                process.kill()

    async def test_a_fifo_open_read_write_as_stdout_is_not_taken_for_a_hang_up(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """`1<>fifo`: connect's own answers make its stdout readable, which on a write-only pipe
        would mean the reader went. Only write-only pipes are watched for that."""
        server, tg = fixture
        await server.start(tg)
        fifo = short_tmp / "out.fifo"
        os.mkfifo(fifo)
        stdout = os.open(fifo, os.O_RDWR)
        answers = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        env = {**os.environ, MARKER_ENV: marker_prefix + "connect"}
        try:
            process = await anyio.open_process(
                connect_argv(short_tmp), stdin=subprocess.PIPE, stdout=stdout, env=env
            )
            async with process:
                assert process.stdin is not None
                await process.stdin.send(
                    line(INITIALIZE) + line(INITIALIZED) + line(call(1, "echo", text="f"))
                )
                data = b""
                with fail_after(WAIT):
                    while data.count(b"\n") < 2:
                        with contextlib.suppress(BlockingIOError):
                            data += os.read(answers, 65536)
                        await anyio.sleep(0.01)  # polling a non-blocking fd, within the deadline
                assert [json.loads(text)["id"] for text in data.splitlines()] == [0, 1]
                assert process.returncode is None  # still serving
                await process.stdin.aclose()
                with fail_after(WAIT):
                    assert await process.wait() == 0
        finally:
            os.close(stdout)
            os.close(answers)

    async def test_files_as_stdin_and_stdout(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """Regular files cannot be polled: read and written in turn, the answers all land, exit 0."""
        server, tg = fixture
        await server.start(tg)
        requests, answers = short_tmp / "in.jsonl", short_tmp / "out.jsonl"
        requests.write_bytes(b"".join(line(m) for m in (INITIALIZE, INITIALIZED, call(1, "echo", text="f"))))
        env = {**os.environ, MARKER_ENV: marker_prefix + "connect"}
        with requests.open("rb") as stdin, answers.open("wb") as stdout:
            done = await anyio.to_thread.run_sync(
                functools.partial(
                    subprocess.run, connect_argv(short_tmp), stdin=stdin, stdout=stdout, env=env, timeout=WAIT
                )
            )
        assert done.returncode == 0
        replies = [json.loads(text) for text in answers.read_text().splitlines()]
        assert [reply["id"] for reply in replies] == [0, 1]
        assert replies[1]["result"]["content"][0]["text"] == "f"

    async def test_refuses_a_listener_of_another_uid(self, short_tmp: Path, marker_prefix: str) -> None:
        """A socket served by uid 65534: refused with exit 3 before a single byte is sent."""
        directory = open_to_all(short_tmp)
        listener = (
            "import os, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
            "s.bind(sys.argv[1]); s.listen(); print('ready', flush=True)\n"
            "c, _ = s.accept(); c.settimeout(5)\n"
            "data = b''\n"
            "while chunk := c.recv(65536): data += chunk\n"
            "print(len(data), flush=True)\n"
        )
        argv = [sys.executable, "-c", listener, str(directory / "mcp.sock")]
        env = {**os.environ, MARKER_ENV: marker_prefix + "other"}
        async with await anyio.open_process(argv, env=env) as other:
            assert other.stdout is not None
            output = BufferedByteReceiveStream(other.stdout)
            with fail_after(WAIT):
                assert await output.receive_until(b"\n", 100) == b"ready"
            done = await anyio.run_process(
                connect_argv(directory), input=line(INITIALIZE), check=False, env={**os.environ}
            )
            with fail_after(WAIT):
                received = await output.receive_until(b"\n", 100)
        assert done.returncode == 3
        assert done.stdout == b""
        assert done.stderr.decode().count("\n") == 1
        assert "uid 65534" in done.stderr.decode()
        assert received == b"0"  # the listener saw the connection close, and no byte


def open_to_all(short_tmp: Path) -> Path:
    """A directory any user can create a socket in, inside *short_tmp*."""
    short_tmp.chmod(0o711)
    directory = short_tmp / "shared"
    directory.mkdir()
    directory.chmod(0o777)
    return directory


class TestFootprint:
    async def test_a_connected_client_holds_under_20_mib(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """Every MCP client spawns its own connect: past its handshake and a call it stays under
        20 MiB resident (issue 19; 14.7 MiB measured, 23.8 MiB when it ran on asyncio)."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix) as raw:
            await raw.send(INITIALIZE, INITIALIZED, call(1, "echo", text="x"))
            assert (await raw.receive())["id"] == 0
            assert (await raw.receive())["id"] == 1
            assert psutil.Process(raw.process.pid).memory_info().rss < 20 << 20

    async def test_a_call_maps_no_memory(self, fixture: Running, short_tmp: Path, marker_prefix: str) -> None:
        """Reads land in one buffer. A read of up to 256 KiB into a new bytes object made glibc map,
        shrink and unmap it (three system calls and a page fault, twice per call) for the life of a
        process whose allocation history had left glibc's threshold for mapping below that; the
        environment pins the threshold there."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix, env={"MALLOC_MMAP_THRESHOLD_": "131072"}) as raw:
            await raw.send(INITIALIZE, INITIALIZED, call(1, "echo", text="x"))
            assert (await raw.receive())["id"] == 0
            assert (await raw.receive())["id"] == 1
            before = _minor_faults(raw.process.pid)
            for request_id in range(2, 302):
                await raw.send(call(request_id, "echo", text="x"))
                assert (await raw.receive())["id"] == request_id
            assert _minor_faults(raw.process.pid) - before < 100  # 600 when each read mapped


def _minor_faults(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt: the 10th field, the 8th after the command's ")"


class TestRestart:
    async def test_the_same_session_survives_a_restart(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """Kill and restart the server: the call in flight fails at once, the client is told to
        re-list, and the same session goes on calling tools on the new server."""
        server, tg = fixture
        await server.start(tg)
        changed: list[str] = []
        got_changes = anyio.Event()

        def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification | types.PromptListChangedNotification):
                changed.append(message.method)
                if len(changed) >= 2:
                    got_changes.set()

        async with session_through_connect(short_tmp, marker_prefix, on_message=on_message) as session:
            first_pid = text_of(await session.call_tool("pid", {}))
            failure: list[MCPError] = []

            async def slow_call() -> None:
                with pytest.raises(MCPError) as caught:
                    await session.call_tool("slow", {"seconds": 60})
                failure.append(caught.value)

            with fail_after(WAIT):  # the call fails at once, not after its 60 s
                async with anyio.create_task_group() as calls:
                    calls.start_soon(slow_call)
                    await server.wait_called("slow")
                    await server.kill()
            assert failure[0].code == -32000
            assert "restarted" in failure[0].message and "may or may not have run" in failure[0].message

            await server.start(tg)
            with fail_after(WAIT):
                await got_changes.wait()
            assert set(changed) == {"notifications/tools/list_changed", "notifications/prompts/list_changed"}
            second_pid = text_of(await session.call_tool("pid", {}))
            assert second_pid != first_pid
            assert text_of(await session.call_tool("echo", {"text": "still here"})) == "still here"
        assert "reconnected" in (short_tmp / "connect.err").read_text()

    async def test_a_modern_listen_stream_survives_a_restart(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """A 2026-07-28 client's subscriptions/listen stays open across a restart and delivers a
        tools change, so the client re-lists; calls go on."""
        server, tg = fixture
        await server.start(tg)
        argv = connect_argv(short_tmp)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env={MARKER_ENV: marker_prefix + "c"})
        async with Client(params, mode="2026-07-28") as client:
            with fail_after(WAIT):
                async with client.listen(tools_list_changed=True) as subscription:
                    await server.kill()
                    await server.start(tg)
                    assert isinstance(await subscription.__anext__(), ToolsListChanged)
                    assert text_of(await client.call_tool("echo", {"text": "modern"})) == "modern"

    async def test_while_away_a_client_that_reads_nothing_is_not_read_either(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """With the daemon away, each request past the held few is answered with an error at once;
        a client that never reads those answers is not read either. Before, connect kept reading
        and buffering its answers: 86 MB more in 8 s."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix) as raw:
            await raw.send(INITIALIZE)
            assert (await raw.receive())["id"] == 0
            await server.kill()
            await raw.stderr(until="lost the daemon")
            assert raw.process.stdin is not None
            flood = b"".join(line(call(n, "echo", text="x" * 100)) for n in range(1000))
            sent = 0
            with anyio.move_on_after(4):  # the writes block once connect stops reading: the point
                while True:
                    await raw.process.stdin.send(flood)
                    sent += len(flood)
            assert sent < 8 << 20, f"connect took {sent >> 20} MiB from a client that read nothing"
            assert psutil.Process(raw.process.pid).memory_info().rss < 30 << 20

    async def test_a_call_made_while_away_is_held_and_answered(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """A request sent while the server is down waits for the new one and succeeds."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix) as raw:
            await raw.send(INITIALIZE, INITIALIZED)
            assert (await raw.receive())["id"] == 0
            await server.kill()
            await raw.stderr(until="lost the daemon")
            await raw.send(call(1, "echo", text="held"))
            await server.start(tg)
            answers = [await raw.receive() for _ in range(4)]  # three list_changed, then the answer
            by_id = {answer.get("id"): answer for answer in answers}
            assert by_id[1]["result"]["content"][0]["text"] == "held"
            methods = sorted(answer["method"] for answer in answers if "method" in answer)
            assert methods == [
                f"notifications/{kind}/list_changed" for kind in ("prompts", "resources", "tools")
            ]
            await server.wait_called("echo")  # its stderr line may come after the answer
            assert server.calls == ["echo"]  # the replayed initialize was answered and dropped

    async def test_gives_up_after_the_reconnect_timeout(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """No server back in time: held requests past the bound are refused at once, the rest
        at the end, and connect exits 3 with one line."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix, "--reconnect-timeout", "1.5") as raw:
            await raw.send(INITIALIZE, INITIALIZED)
            assert (await raw.receive())["id"] == 0
            await server.kill()
            await raw.stderr(until="lost the daemon")
            extra = 5
            await raw.send(*(call(i, "echo", text="x") for i in range(1, MAX_HELD_LINES + extra + 1)))
            refused = [await raw.receive() for _ in range(extra)]  # at once: past the bound
            assert [reply["id"] for reply in refused] == list(
                range(MAX_HELD_LINES + 1, MAX_HELD_LINES + extra + 1)
            )
            assert all("try again shortly" in reply["error"]["message"] for reply in refused)
            given_up = [await raw.receive() for _ in range(MAX_HELD_LINES)]
            assert [reply["id"] for reply in given_up] == list(range(1, MAX_HELD_LINES + 1))
            assert all("did not come back" in reply["error"]["message"] for reply in given_up)
            with fail_after(WAIT):
                assert await raw.process.wait() == 3
            lines = (await raw.stderr()).splitlines()
            assert lines[-1].endswith("went away and did not come back within 1.5 s")


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for text in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = text.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


class TestBounds:
    async def test_a_client_that_stops_reading_does_not_grow_memory(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """32 MB of answers while the client reads nothing: connect stops reading the daemon
        instead of buffering them, then delivers every byte once the client reads again."""
        server, tg = fixture
        await server.start(tg)
        count, size = 8, 4_000_000
        async with raw_connect(short_tmp, marker_prefix) as raw:
            await raw.send(INITIALIZE, INITIALIZED)
            assert (await raw.receive())["id"] == 0
            before = _memory_kib(raw.process.pid)
            await raw.send(*(call(i, "big", bytes=size) for i in range(1, count + 1)))
            await server.wait_called("big", times=count)
            with anyio.move_on_after(1.0):  # the bound must hold all along, not just at one instant
                while True:
                    grown_mib = (_memory_kib(raw.process.pid)["VmHWM"] - before["VmRSS"]) / 1024
                    assert grown_mib < 12, grown_mib  # the answers total 32 MB
                    await anyio.sleep(0.05)
            answers = [await raw.receive() for _ in range(count)]
        assert sorted(answer["id"] for answer in answers) == list(range(1, count + 1))
        assert all(len(answer["result"]["content"][0]["text"]) == size for answer in answers)

    async def test_a_line_over_the_cap_is_refused_without_holding_it(
        self, fixture: Running, short_tmp: Path, marker_prefix: str
    ) -> None:
        """Two requests over the 64 MiB cap: each gets -32600, memory stays under the cap and
        falls back, and the session goes on."""
        server, tg = fixture
        await server.start(tg)
        async with raw_connect(short_tmp, marker_prefix) as raw:
            await raw.send(INITIALIZE, INITIALIZED)
            assert (await raw.receive())["id"] == 0
            before = _memory_kib(raw.process.pid)
            assert raw.process.stdin is not None
            size = 2 * MAX_CLIENT_LINE
            piece = b"x" * (1 << 20)
            for request_id in (1, 2):
                head = json.dumps(call(request_id, "echo", text="")).encode()
                await raw.process.stdin.send(head[: -len(b'"}}}')])
                for _ in range(size // len(piece)):
                    await raw.process.stdin.send(piece)
                await raw.process.stdin.send(b'"}}}\n')
                reply = await raw.receive()
                assert reply["id"] == request_id and reply["error"]["code"] == -32600
            await raw.send(call(3, "echo", text="small"))
            assert (await raw.receive())["result"]["content"][0]["text"] == "small"
            after = _memory_kib(raw.process.pid)
        grown_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
        assert grown_mib < MAX_CLIENT_LINE / (1 << 20) * 1.25, after  # at most the cap, never the line
        assert (after["VmRSS"] - before["VmRSS"]) / 1024 < 16, after  # and given back
        await server.wait_called("echo")  # its stderr line may come after the answer
        assert server.calls == ["echo"]
