"""On-demand extensions: lazy start, the saved catalog, idle stop. A real daemon and real children."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from pydantic import ValidationError

from supervisor.config.settings import StdioConfig
from supervisor.extension.demand import BUSY_RECHECK, idle_wait
from supervisor.extension.saved import MAX_BYTES, CatalogStore, changed_parts, fingerprint, prune
from supervisor.paths import default_state_root
from supervisor.upstream.listing import Listing
from tests.harness import (
    Daemon,
    alive,
    counted,
    extension_settings,
    first_text,
    gateway_session,
    spawns,
    until,
)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),  # our test client: handshake era
]

TOOL = types.Tool(name="echo", description="Echo.", input_schema={"type": "object"})


def dormant(record: dict[str, Any]) -> bool:
    return record["state"] == "stopped" and record["detail"] == "on demand"


def learned_and_idle(record: dict[str, Any]) -> bool:
    """Dormant after its first run: its tools are known (before that run it is dormant knowing none)."""
    return dormant(record) and record["tools"] > 0


# ---- pure parts ----------------------------------------------------------------------------


def test_idle_wait_counts_from_the_last_call_and_never_stops_a_busy_one() -> None:
    assert idle_wait(now=10.0, last_active=8.0, idle=5.0, busy=False) == 3.0
    assert idle_wait(now=13.0, last_active=8.0, idle=5.0, busy=False) is None
    assert idle_wait(now=100.0, last_active=8.0, idle=5.0, busy=True) == 5.0
    assert idle_wait(now=100.0, last_active=8.0, idle=0.0, busy=True) == BUSY_RECHECK  # never a spin
    assert idle_wait(now=8.0, last_active=8.0, idle=0.0, busy=False) is None


def test_on_demand_with_an_explicit_autostart_is_a_config_error() -> None:
    base = extension_settings("quick.py")
    with pytest.raises(ValidationError, match="not both"):
        StdioConfig.model_validate({**base, "on_demand": True, "autostart": True})
    assert not StdioConfig.model_validate({**base, "on_demand": True, "autostart": False}).autostart
    assert StdioConfig.model_validate({**base, "on_demand": True}).on_demand
    for bad in (0, -1, 86_401):
        with pytest.raises(ValidationError, match="idle_stop"):
            StdioConfig.model_validate({**base, "idle_stop": bad})


def test_the_state_root_follows_systemd_then_xdg_then_home() -> None:
    assert default_state_root({"STATE_DIRECTORY": "/var/lib/x:/var/lib/y"}) == Path("/var/lib/x")
    assert default_state_root({"XDG_STATE_HOME": "/s"}) == Path("/s/mcp-supervisor")
    assert default_state_root({}) == Path.home() / ".local" / "state" / "mcp-supervisor"


class TestCatalogStore:
    def test_the_fingerprint_is_what_the_extension_runs_with_not_the_daemons_environment(self) -> None:
        """Command, args, its own env, cwd and grants count, each by name; the daemon's env does not."""
        base = {**extension_settings("quick.py"), "env": {"K": "v"}}
        first = fingerprint(StdioConfig.model_validate(base))
        with_daemon_env = {**os.environ, "PWD": "/elsewhere", "INVOCATION_ID": "2"}
        with pytest.MonkeyPatch.context() as patch:
            for key, value in with_daemon_env.items():
                patch.setenv(key, value)
            assert fingerprint(StdioConfig.model_validate(base)) == first
        changes = {
            "args": {"args": [*base["args"], "more"]},
            "env": {"env": {"K": "w"}},
            "cwd": {"cwd": "/"},
            "sandbox": {"sandbox": {"write": ["/tmp"]}},
            "command": {"command": "/bin/true"},
        }
        for part, change in changes.items():
            other = fingerprint(StdioConfig.model_validate({**base, **change}))
            assert changed_parts(first, other) == [part], part
        assert changed_parts("an older version's single hash", first) == list(first)

    def test_a_saved_listing_comes_back_whole_private_and_atomically(self, tmp_path: Path) -> None:
        directory = tmp_path / "state" / "catalogs" / "abc"
        config = StdioConfig.model_validate({**extension_settings("quick.py"), "env": {"K": "secret"}})
        store = CatalogStore(directory, "fx", fingerprint(config))
        listing = Listing.of(tools=[TOOL], prompts=[types.Prompt(name="p")])
        assert store.load() is None
        assert store.save(listing)
        assert store.load() == listing
        for level in (directory, directory.parent, directory.parent.parent):
            assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
        assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
        assert "secret" not in store.path.read_text()  # env goes in as a hash only
        assert [p.name for p in directory.iterdir()] == ["fx.json"]  # no temporary file left

    def test_corrupt_foreign_and_oversized_files_are_ignored(self, tmp_path: Path) -> None:
        store = CatalogStore(tmp_path, "fx", {"command": "a", "env": "a"})
        assert store.save(Listing.of(tools=[TOOL]))
        assert CatalogStore(tmp_path, "fx", {"command": "a", "env": "b"}).load() is None  # another env
        good = store.path.read_text()
        for text in ("{not json", "[]", json.dumps({**json.loads(good), "tools": [{"name": 5}]})):
            store.path.write_text(text)
            assert store.load() is None, text
        store.path.write_text(json.dumps({**json.loads(good), "pad": "x" * MAX_BYTES}))
        assert store.load() is None
        big = Listing.of(tools=[TOOL.model_copy(update={"description": "x" * MAX_BYTES})])
        assert not store.save(big)  # bounded on the way out too

    def test_prune_keeps_the_named_listings_and_fresh_writes_only(self, tmp_path: Path) -> None:
        for name in ("kept", "gone"):
            assert CatalogStore(tmp_path, name, {"command": "print"}).save(Listing.of(tools=[TOOL]))
        crashed, writing = tmp_path / ".gone.abc.tmp", tmp_path / ".kept.def.tmp"
        crashed.write_text("{")
        writing.write_text("{")
        os.utime(crashed, (time.time() - 3600, time.time() - 3600))
        (tmp_path / "notes.txt").write_text("not ours")
        assert sorted(prune(tmp_path, {"kept"})) == [".gone.abc.tmp", "gone.json"]
        assert sorted(p.name for p in tmp_path.iterdir()) == [".kept.def.tmp", "kept.json", "notes.txt"]
        assert prune(tmp_path / "absent", set()) == []


