"""Per-client instances over streamable HTTP: one child per MCP session, gone with the session."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from supervisor.daemon import root as daemon_module
from supervisor.gateway.http import HttpLimits
from tests.gateway.http.test_fastcalls import Raw, _message
from tests.harness import (
    Daemon,
    Streams,
    alive,
    counted,
    eventually,
    extension_settings,
    first_text,
    spawns,
    until,
)
from tests.harness.inprocess import in_process_daemon

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]


async def _pid(client: Client) -> int:
    return int(first_text(await client.call_tool("fx__pid", {})))


async def _status(http: Daemon) -> dict:
    return (await anyio.to_thread.run_sync(http.status))["fx"]


class TestSessions:
    async def test_two_sessions_two_children_and_a_closed_session_takes_its_tree(
        self,
        http_gateway: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        pids = short_tmp / "pids"
        http = http_gateway({"fx": counted(pids, instances="per-client")})
        shared = (await _status(http))["pid"]
        async with Client(http.mcp(), mode="legacy") as stays:
            first = await _pid(stays)
            async with Client(http.mcp(), mode="legacy") as leaves:
                second = await _pid(leaves)
                assert await _pid(leaves) == second  # the same session, the same child
                assert await _pid(stays) == first
                assert len({shared, first, second}) == 3
                record = await _status(http)
                assert sorted(i["pid"] for i in record["instances"]) == sorted((first, second))
            # Leaving ends the session (DELETE): its child goes, the other stays.
            await anyio.to_thread.run_sync(lambda: until(lambda: not alive(second)))
            assert alive(first) and await _pid(stays) == first
            await eventually(
                lambda: [i["pid"] for i in http.status()["fx"]["instances"]] == [first], within=10
            )
        await anyio.to_thread.run_sync(lambda: until(lambda: not alive(first)))
        # A record goes once the teardown that killed its process is done: a moment after.
        await eventually(lambda: http.status()["fx"]["instances"] == [], within=10)
        assert len(spawns(pids)) == 3

    async def test_max_instances_bounds_the_sessions_children(
        self,
        http_gateway: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        pids = short_tmp / "pids"
        http = http_gateway({"fx": counted(pids, instances="per-client", max_instances=1)})
        async with Client(http.mcp(), mode="legacy") as waits:
            async with Client(http.mcp(), mode="legacy") as first:
                mine = await _pid(first)
                refused = await waits.call_tool("fx__pid", {})
                assert refused.is_error and "all 1 per-client instances are in use" in first_text(refused)
                assert [i["pid"] for i in (await _health(http))["instances"]["each"]] == [mine]  # the bound
            await anyio.to_thread.run_sync(lambda: until(lambda: not alive(mine)))
            # The slot is free again once the daemon has seen the tree go.
            await anyio.to_thread.run_sync(lambda: until(lambda: http.status()["fx"]["instances"] == []))
            assert await _pid(waits) not in (mine, None)
        assert len(spawns(pids)) == 3  # the shared instance, then one per session


class TestSessionless:
    async def test_a_2026_request_over_http_is_refused_without_a_spawn(
        self,
        http_gateway: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """A 2026-07-28 request over HTTP has no session: no instance for one request, a clear error."""
        pids = short_tmp / "pids"
        http = http_gateway(
            {"fx": counted(pids, instances="per-client"), "shared": counted(short_tmp / "other")}
        )
        async with Client(http.mcp(), mode="2026-07-28") as modern:
            refused = await modern.call_tool("fx__pid", {})
            assert refused.is_error and "is per-client (one child per client session" in first_text(refused)
            assert not (await modern.call_tool("shared__pid", {})).is_error  # shared ones serve it
        assert len(spawns(pids)) == 1  # the shared instance only
        assert (await _status(http))["instances"] == []


class TestFigures:
    async def test_health_and_metrics_count_each_instance_and_keep_the_ended_ones(
        self,
        http_gateway: Callable[..., Daemon],
        short_tmp: Path,
    ) -> None:
        """health --json: each instance's figures; metrics: summed series, restarts of ended ones kept."""
        http = http_gateway({"fx": counted(short_tmp / "pids", instances="per-client", max_instances=3)})
        async with Client(http.mcp(), mode="legacy") as stays:
            mine = await _pid(stays)
            async with Client(http.mcp(), mode="legacy") as leaves:
                theirs = await _pid(leaves)
                os.kill(theirs, signal.SIGKILL)  # an automatic restart of that instance
                await eventually(lambda: theirs not in _instance_pids(http), within=10)
                restarted = await _pid(leaves)
                health = await _health(http)
                assert health["instances"]["count"] == 2 and health["instances"]["max"] == 3
                each = {i["pid"]: i for i in health["instances"]["each"]}
                assert set(each) == {mine, restarted}
                assert (each[mine]["calls"], each[mine]["restarts"], each[mine]["in_flight"]) == (1, 0, 0)
                assert (each[restarted]["calls"], each[restarted]["restarts"]) == (2, 1)
                assert each[mine]["resources"]["processes"] == 1
                text = (await anyio.to_thread.run_sync(http.cli, "health")).stdout
                assert "\n  fx[1]  running" in text and "\n  fx[2]  running" in text, text
                processes = 'mcp_supervisor_extension_instance_processes{extension="fx"} 2.0'
                # The restarted instance's tree is counted at the next sample of process usage.
                await eventually(lambda: processes in http.get("/metrics").text, within=10)
                metrics = (await anyio.to_thread.run_sync(http.get, "/metrics")).text
                assert 'mcp_supervisor_extension_instances{extension="fx"} 2.0' in metrics
                assert 'mcp_supervisor_extension_instances_max{extension="fx"} 3.0' in metrics
                assert 'mcp_supervisor_extension_instance_restarts_total{extension="fx"} 1.0' in metrics
            await eventually(lambda: _instance_pids(http) == [mine], within=10)
            health = await _health(http)
            assert health["instances"]["count"] == 1
            assert (
                health["instances"]["totals"]["calls"] == 3 and health["instances"]["totals"]["restarts"] == 1
            )
            metrics = (await anyio.to_thread.run_sync(http.get, "/metrics")).text
            assert 'mcp_supervisor_extension_instances{extension="fx"} 1.0' in metrics
            assert 'mcp_supervisor_extension_instance_restarts_total{extension="fx"} 1.0' in metrics  # kept
            assert 'mcp_supervisor_extension_restarts_total{extension="fx"} 0.0' in metrics  # the shared one


