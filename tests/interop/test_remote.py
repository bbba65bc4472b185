"""A published remote server under the daemon: ``server-everything`` in its streamable HTTP and
HTTP+SSE modes on loopback, as remote extensions, listed and called through the gateway."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator

import mcp_types as types
import pytest

from tests.harness import Daemon, gateway_session, until
from tests.harness.timing import patience

from .conftest import Toolchain

pytestmark = [
    pytest.mark.interop,
    pytest.mark.anyio,
    pytest.mark.timeout(300),  # the first test of a worker may pay for the session's installs
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

MODES = {"streamableHttp": "/mcp", "sse": "/sse"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def everything(toolchain: Toolchain) -> Iterator[Callable[[str], str]]:
    """Start server-everything in a mode; its URL once it accepts connections."""
    started: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> str:
        port = _free_port()
        binary = toolchain.bin / "mcp-server-everything"
        env = {**os.environ, **toolchain.env, "PORT": str(port)}
        started.append(subprocess.Popen([str(binary), mode], env=env, stderr=subprocess.DEVNULL))
        until(lambda: _accepts(port), within=patience(30))
        return f"http://127.0.0.1:{port}{MODES[mode]}"

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("mode", "transport"), [("streamableHttp", "http"), ("sse", "sse")])
async def test_server_everything_as_a_remote_extension(
    daemons: Callable[..., Daemon], everything: Callable[[str], str], mode: str, transport: str
) -> None:
    """``type: auto`` finds the transport (SSE only after streamable HTTP is refused); the
    tools are the server's, under the extension's prefix, and a call answers."""
    url = everything(mode)
    daemon = daemons({"far": {"url": url, "start_timeout": patience(30), "stop_timeout": 2}})
    status = daemon.wait_state("far", "running", within=patience(60))
    assert status["remote"]["transport"] == transport, status
    async with gateway_session(daemon.mcp_sock) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"far__echo", "far__get-sum"} <= names, names
        result = await session.call_tool("far__echo", {"message": "hi"})
    assert isinstance(result.content[0], types.TextContent) and result.content[0].text == "Echo: hi", result
