"""A published remote server under the daemon: ``server-everything`` in its streamable HTTP and
HTTP+SSE modes on loopback, as remote extensions, listed and called through the gateway."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import mcp_types as types
import pytest
from mcp import Client

from tests.harness import Daemon, first_text, gateway_session
from tests.harness.timing import patience

from .conftest import Interop, Toolchain, serve_everything

pytestmark = [
    pytest.mark.interop,
    pytest.mark.anyio,
    pytest.mark.timeout(300),  # the first test of a worker may pay for the session's installs
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

MODES = {"streamableHttp": "/mcp", "sse": "/sse"}


@pytest.fixture
def everything(toolchain: Toolchain) -> Iterator[Callable[[str], str]]:
    """Start server-everything in a mode; its URL once it accepts connections."""
    started: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> str:
        proc, url = serve_everything(toolchain, mode)
        started.append(proc)
        return url

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


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_sdk_client_of_either_era_reaches_a_remote_extension_over_http(
    interop: Interop, mode: str
) -> None:
    """The session daemon's ``remote-everything`` (server-everything over streamable HTTP) from
    the SDK's own client on the gateway's HTTP listener, in both protocol eras."""
    interop.ensure_running("remote-everything")
    async with Client(interop.daemon.mcp(), mode=mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "remote-everything__get-sum" in names, names
        result = await client.call_tool("remote-everything__get-sum", {"a": 2, "b": 3})
    assert not result.is_error and "5" in first_text(result), result
