"""Per-client instances: each gateway connection its own child, gone with the connection."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from supervisor.errors import ExtensionUnavailable
from supervisor.extension.instances import Instances
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from tests.harness import (
    Daemon,
    alive,
    counted,
    extension_settings,
    fast_config,
    first_text,
    gateway_session,
    spawns,
    until,
)
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),  # our test client: handshake era
]


def test_two_clients_get_two_children_and_each_close_kills_its_own(
    ondemand: Callable[..., Daemon],
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

                def only_mine() -> bool:  # the record goes a moment after the process
                    return [i["pid"] for i in daemon.status()["fx"]["instances"]] == [pid]

                await anyio.to_thread.run_sync(lambda: until(only_mine))
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
    until(lambda: daemon.status()["fx"]["instances"] == [])


def test_max_instances_bounds_the_children(
    ondemand: Callable[..., Daemon],
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


def test_at_the_cap_a_new_client_waits_for_the_room_a_leaving_one_makes(
    ondemand: Callable[..., Daemon],
) -> None:
    """A client that left: its tree takes a while to go (stubborn: killed after stop_timeout).
    The next client's call waits for that room, within its call_timeout, instead of "busy"."""
    stubborn = extension_settings("stubborn.py", instances="per-client", max_instances=1, stop_timeout=0.5)
    daemon = ondemand({"fx": {**stubborn, "on_demand": True}})
    until(lambda: daemon.status()["fx"]["detail"] == "on demand")

    async def one() -> int:
        async with gateway_session(daemon.mcp_sock) as session:
            return int(first_text(await session.call_tool("fx__pid", {})))

    async def two() -> tuple[int, int]:
        left = await one()
        assert alive(left)  # on its way out: the room is not there yet
        await anyio.to_thread.run_sync(lambda: until(lambda: _states(daemon) == ["stopping"]))  # seen to go
        return left, await one()

    left, came = anyio.run(two)
    assert came != left and not alive(left)


def _states(daemon: Daemon) -> list[str]:
    return [instance["state"] for instance in daemon.status()["fx"]["instances"]]


def test_a_closed_connection_takes_its_whole_tree(
    ondemand: Callable[..., Daemon],
) -> None:
    daemon = ondemand({"tree": extension_settings("tree.py", instances="per-client", on_demand=True)})
    until(lambda: daemon.status()["tree"]["detail"] == "on demand")

    async def one_client() -> dict[str, int]:
        async with gateway_session(daemon.mcp_sock) as session:
            return json.loads(first_text(await session.call_tool("tree__pids", {})))

    pids = anyio.run(one_client)
    assert len(pids) == 3  # the server, a grandchild holding stdout, a setsid great-grandchild
    until(lambda: not any(alive(pid) for pid in pids.values()))
    until(lambda: daemon.status()["tree"]["instances"] == [])  # its record goes once the teardown ends


def _pids_of(result: object) -> dict[str, int]:
    return json.loads(first_text(result))  # type: ignore[arg-type]