def _instance_pids(http: Daemon) -> list[int]:
    return [i["pid"] for i in http.status()["fx"]["instances"]]


async def _health(http: Daemon) -> dict:
    result = await anyio.to_thread.run_sync(http.cli, "health", "--json")
    assert result.returncode == 0, result.stderr
    return next(e for e in json.loads(result.stdout)["extensions"] if e["name"] == "fx")


class TestExpiry:
    async def test_a_session_left_unused_expires_and_takes_its_instance(self, short_tmp: Path) -> None:
        """A client that vanishes without DELETE: its session expires, and its child goes with it."""
        extensions = {"fx": counted(short_tmp / "pids", instances="per-client")}
        async with in_process_daemon(short_tmp, extensions, HttpLimits(session_idle=0.5)) as (daemon, url):
            async with (
                streamable_http_client(url, terminate_on_close=False) as streams,
                Client(Streams(streams), mode="legacy") as client,
            ):
                pid = await _pid(client)
            assert alive(pid) and _pids_in(daemon) == [pid]  # no DELETE: the session is still open
            await eventually(lambda: not alive(pid) and _pids_in(daemon) == [], within=10)


STUBBORN = extension_settings("stubborn.py", instances="per-client", max_instances=1, stop_timeout=0.5)
CALL_PID = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__pid","arguments":{}}}'


async def _gone(http: httpx2.AsyncClient, url: str) -> Raw:
    """A handshake-era HTTP session made of plain requests, that keeps no stream open: as a
    client that went away without DELETE looks to the daemon."""
    session = Raw(http, url)
    await session.open(list_tools=False)
    return session


async def _raw_pid(session: Raw) -> int:
    return int(_message(await session.post(CALL_PID))["result"]["content"][0]["text"])


@contextlib.asynccontextmanager
async def _one_held(
    short_tmp: Path, *, reclaim_idle: float
) -> AsyncIterator[tuple[daemon_module.Daemon, str, Raw, int]]:
    """A daemon whose one per-client instance (stubborn: slow to go) is held by a session of
    plain requests: the daemon, its URL, that session and its instance's pid."""
    limits = HttpLimits(reclaim_idle=reclaim_idle)
    async with (
        in_process_daemon(short_tmp, {"fx": STUBBORN}, limits) as (daemon, url),
        httpx2.AsyncClient(timeout=20) as http,
    ):
        holder = await _gone(http, url)
        yield daemon, url, holder, await _raw_pid(holder)


