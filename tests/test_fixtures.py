"""Smoke tests for the fixture servers in tests/servers: each starts and behaves as its docstring says."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TextIO

import anyio
import mcp_types as types
import psutil
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.session import MessageHandlerFnT

from tests.harness import SERVERS
from tests.harness.timing import fail_after

CONNECTION_CLOSED = -32000
PROTOCOL = "2025-06-18"  # not the SDK's default, so an echoed version is visible
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": PROTOCOL,
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """Run these tests on asyncio only."""
    return "asyncio"


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """A real file for the child's stderr (stdio_client needs a fileno), readable after the test."""
    with (tmp_path / "stderr.log").open("w+") as file:
        yield file


def _script(name: str) -> str:
    return str(SERVERS / f"{name}.py")


@asynccontextmanager
async def _session(
    name: str,
    errlog: TextIO,
    *,
    env: dict[str, str] | None = None,
    message_handler: MessageHandlerFnT | None = None,
    initialize: bool = True,
) -> AsyncIterator[ClientSession]:
    """An SDK client session with fixture *name*, started with the full environment."""
    params = StdioServerParameters(
        command=sys.executable, args=[_script(name)], env=dict(os.environ) | (env or {})
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write, message_handler=message_handler) as session,
    ):
        if initialize:
            # Deadlines here bound a hang: an SDK fixture's start is 1.8 s of CPU, and in four
            # workers on 2 cores one once took more than 5 s to answer initialize.
            with fail_after(30):
                await session.initialize()
        yield session


async def _text(session: ClientSession, tool: str, arguments: dict[str, object] | None = None) -> str:
    with fail_after(30):
        result = await session.call_tool(tool, arguments or {})
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def _gone(proc: psutil.Process) -> bool:
    """Dead, or a zombie waiting for its parent (an orphan may wait a while for PID 1)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _wait_gone(procs: list[psutil.Process]) -> None:
    """Poll with a deadline: nothing signals the death of a process that is not our child."""
    with fail_after(30):
        while not all(_gone(proc) for proc in procs):  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_echo_sdk_server(errlog: TextIO) -> None:
    """The SDK fixture echoes, pushes tools/list_changed, reports handler errors and crashes on demand."""
    changed = anyio.Event()

    async def on_message(message: types.ServerNotification | Exception) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with _session("echo", errlog, message_handler=on_message) as session:
        assert await _text(session, "echo", {"text": "hi"}) == "hi"
        assert await _text(session, "big_text", {"bytes": 1000}) == "x" * 1000
        assert await _text(session, "toggle_tool") == "extra=True"
        with fail_after(30):
            await changed.wait()
            names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"echo", "crash", "extra"} <= names
        with pytest.raises(MCPError, match="boom"), fail_after(30):
            await session.call_tool("fail", {})
        with pytest.raises(MCPError) as crashed, fail_after(30):
            await session.call_tool("crash", {"code": 4})
        assert crashed.value.code == CONNECTION_CLOSED
    errlog.seek(0)
    assert errlog.read().splitlines()[0] == "echo: ready"


async def test_quick_raw_server(errlog: TextIO) -> None:
    """The raw fixture answers echo/pid/sleep, writes startup stderr lines, and crashes on demand."""
    async with _session("quick", errlog, env={"QUICK_STDERR_AT_START": "3"}) as session:
        assert session.initialize_result is not None
        assert session.initialize_result.capabilities.tools is not None
        assert session.initialize_result.capabilities.tools.list_changed is True
        assert await _text(session, "echo", {"text": "hi"}) == "hi"
        assert psutil.pid_exists(int(await _text(session, "pid")))
        assert await _text(session, "sleep", {"seconds": 0.01}) == "slept"
        with pytest.raises(MCPError) as crashed, fail_after(30):
            await session.call_tool("crash", {"code": 4})
        assert crashed.value.code == CONNECTION_CLOSED
    errlog.seek(0)
    assert errlog.read().splitlines() == [f"quick: start line {i}" for i in (1, 2, 3)] + ["quick: crashing"]


async def test_tree_spawns_descendants_one_escaping_the_group(errlog: TextIO) -> None:
    """tree.py's grandchild shares its session; the great-grandchild is in a new one."""
    pids: dict[str, int] = {}
    try:
        async with _session("tree", errlog) as session:
            pids = json.loads(await _text(session, "pids"))
            assert set(pids) == {"server", "grandchild", "great_grandchild"}
            assert len(set(pids.values())) == 3
            assert all(psutil.pid_exists(pid) and not _gone(psutil.Process(pid)) for pid in pids.values())
            assert os.getsid(pids["grandchild"]) == os.getsid(pids["server"])
            assert os.getpgid(pids["grandchild"]) == os.getpgid(pids["server"])
            assert os.getsid(pids["great_grandchild"]) != os.getsid(pids["server"])
    finally:
        if not pids:  # the test failed before the tool answered: the pids are on stderr
            errlog.seek(0)
            lines = [line for line in errlog.read().splitlines() if line.startswith("tree: pids ")]
            pids = json.loads(lines[0].removeprefix("tree: pids ")) if lines else {}
        procs = []
        for pid in pids.values():
            with suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                proc.kill()
                procs.append(proc)
        await _wait_gone(procs)


