"""Which gateway client hears which child's log messages: what its view shows, its own instances.

A real daemon runs ``tests/servers/rich.py`` (its ``log`` tool sends log notifications); real SDK
clients listen in both eras: handshake-era ``logging/setLevel`` and 2026-07-28 per-request levels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.harness import RICH, Daemon, eventually, gateway_session, unix_transport

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]


def collector() -> tuple[list[Any], Callable[[types.LoggingMessageNotificationParams], Any]]:
    got: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        got.append(params.data)

    return got, on_log


def log(extension: str, message: str) -> tuple[str, dict[str, Any]]:
    return f"{extension}__log", {"level": "info", "message": message}


@pytest.fixture
def start(gateway: Callable[..., Daemon]) -> Callable[..., Daemon]:
    return gateway


class TestProfiles:
    async def test_a_client_hears_only_the_extensions_of_its_profile(self, start) -> None:
        """A client on profile `inner` hears `inner`'s children, never `outer`'s (a client without
        a profile made `outer` log first: in one client's queue it would come first)."""
        daemon = start({"inner": RICH, "outer": RICH}, profiles={"mine": {"extensions": ["inner"]}})
        got, on_log = collector()
        sock = daemon.mcp_sock
        async with (
            gateway_session(sock, profile="mine", logging_callback=on_log) as mine,
            gateway_session(sock) as other,
        ):
            await mine.set_logging_level("debug")
            await other.call_tool(*log("outer", "not in your profile"))
            await mine.call_tool(*log("inner", "yours"))
            await eventually(lambda: "yours" in got)
        assert got == ["yours"]

    async def test_a_2026_request_hears_only_its_own_extension(self, start) -> None:
        daemon = start({"inner": RICH, "outer": RICH}, profiles={"mine": {"extensions": ["inner"]}})
        got, on_log = collector()
        transport = unix_transport(daemon.mcp_sock, "mine")
        async with (
            Client(transport, mode="2026-07-28", log_level="debug", logging_callback=on_log) as mine,
            gateway_session(daemon.mcp_sock) as other,
        ):
            await other.call_tool(*log("outer", "not in your profile"))
            await mine.call_tool(*log("inner", "yours"))
            await eventually(lambda: "yours" in got)
        assert got == ["yours"]


class TestInstances:
    async def test_each_client_hears_its_own_instance_only(self, start) -> None:
        """Two clients on a per-client extension, both asking for every level: each hears its own
        child's log messages, never the other's (nor the shared child's, which serves the CLI)."""
        daemon = start({"rich": {**RICH, "instances": "per-client"}})
        heard = {label: collector() for label in ("a", "b")}
        sock = daemon.mcp_sock
        async with (
            gateway_session(sock, logging_callback=heard["a"][1]) as a,
            gateway_session(sock, logging_callback=heard["b"][1]) as b,
        ):
            for session in (a, b):
                await session.set_logging_level("debug")
            for round_ in (1, 2):  # by the second round, whatever the other sent first has arrived
                for label, session in (("a", a), ("b", b)):
                    await session.call_tool(*log("rich", f"{label}{round_}"))
                    await eventually(lambda label=label, round_=round_: f"{label}{round_}" in heard[label][0])
            await _cli_log(daemon)
            await a.call_tool(*log("rich", "a3"))
            await eventually(lambda: "a3" in heard["a"][0])
        assert heard["a"][0] == ["a1", "a2", "a3"] and heard["b"][0] == ["b1", "b2"]

    async def test_a_2026_request_hears_its_own_instance_only(self, start) -> None:
        daemon = start({"rich": {**RICH, "instances": "per-client"}})
        got, on_log = collector()
        async with (
            Client(
                unix_transport(daemon.mcp_sock),
                mode="2026-07-28",
                log_level="debug",
                logging_callback=on_log,
            ) as mine,
            gateway_session(daemon.mcp_sock) as other,
        ):
            await other.call_tool(*log("rich", "not yours"))
            await mine.call_tool(*log("rich", "yours"))
            await eventually(lambda: "yours" in got)
        assert got == ["yours"]


async def _cli_log(daemon: Daemon) -> None:
    """The shared child logs (a call from the control socket): no gateway client's."""
    result = await anyio.to_thread.run_sync(
        daemon.cli, "call", "rich", "log", "--args", '{"level": "info", "message": "cli"}'
    )
    assert result.returncode == 0, result.stderr