async def _refused(url: str, tool: str = "fx__pid") -> None:
    """A new client's call is refused at once: every instance is in use."""
    async with Client(url, mode="legacy") as comes:
        refused = await comes.call_tool(tool, {})
        assert refused.is_error and "all 1 per-client instances are in use" in first_text(refused)


class TestReclaim:
    """At max_instances, an HTTP session with nothing open for reclaim_idle gives up its instance."""

    async def test_a_new_client_gets_the_instance_of_a_session_gone_idle(self, short_tmp: Path) -> None:
        async with (
            _one_held(short_tmp, reclaim_idle=0) as (daemon, url, gone, theirs),
            Client(url, mode="legacy") as comes,
        ):
            mine = await _pid(comes)  # waits while the idle session's stubborn tree is killed
            assert mine != theirs and not alive(theirs)
            assert _pids_in(daemon) == [mine]
            # The session it was is ended: its client hears 404 and may open a new one.
            assert (await gone.post(CALL_PID)).status_code == 404
            assert await _pid(comes) == mine

    async def test_a_session_idle_for_less_than_reclaim_idle_keeps_it(self, short_tmp: Path) -> None:
        async with _one_held(short_tmp, reclaim_idle=60) as (daemon, url, stays, theirs):
            await _refused(url)
            assert await _raw_pid(stays) == theirs and _pids_in(daemon) == [theirs]

    async def test_a_session_with_a_stream_open_keeps_it(self, short_tmp: Path) -> None:
        """An open GET stream shows its client is there, however long it has been since a call."""
        async with _one_held(short_tmp, reclaim_idle=0) as (daemon, url, listens, theirs):
            headers = {**listens.headers, "accept": "text/event-stream"}
            async with listens.client.stream("GET", url, headers=headers) as stream:
                assert stream.status_code == 200
                await _refused(url)
                assert await _raw_pid(listens) == theirs and _pids_in(daemon) == [theirs]

    async def test_a_session_that_made_a_task_keeps_it(self, short_tmp: Path) -> None:
        """Its task's result would go with it: it is left alone, idle or not."""
        tasks = extension_settings("tasks.py", instances="per-client", max_instances=1)
        async with (
            in_process_daemon(short_tmp, {"tasks": tasks}, HttpLimits(reclaim_idle=0)) as (daemon, url),
            httpx2.AsyncClient(timeout=20) as http,
        ):
            waits = await _gone(http, url)
            params = {"name": "tasks__slow", "arguments": {"seconds": 0}, "task": {"ttl": 60000}}
            body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
            made = await waits.post(body.encode())
            assert made.status_code == 200 and "taskId" in made.text, made.text
            quick = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"tasks__quick"}}'
            assert "quick: " in (await waits.post(quick)).text  # a plain call too
            await _refused(url, "tasks__quick")
            assert len(daemon.status("tasks")[0].instances) == 1

    async def test_a_call_waiting_for_room_across_a_reload_gets_no_child_of_the_old_config(
        self, short_tmp: Path
    ) -> None:
        """The wait ends after the reload replaced the instances: the call gets an instance the
        daemon tracks, or a retryable error; never a child of the instances the reload retired."""
        config = short_tmp / "config.json"
        fx = {**STUBBORN, "stop_timeout": 1}  # a client's tree takes about 2 s to go
        async with in_process_daemon(short_tmp, {"fx": fx}, HttpLimits(), config) as (daemon, url):
            async with Client(url, mode="legacy") as leaves:
                left = await _pid(leaves)
            outcome: list[Any] = []

            async def call() -> None:
                async with Client(url, mode="legacy") as waits:
                    outcome.append(await waits.call_tool("fx__pid", {}))
                    if not outcome[0].is_error:  # while its session is open
                        outcome.append(_pids_in(daemon))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await eventually(lambda: _waiting(daemon) == 1)  # for the tree of the client that left
                changed = json.loads(await anyio.Path(config).read_text())
                changed["extensions"]["fx"]["stop_timeout"] = 0.9
                await anyio.Path(config).write_text(json.dumps(changed))
                assert (await daemon.reload())["restarted"] == ["fx"]
            assert not alive(left)
            result = outcome[0]
            if result.is_error:
                assert "reloading; try again shortly" in first_text(result), first_text(result)
            else:
                assert outcome[1] == [int(first_text(result))]  # tracked: status and stop reach it


def _waiting(daemon: daemon_module.Daemon) -> int:
    return next(e for e in daemon.health()["extensions"] if e["name"] == "fx")["instances"]["waiting"]


def _pids_in(daemon: daemon_module.Daemon) -> list[int | None]:
    return [i.pid for i in daemon.status("fx")[0].instances]