async def test_stubborn_survives_sigterm(errlog: TextIO) -> None:
    """stubborn.py still answers after SIGTERM; SIGKILL ends it."""
    async with _session("stubborn", errlog) as session:
        pid = int(await _text(session, "pid"))
        proc = psutil.Process(pid)
        try:
            os.kill(pid, signal.SIGTERM)
            # A reply proves it ran past the signal: pending signals are delivered before it can answer.
            assert int(await _text(session, "pid")) == pid
            assert not _gone(proc)
        finally:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
            await _wait_gone([proc])


async def test_stubborn_outlives_stdin_eof() -> None:
    """On the raw protocol stubborn.py echoes the requested protocol version and keeps running after EOF."""
    process = await anyio.open_process([sys.executable, _script("stubborn")])
    try:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        stderr = BufferedByteReceiveStream(process.stderr)
        with fail_after(30):
            await process.stdin.send(json.dumps(INIT).encode() + b"\n")
            reply = json.loads(await stdout.receive_until(b"\n", 1 << 16))
            ready = await stderr.receive_until(b"\n", 1 << 16)
            await process.stdin.aclose()
            after_eof = await stderr.receive_until(b"\n", 1 << 16)
        assert reply["result"]["protocolVersion"] == PROTOCOL
        assert ready.startswith(b"stubborn: ready")
        assert after_eof == b"stubborn: stdin closed, staying alive"
        assert process.returncode is None
    finally:
        process.kill()
        with fail_after(30):
            await process.wait()
        await process.aclose()


@pytest.mark.parametrize(("args", "code"), [([], 1), (["7"], 7)])
async def test_exit_now(args: list[str], code: int) -> None:
    """exit_now.py says bye on stderr and exits with the code from argv (default 1)."""
    with fail_after(30):
        done = await anyio.run_process([sys.executable, _script("exit_now"), *args], check=False)
    assert done.returncode == code
    assert done.stderr == b"exit_now: bye\n"
    assert done.stdout == b""


async def test_hang_init_never_answers(errlog: TextIO) -> None:
    """hang_init.py leaves initialize unanswered."""
    async with _session("hang_init", errlog, initialize=False) as session:
        with pytest.raises(TimeoutError), fail_after(1):
            await session.initialize()


async def test_garbage_survives_junk_on_stdout(errlog: TextIO) -> None:
    """garbage.py's junk lines reach the client as parse errors; the real replies still arrive."""
    junk: list[Exception] = []
    all_junk_seen = anyio.Event()

    async def on_message(message: types.ServerNotification | Exception) -> None:
        if isinstance(message, Exception):
            junk.append(message)
            if len(junk) == 6:  # 2 lines before initialize, 3 from noise, 1 from huge
                all_junk_seen.set()

    async with _session("garbage", errlog, message_handler=on_message) as session:
        assert await _text(session, "echo", {"text": "hi"}) == "hi"
        assert await _text(session, "noise") == "noisy"
        assert await _text(session, "huge", {"bytes": 100_000}) == "wrote 100000 bytes"
        with fail_after(30):
            await all_junk_seen.wait()