# ---- the daemon ----------------------------------------------------------------------------


def test_a_listing_is_learned_once_then_served_from_the_saved_catalog(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, on_demand=True)})
    until(lambda: learned_and_idle(daemon.status()["fx"]))  # one run to learn the tools, then idle
    assert len(spawns(pids)) == 1
    learned = spawns(pids)[0]
    until(lambda: not alive(learned))
    path = daemon.catalog_file("fx")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert daemon.status()["fx"]["tools"] == 4
    assert "on demand" in daemon.cli("status").stdout
    assert daemon.terminate() == 0

    daemon.start()  # same socket, same state directory: the saved catalog is used
    assert dormant(daemon.status()["fx"])

    async def list_tools() -> list[str]:
        async with gateway_session(daemon.mcp_sock) as session:
            return [tool.name for tool in (await session.list_tools()).tools]

    assert "fx__echo" in anyio.run(list_tools)
    assert json.loads(daemon.cli("tools", "fx", "--json").stdout)["tools"]
    assert len(spawns(pids)) == 1  # listed without a spawn


def test_a_daemon_started_from_elsewhere_keeps_the_saved_catalogs(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    """Another working directory (PWD) and other variables of the daemon's own: nothing ignored."""
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, on_demand=True)})
    until(lambda: learned_and_idle(daemon.status()["fx"]))
    assert daemon.terminate() == 0
    daemon.start(env={"PWD": str(short_tmp), "OLDPWD": "/", "EDITOR": "ed"})
    record = daemon.status()["fx"]
    assert dormant(record) and record["tools"] == 4, record
    assert not [e for e in daemon.events() if e.get("event") == "catalog.ignored"]
    assert len(spawns(pids)) == 1  # listed from the saved catalog, without a spawn


