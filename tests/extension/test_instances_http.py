"""Per-client instances over streamable HTTP: one child per MCP session, gone with the session."""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from supervisor.config.settings import Settings
from supervisor.daemon import root as daemon_module
from supervisor.gateway.http import HttpLimits, serve_http
from supervisor.process import children as process
from tests.harness import Daemon, Streams, alive, counted, eventually, first_text, spawns, until

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
        async with Client(http.url + "/mcp", mode="legacy") as stays:
            first = await _pid(stays)
            async with Client(http.url + "/mcp", mode="legacy") as leaves:
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
        async with Client(http.url + "/mcp", mode="legacy") as waits:
            async with Client(http.url + "/mcp", mode="legacy") as first:
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
        async with Client(http.url + "/mcp", mode="2026-07-28") as modern:
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
        async with Client(http.url + "/mcp", mode="legacy") as stays:
            mine = await _pid(stays)
            async with Client(http.url + "/mcp", mode="legacy") as leaves:
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
        settings = Settings.model_validate(
            {
                "socket": str(short_tmp / "control.sock"),
                "spool": {"dir": str(short_tmp / "spool")},
                "extensions": {"fx": counted(short_tmp / "pids", instances="per-client")},
            }
        )
        async with anyio.create_task_group() as tg:
            daemon = daemon_module.Daemon(settings, tg=tg, environ=os.environ)
            await tg.start(daemon.gateway.run)
            serve = functools.partial(
                serve_http,
                daemon.gateway,
                host="127.0.0.1",
                port=0,
                token=None,
                metrics=str,
                health=dict,
                limits=HttpLimits(session_idle=0.5),
            )
            port = (await tg.start(serve)).port
            try:
                assert (await daemon.start("fx")).state.value == "running"
                async with (
                    streamable_http_client(
                        f"http://127.0.0.1:{port}/mcp", terminate_on_close=False
                    ) as streams,
                    Client(Streams(streams), mode="legacy") as client,
                ):
                    pid = await _pid(client)
                assert alive(pid) and _pids_in(daemon) == [pid]  # no DELETE: the session is still open
                await eventually(lambda: not alive(pid) and _pids_in(daemon) == [], within=10)
            finally:
                with anyio.CancelScope(shield=True):
                    await daemon.stop_all()
                tg.cancel_scope.cancel()
        assert not process.find_marked(daemon.marker_prefix)


def _pids_in(daemon: daemon_module.Daemon) -> list[int | None]:
    return [i.pid for i in daemon.status("fx")[0].instances]