class TestOperations:
    def test_stop_takes_every_instance_tree_and_holds_until_start(
        self,
        ondemand: Callable[..., Daemon],
    ) -> None:
        """`stop NAME` kills every instance's whole tree; old and new clients' calls fail until `start`."""
        daemon = ondemand({"tree": extension_settings("tree.py", instances="per-client")})
        daemon.wait_state("tree", "running")

        async def scenario() -> None:
            async with gateway_session(daemon.mcp_sock) as one, gateway_session(daemon.mcp_sock) as two:
                trees = [_pids_of(await s.call_tool("tree__pids", {})) for s in (one, two)]
                assert trees[0]["server"] != trees[1]["server"]
                stopped = await anyio.to_thread.run_sync(daemon.cli, "stop", "tree")
                assert stopped.returncode == 0, stopped
                everyone = [pid for tree in trees for pid in tree.values()]
                await anyio.to_thread.run_sync(lambda: until(lambda: not any(map(alive, everyone))))
                record = await anyio.to_thread.run_sync(daemon.status)
                assert record["tree"]["state"] == "stopped" and record["tree"]["instances"] == []
                refused = await one.call_tool("tree__pids", {})
                assert refused.is_error and "'tree' is stopped" in first_text(refused), refused
                async with gateway_session(daemon.mcp_sock) as three:
                    refused = await three.call_tool("tree__pids", {})
                    assert refused.is_error and "'tree' is stopped" in first_text(refused), refused
                    record = await anyio.to_thread.run_sync(daemon.status)
                    assert record["tree"]["instances"] == []
                    started = await anyio.to_thread.run_sync(daemon.cli, "start", "tree")
                    assert started.returncode == 0, started
                    again = _pids_of(await one.call_tool("tree__pids", {}))
                    assert again["server"] not in everyone  # a new child: state starts afresh
                    assert _pids_of(await three.call_tool("tree__pids", {}))["server"] != again["server"]

        anyio.run(scenario)

    def test_restart_restarts_each_clients_instance(
        self,
        ondemand: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """`restart NAME` restarts the shared instance and every client's: each then sees a new child."""
        pids = short_tmp / "pids"
        daemon = ondemand({"fx": counted(pids, instances="per-client")})
        shared = daemon.wait_state("fx", "running")["pid"]

        async def scenario() -> None:
            async with gateway_session(daemon.mcp_sock) as one, gateway_session(daemon.mcp_sock) as two:
                before = [int(first_text(await s.call_tool("fx__pid", {}))) for s in (one, two)]
                restarted = await anyio.to_thread.run_sync(daemon.cli, "restart", "fx")
                assert restarted.returncode == 0, restarted
                await anyio.to_thread.run_sync(lambda: until(lambda: not any(map(alive, [shared, *before]))))
                after = [int(first_text(await s.call_tool("fx__pid", {}))) for s in (one, two)]
                assert len({*before, *after, shared}) == 5, (before, after)
                record = await anyio.to_thread.run_sync(daemon.status)
                assert sorted(i["pid"] for i in record["fx"]["instances"]) == sorted(after)
                assert [i["restarts"] for i in record["fx"]["instances"]] == [0, 0]  # by hand: not counted
                assert record["fx"]["pid"] not in (shared, None)
                table = await anyio.to_thread.run_sync(daemon.cli, "status", "fx")
                assert "  fx[1]  running" in table.stdout and "  fx[2]  running" in table.stdout, table

        anyio.run(scenario)
        assert len(spawns(pids)) == 6  # three, each restarted once


class _Client:
    """A client connection as :class:`Instances` sees one."""

    def __init__(self, *, lasting: bool = True) -> None:
        self.lasting = lasting
        self.closed = False
        self.callbacks: list[Callable[[], None]] = []

    def on_close(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def close(self) -> None:
        self.closed = True
        for callback in self.callbacks:
            callback()


class TestBookkeeping:
    @pytest.fixture
    def instances(self, make_extension: Callable[..., Extension]) -> Instances:
        return Instances(
            "fx", lambda client: make_extension(fast_config("quick.py", on_demand=True)), limit=2
        )

    @pytest.mark.anyio
    async def test_a_hold_refuses_new_instances_until_resumed(self, instances: Instances) -> None:
        """After stop_all(hold=True) no client gets an instance, old or new; resume() ends that."""
        old, new = _Client(), _Client()
        first = instances.of(old)
        await instances.stop_all(hold=True)
        for client in (old, new):
            with pytest.raises(
                ExtensionUnavailable, match=r"'fx' is stopped; start it with `mcp-supervisor start fx`$"
            ):
                instances.of(client)
        instances.resume()
        assert instances.of(old) is not first and instances.of(new) is not first
        assert len(old.callbacks) == 1  # hooked once, however many instances it had
        old.close()
        assert instances.all() == [instances.of(new)]  # old's retires (never started: gone at once)

    def test_a_connection_for_one_request_gets_no_instance(self, instances: Instances) -> None:
        """A sessionless client (2026-07-28 over HTTP) is refused, not given a one-call child."""
        with pytest.raises(ExtensionUnavailable, match="has no session") as refused:
            instances.of(_Client(lasting=False))
        assert not refused.value.retryable and instances.all() == []


class _Stopping:
    """An instance as Instances sees one, whose tree goes when the test says (:meth:`gone`)."""

    def __init__(self) -> None:
        self.state, self.calls, self.errors = State.RUNNING, 0, 0
        self._changed = anyio.Event()

    def snapshot(self) -> SimpleNamespace:
        return SimpleNamespace(state=self.state, restarts=0, unresponsive=0, memory_exceeded=0)

    def request_stop(self) -> None:
        pass  # on its way out until gone()

    def gone(self) -> None:
        self.state = State.STOPPED
        self._changed.set()

    async def wait_for(self, predicate: Callable[[Any], bool]) -> Any:
        while not predicate(self.snapshot()):
            await self._changed.wait()
        return self.snapshot()


def _made(made: list[_Stopping]) -> Callable[[object], Extension]:
    def make(client: object) -> Extension:
        made.append(_Stopping())
        return made[-1]  # type: ignore[return-value]

    return make


class TestRoom:
    @pytest.mark.anyio
    async def test_a_waiting_call_takes_the_room_of_whichever_instance_goes_first(self) -> None:
        made: list[_Stopping] = []
        instances = Instances("fx", _made(made), limit=2)
        slow, fast, waits = _Client(), _Client(), _Client()
        instances.of(slow)
        instances.of(fast)
        slow.close()
        fast.close()  # both on their way out: slow's first in line
        with pytest.raises(ExtensionUnavailable, match="all 2 per-client instances are in use"):
            instances.of(waits)
        with instances.queued(waits), fail_after(5):
            assert instances.room_coming(waits) and instances.waiting == 1
            async with anyio.create_task_group() as tg:
                tg.start_soon(instances.one_gone)
                await anyio.lowlevel.checkpoint()
                made[1].gone()  # the second goes first
            assert instances.of(waits) is made[2]
        assert instances.waiting == 0

    @pytest.mark.anyio
    async def test_a_client_whose_call_waits_already_reclaims_no_more_for_its_next(self) -> None:
        holders = [_Client(), _Client()]
        reclaimed: list[object] = []

        def reclaim(clients: Collection[object]) -> bool:
            reclaimed.append(holders[len(reclaimed)])
            holders[len(reclaimed) - 1].close()
            return True

        instances = Instances("fx", lambda client: _Stopping(), limit=2, reclaim=reclaim)  # type: ignore[arg-type,return-value]
        for holder in holders:
            instances.of(holder)
        comes = _Client()
        with instances.queued(comes):
            assert instances.room_coming(comes) and len(reclaimed) == 1
            with instances.queued(comes):  # its second call, while the first waits
                assert instances.room_coming(comes) and len(reclaimed) == 1  # the same room

    @pytest.mark.anyio
    async def test_a_waiting_call_hears_of_an_instance_that_goes_at_once(self) -> None:
        """A dormant instance (idle-stopped, never started) is gone as its client leaves: the
        call waiting for a slow one's room takes that room instead."""
        made: list[_Stopping] = []
        instances = Instances("fx", _made(made), limit=2)
        slow, dormant, waits = _Client(), _Client(), _Client()
        instances.of(slow)
        instances.of(dormant)
        made[1].gone()  # idle-stopped
        slow.close()
        with instances.queued(waits), fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(instances.one_gone)
                await anyio.lowlevel.checkpoint()
                dormant.close()
            assert instances.of(waits) is made[2]

    def test_a_client_in_line_is_served_before_one_that_comes_after(self) -> None:
        made: list[_Stopping] = []
        instances = Instances("fx", _made(made), limit=1)
        leaves, first, later = _Client(), _Client(), _Client()
        instances.of(leaves)
        leaves.close()
        with instances.queued(first):
            made[0].gone()  # room: first's, though later asks before it looks again
            with pytest.raises(ExtensionUnavailable, match="all 1 per-client instances are in use"):
                instances.of(later)
            assert instances.of(first) is made[1]

    def test_a_client_served_is_no_longer_ahead_though_its_next_call_waits(self) -> None:
        """Two calls of one client in line, and another client's behind them: once the first
        client has its instance, the room left is the other's (and a client gone is no longer
        in the way either)."""
        made: list[_Stopping] = []
        instances = Instances("fx", _made(made), limit=4)
        stays, twice, gone, between = (_Client() for _ in range(4))
        instances.of(stays)
        with instances.queued(twice), instances.queued(twice), instances.queued(gone):
            with instances.queued(between):
                assert instances.of(twice) is made[1]  # its first call; its second still in line
                gone.close()
                assert instances.of(between) is made[2]
            assert instances.waiting == 3

    def test_nothing_on_its_way_out_and_nothing_to_reclaim_is_busy_at_once(self) -> None:
        asked: list[list[object]] = []

        def reclaim(holders: Collection[object]) -> bool:
            asked.append(list(holders))
            return False

        instances = Instances("fx", lambda client: _Stopping(), limit=1, reclaim=reclaim)  # type: ignore[arg-type,return-value]
        holder = _Client()
        instances.of(holder)
        assert not instances.room_coming(_Client()) and asked == [[holder]]

    def test_a_client_that_went_gets_nothing(self) -> None:
        instances = Instances("fx", lambda client: _Stopping(), limit=1)  # type: ignore[arg-type,return-value]
        gone = _Client()
        gone.close()
        with pytest.raises(ExtensionUnavailable, match="its client is gone") as refused:
            instances.of(gone)
        assert not refused.value.retryable and instances.all() == []


class TestOperationsNoWait:
    def test_stop_no_wait_still_takes_the_instances_and_a_restart_ends_the_hold(
        self,
        ondemand: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """`stop --no-wait`: the watchers take the instances down; `restart` starts it all again."""
        daemon = ondemand({"fx": counted(short_tmp / "pids", instances="per-client")})
        daemon.wait_state("fx", "running")

        async def scenario() -> None:
            async with gateway_session(daemon.mcp_sock) as session:
                before = int(first_text(await session.call_tool("fx__pid", {})))
                stopped = await anyio.to_thread.run_sync(daemon.cli, "stop", "--no-wait", "fx")
                assert stopped.returncode == 0, stopped
                await anyio.to_thread.run_sync(lambda: until(lambda: not alive(before)))
                health = json.loads((await anyio.to_thread.run_sync(daemon.cli, "health", "--json")).stdout)
                instances = next(e for e in health["extensions"] if e["name"] == "fx")["instances"]
                assert instances["held"] and instances["totals"]["calls"] == 1
                restarted = await anyio.to_thread.run_sync(daemon.cli, "restart", "fx")
                assert restarted.returncode == 0, restarted
                after = int(first_text(await session.call_tool("fx__pid", {})))
                assert after != before and alive(after)

        anyio.run(scenario)