def test_fifty_concurrent_first_calls_cause_one_spawn(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, on_demand=True, call_timeout=20)})
    until(lambda: learned_and_idle(daemon.status()["fx"]))
    assert len(spawns(pids)) == 1

    async def fifty() -> list[str]:
        answers: list[str] = []
        async with gateway_session(daemon.mcp_sock) as session:
            assert "fx__echo" in [tool.name for tool in (await session.list_tools()).tools]  # fast path on

            async def call(i: int) -> None:
                result = await session.call_tool("fx__echo", {"text": str(i)})
                answers.append(first_text(result))

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(call, i)
        return answers

    assert sorted(anyio.run(fifty), key=int) == [str(i) for i in range(50)]
    assert len(spawns(pids)) == 2  # the learning run, then one for all fifty calls
    record = daemon.status()["fx"]
    assert record["state"] == "running" and record["pid"] == spawns(pids)[1]


def test_idle_stop_waits_out_a_long_call_then_a_call_starts_it_again(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, idle_stop=1, call_timeout=20)})  # autostarted, not on demand
    first = daemon.wait_state("fx", "running")["pid"]

    async def long_call() -> str:
        async with gateway_session(daemon.mcp_sock) as session:
            return first_text(await session.call_tool("fx__sleep", {"seconds": 3}))

    assert anyio.run(long_call) == "slept"  # three idle periods long
    assert spawns(pids) == [first]  # never stopped during the call
    until(lambda: dormant(daemon.status()["fx"]), within=5)  # a period after the call: stopped
    until(lambda: not alive(first))
    stopped = [e for e in daemon.events() if e.get("event") == "extension.idle_stop"]
    assert len(stopped) == 1

    result = daemon.cli("call", "fx", "pid", "--json")  # the control socket's call starts it too
    assert result.returncode == 0, result.stderr
    second = json.loads(result.stdout)["content"][0]["text"]
    assert spawns(pids) == [first, int(second)]
    until(lambda: dormant(daemon.status()["fx"]), within=5)  # and it idles out again


def test_a_manual_stop_is_not_undone_by_a_call(ondemand: Callable[..., Daemon], short_tmp: Path) -> None:
    pids = short_tmp / "pids"
    daemon = ondemand({"fx": counted(pids, on_demand=True)})
    until(lambda: learned_and_idle(daemon.status()["fx"]))
    assert daemon.cli("stop", "fx").returncode == 0
    record = daemon.status()["fx"]
    assert record["state"] == "stopped" and record["detail"] is None
    assert daemon.cli("call", "fx", "pid").returncode == 1
    assert len(spawns(pids)) == 1
    assert daemon.cli("start", "fx").returncode == 0  # running now; on demand again once stopped
    assert daemon.status()["fx"]["state"] == "running"


def test_a_subscription_keeps_it_running_until_its_client_leaves(
    ondemand: Callable[..., Daemon],
) -> None:
    daemon = ondemand({"rich": extension_settings("rich.py", on_demand=True, idle_stop=1)})
    until(lambda: learned_and_idle(daemon.status()["rich"]))  # learned, then idle for a second

    async def subscribed() -> int:
        async with gateway_session(daemon.mcp_sock) as session:
            await session.subscribe_resource("mcp-supervisor://rich/note://a")  # starts it
            pid = daemon.status()["rich"]["pid"]
            assert pid is not None
            deadline = anyio.current_time() + 3  # three idle periods: it must stay the whole time
            while anyio.current_time() < deadline:
                record = await anyio.to_thread.run_sync(daemon.status)
                assert record["rich"]["state"] == "running" and record["rich"]["pid"] == pid
                await anyio.sleep(0.2)
            return pid

    pid = anyio.run(subscribed)
    until(lambda: dormant(daemon.status()["rich"]), within=5)  # the client left: idle, then stopped
    until(lambda: not alive(pid))


