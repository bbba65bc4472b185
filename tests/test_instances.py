"""Per-client instances: each gateway connection its own child, gone with the connection."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from .conftest import extension_settings, first_text
from .gateway_client import gateway_session
from .test_daemon import alive, until
from .test_ondemand import StatefulDaemon, counted, ondemand, spawns  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),  # our test client: handshake era
]


def test_two_clients_get_two_children_and_each_close_kills_its_own(
    ondemand: Callable[..., StatefulDaemon],  # noqa: F811
    short_tmp: Path,
) -> None:
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, instances="per-client")})
    shared = daemon.wait_state("fx", "running")["pid"]
    closed = anyio.Event()
    seen: dict[str, int] = {}

    async def client(label: str, leave: anyio.Event | None) -> None:
        async with gateway_session(daemon.mcp_sock) as session:
            pid = int(first_text(await session.call_tool("fx__pid", {})))
            assert int(first_text(await session.call_tool("fx__pid", {}))) == pid  # the same child again
            seen[label] = pid
            if leave is None:  # the one that stays: it waits for the other to be gone
                await anyio.to_thread.run_sync(lambda: until(lambda: len(seen) == 2))
                record = await anyio.to_thread.run_sync(daemon.status)
                assert sorted(i["pid"] for i in record["fx"]["instances"]) == sorted(seen.values())
                # Each run's own tree: one process each, the shared one not counting the others'.
                assert [i["resources"]["processes"] for i in record["fx"]["instances"]] == [1, 1], record
                assert record["fx"]["resources"]["processes"] == 1
                closed.set()
                await anyio.to_thread.run_sync(lambda: until(lambda: not alive(seen["a"])))
                assert alive(pid)
                record = await anyio.to_thread.run_sync(daemon.status)
                assert [i["pid"] for i in record["fx"]["instances"]] == [pid]
            else:
                await closed.wait()

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client, "a", anyio.Event())
            tg.start_soon(client, "b", None)

    anyio.run(both)
    assert len({shared, seen["a"], seen["b"]}) == 3  # separate state: separate processes
    assert len(spawns(pids)) == 3
    result = daemon.cli("call", "fx", "pid")  # the control socket uses the shared instance
    assert result.returncode == 0 and result.stdout.strip() == str(shared), result
    until(lambda: not alive(seen["b"]))  # its client left too
    assert daemon.status()["fx"]["instances"] == []


def test_max_instances_bounds_the_children(
    ondemand: Callable[..., StatefulDaemon],  # noqa: F811
    short_tmp: Path,
) -> None:
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, instances="per-client", max_instances=1, on_demand=True)})
    until(lambda: daemon.status()["fx"]["detail"] == "on demand")

    async def two() -> str:
        async with (
            gateway_session(daemon.mcp_sock) as first,
            gateway_session(daemon.mcp_sock) as second,
        ):
            assert not (await first.call_tool("fx__pid", {})).is_error
            refused = await second.call_tool("fx__pid", {})
            assert refused.is_error
            return first_text(refused)

    assert "all 1 per-client instances are in use" in anyio.run(two)
    assert len(spawns(pids)) == 2  # the learning run, and the first client's


def test_a_closed_connection_takes_its_whole_tree(
    ondemand: Callable[..., StatefulDaemon],  # noqa: F811
) -> None:
    daemon = ondemand({"tree": extension_settings("tree.py", instances="per-client", on_demand=True)})
    until(lambda: daemon.status()["tree"]["detail"] == "on demand")

    async def one_client() -> dict[str, int]:
        async with gateway_session(daemon.mcp_sock) as session:
            return json.loads(first_text(await session.call_tool("tree__pids", {})))

    pids = anyio.run(one_client)
    assert len(pids) == 3  # the server, a grandchild holding stdout, a setsid great-grandchild
    until(lambda: not any(alive(pid) for pid in pids.values()))
    assert daemon.status()["tree"]["instances"] == []