def test_reload_learns_a_changed_command_line_and_autostart_false_waits_for_a_call(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    pids, others = short_tmp / "pids", short_tmp / "others"
    daemon = ondemand({"fx": counted(pids, on_demand=True)})
    until(lambda: learned_and_idle(daemon.status()["fx"]))
    settings = json.loads(daemon.config.read_text())
    changed = counted(pids, on_demand=True)
    changed["env"]["QUICK_STDERR_AT_START"] = "1"  # another command line: the saved listing is foreign
    settings["extensions"] = {"fx": changed, "gx": counted(others, on_demand=True, autostart=False)}
    daemon.config.write_text(json.dumps(settings))
    result = daemon.cli("reload")
    assert result.returncode == 0, result.stderr
    until(lambda: len(spawns(pids)) == 2 and dormant(daemon.status()["fx"]))  # learned again
    assert [e["reason"] for e in daemon.events() if e.get("event") == "catalog.ignored"] == [
        "another command line: its env changed"
    ]
    gx = daemon.status()["gx"]
    assert dormant(gx) and gx["tools"] == 0 and not spawns(others)  # autostart: false: no learning run
    assert daemon.cli("call", "gx", "echo", "--args", '{"text": "hi"}').returncode == 0
    assert len(spawns(others)) == 1
    assert daemon.status()["gx"]["tools"] == 4


def test_a_listing_goes_when_its_extension_leaves_the_config(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    """Saved listings do not pile up: a reload or a start drops those the config no longer names.
    An extension that is no longer on demand keeps its own: it holds the extension's gateway names."""
    daemon = ondemand(
        {
            "fx": counted(short_tmp / "fx", on_demand=True),
            "gx": counted(short_tmp / "gx", on_demand=True),
        }
    )
    until(lambda: daemon.catalog_file("fx").exists() and daemon.catalog_file("gx").exists())
    settings = json.loads(daemon.config.read_text())
    del settings["extensions"]["gx"]
    daemon.config.write_text(json.dumps(settings))
    assert daemon.cli("reload").returncode == 0
    assert not daemon.catalog_file("gx").exists() and daemon.catalog_file("fx").exists()
    assert daemon.terminate() == 0

    settings["extensions"]["fx"]["on_demand"] = False
    daemon.config.write_text(json.dumps(settings))
    daemon.start()
    daemon.wait_state("fx", "running")
    assert daemon.catalog_file("fx").exists()
    del settings["extensions"]["fx"]
    daemon.config.write_text(json.dumps(settings))
    assert daemon.cli("reload").returncode == 0
    assert not daemon.catalog_file("fx").exists()
    assert daemon.terminate() == 0


def test_clients_hear_no_list_change_when_it_starts_and_idles_out(
    ondemand: Callable[..., Daemon], short_tmp: Path
) -> None:
    daemon = ondemand({"fx": counted(short_tmp / "pids", on_demand=True, idle_stop=1)})
    until(lambda: learned_and_idle(daemon.status()["fx"]))
    daemon.wait_announced()
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            heard.append(message.method)

    async def cycle() -> None:
        async with gateway_session(daemon.mcp_sock, message_handler=on_message) as session:
            await session.list_tools()
            await session.call_tool("fx__echo", {"text": "hi"})  # starts it
            await anyio.to_thread.run_sync(lambda: until(lambda: dormant(daemon.status()["fx"]), 5))
            await anyio.sleep(0.5)  # a negative: list_changed goes out 0.1 s after a change, if any
            await session.send_ping()

    anyio.run(cycle)
    assert "notifications/tools/list_changed" not in heard, heard
