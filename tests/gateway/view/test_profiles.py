"""Client views end to end: tool filters, profiles over mcp.sock, `connect --profile` and /mcp/NAME,
reload of a profile, budget warnings, and search mode, on a real daemon with real fixture servers.

The extension named ``echo`` is ``quick.py`` (four tools) where only its names matter, and the
SDK's ``echo.py`` where a real SDK server is the point (search mode's forwarded errors): an SDK
fixture's start is 1.7 s of CPU."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, ClientSession, MCPError, StdioServerParameters, stdio_client

from tests.harness import (
    CLI,
    ECHO,
    RICH,
    SERVERS,
    Daemon,
    eventually,
    extension_settings,
    first_text,
    gateway_session,
    until,
)
from tests.harness.daemon import TOKEN
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

QUICK = extension_settings("quick.py")  # echo, crash, pid, sleep
RICH_TOOLS = 15  # tests/servers/rich.py offers this many
PROFILES = {
    "echo-only": {"extensions": ["echo"]},
    "readonly": {"tools": {"deny": ["*crash*", "*sleep*", "rich__wait"]}},
    "finder": {"mode": "search"},
}


def names(result: types.ListToolsResult) -> set[str]:
    return {t.name for t in result.tools}


def connect_params(daemon: Daemon, *extra: str) -> StdioServerParameters:
    command = [sys.executable, "-m", "supervisor", "connect", "--socket", daemon.socket, *extra]
    return StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))


def http_url(daemon: Daemon) -> str:
    def listening() -> list[dict[str, Any]]:
        return [e for e in daemon.events() if e.get("event") == "gateway.http_listening"]

    until(lambda: bool(listening()))
    return listening()[0]["url"]


class TestFilters:
    async def test_a_filtered_tool_is_neither_listed_nor_callable_but_the_operator_reaches_it(
        self,
        gateway,
    ) -> None:
        daemon = gateway({"echo": {**QUICK, "tools": {"deny": ["crash", "s*"]}}})
        async with gateway_session(daemon.mcp_sock) as session:
            listed = names(await session.list_tools())
            assert listed == {"echo__echo", "echo__pid"}
            with pytest.raises(MCPError) as caught:
                await session.call_tool("echo__sleep", {"seconds": 0})
            message = str(caught.value)
            assert "'sleep' of extension 'echo' is hidden" in message and "deny ['crash', 's*']" in message
            assert "mcp-supervisor call echo sleep" in message
            with pytest.raises(MCPError, match="unknown tool"):  # a name nobody has: not blamed on a filter
                await session.call_tool("echo__nothing", {})
        operator = await anyio.to_thread.run_sync(
            daemon.cli, "call", "echo", "sleep", "--args", '{"seconds": 0}'
        )
        assert operator.returncode == 0 and "slept" in operator.stdout


class TestProfiles:
    async def test_a_profile_over_the_socket_sees_its_extensions_and_tools_only(self, gateway) -> None:
        daemon = gateway({"rich": RICH, "echo": QUICK}, profiles=PROFILES)
        path = daemon.mcp_sock
        async with gateway_session(path) as everything:
            all_tools = names(await everything.list_tools())
        assert {"rich__echo", "echo__echo", "echo__crash"} <= all_tools
        async with gateway_session(path, profile="echo-only") as session:
            tools = names(await session.list_tools())
            assert tools == {n for n in all_tools if n.startswith("echo__")}
            assert (await session.list_prompts()).prompts == []  # rich's prompt is not in this view
            assert (await session.list_resources()).resources == []
            assert first_text(await session.call_tool("echo__echo", {"text": "hi"})) == "hi"
            with pytest.raises(MCPError, match="extension 'rich' is not in profile 'echo-only'"):
                await session.call_tool("rich__echo", {"text": "no"})
            with pytest.raises(MCPError, match="not in profile 'echo-only'"):
                await session.get_prompt("rich__greet", {"name": "x"})
            with pytest.raises(MCPError, match="not in profile 'echo-only'"):
                await session.read_resource("mcp-supervisor://rich/note://a")
        async with gateway_session(path, profile="readonly") as session:
            tools = names(await session.list_tools())
            assert "echo__echo" in tools and "rich__echo" in tools
            assert not {"echo__crash", "echo__sleep", "rich__crash", "rich__wait"} & tools
            with pytest.raises(MCPError, match=r"profile 'readonly' denies \['\*crash\*'\]"):
                await session.call_tool("echo__crash", {})

    async def test_connect_with_a_profile_and_an_unknown_profile(self, gateway) -> None:
        daemon = gateway({"rich": RICH, "echo": QUICK}, profiles=PROFILES)
        async with (
            stdio_client(connect_params(daemon, "--profile", "echo-only")) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = names(await session.list_tools())
            assert tools and all(name.startswith("echo__") for name in tools)
            assert first_text(await session.call_tool("echo__echo", {"text": "via connect"})) == "via connect"
        unknown = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [*CLI, "connect", "--socket", daemon.socket, "--profile", "nope"],
                input="",
                capture_output=True,
                text=True,
                timeout=30,
            )
        )
        assert unknown.returncode == 2, unknown
        assert unknown.stdout == ""  # nothing reached the client's stdout
        lines = unknown.stderr.strip().splitlines()
        assert lines == ["mcp-supervisor: unknown profile 'nope' (configured: echo-only, finder, readonly)"]

    async def test_connect_keeps_its_profile_across_a_daemon_restart(self, gateway) -> None:
        """The profile line is sent again on reconnection: the restarted daemon serves the same view."""
        daemon = gateway({"rich": RICH, "echo": QUICK}, profiles=PROFILES)
        changed = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        async with (
            stdio_client(connect_params(daemon, "--profile", "echo-only")) as (read, write),
            ClientSession(read, write, message_handler=on_message) as session,
        ):
            await session.initialize()
            before = names(await session.list_tools())
            assert await anyio.to_thread.run_sync(daemon.terminate) == 0
            await anyio.to_thread.run_sync(daemon.start)
            await anyio.to_thread.run_sync(daemon.wait_state, "rich", "running")
            await anyio.to_thread.run_sync(daemon.wait_state, "echo", "running")
            with fail_after(20):
                await changed.wait()
            assert names(await session.list_tools()) == before
            with pytest.raises(MCPError, match="not in profile 'echo-only'"):
                await session.call_tool("rich__echo", {"text": "no"})

    async def test_profiles_over_http_and_an_unknown_one_is_a_404(self, gateway) -> None:
        http = {"http": {"enabled": True, "host": "127.0.0.1", "port": 0, "token": TOKEN}}
        daemon = gateway({"rich": RICH, "echo": QUICK}, profiles=PROFILES, gateway=http)
        daemon.url = (await anyio.to_thread.run_sync(http_url, daemon)).removesuffix("/mcp")
        url = daemon.url + "/mcp"
        for mode in ("legacy", "2026-07-28"):
            async with Client(daemon.mcp("/mcp/echo-only"), mode=mode) as client:
                tools = names(await client.list_tools())
                assert tools and all(name.startswith("echo__") for name in tools), mode
                assert first_text(await client.call_tool("echo__echo", {"text": mode})) == mode
                with pytest.raises(MCPError, match="not in profile 'echo-only'"):
                    await client.call_tool("rich__echo", {"text": "no"})
        async with Client(daemon.mcp(), mode="legacy") as client:  # /mcp itself: everything
            assert {"rich__echo", "echo__echo"} <= names(await client.list_tools())
        nope = functools.partial(httpx2.post, url + "/nope", json={}, headers=daemon.headers, timeout=10)
        response = await anyio.to_thread.run_sync(nope)
        assert response.status_code == 404
        assert response.json() == {
            "error": "unknown profile 'nope'",
            "profiles": ["echo-only", "finder", "readonly"],
        }

    async def test_reload_applies_a_changed_profile_to_connected_clients(self, gateway) -> None:
        daemon = gateway({"rich": RICH, "echo": QUICK}, profiles=PROFILES)
        changed = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        async with gateway_session(
            daemon.mcp_sock, profile="echo-only", message_handler=on_message
        ) as session:
            assert "rich__echo" not in names(await session.list_tools())
            config = json.loads(daemon.config.read_text())
            config["profiles"]["echo-only"] = {"extensions": ["rich"], "tools": {"allow": ["*echo*"]}}
            daemon.config.write_text(json.dumps(config))
            report = await anyio.to_thread.run_sync(daemon.cli, "reload", "--json")
            assert report.returncode == 0, report.stderr
            assert json.loads(report.stdout)["restarted"] == []  # no extension was touched
            with fail_after(10):
                await changed.wait()
            assert names(await session.list_tools()) == {"rich__echo"}
            changed = anyio.Event()
            del config["profiles"]["echo-only"]  # removed while this client uses it
            daemon.config.write_text(json.dumps(config))
            assert (await anyio.to_thread.run_sync(daemon.cli, "reload")).returncode == 0
            with fail_after(10):
                await changed.wait()
            assert names(await session.list_tools()) == set()
            with pytest.raises(MCPError, match="profile 'echo-only' is no longer configured"):
                await session.call_tool("rich__echo", {"text": "gone"})


class TestBudget:
    async def test_a_view_over_its_budget_is_warned_about_once_and_shown(self, gateway) -> None:
        profiles = {
            "small": {"extensions": ["echo"], "max_tools": 3},
            "finder": {"mode": "search", "max_tools": 3},
        }
        daemon = gateway({"echo": RICH}, profiles=profiles)

        def warnings() -> list[dict[str, Any]]:
            return [e for e in daemon.events() if e.get("event") == "gateway.view_over_budget"]

        until(lambda: bool(warnings()))
        assert [(w["profile"], w["tools"], w["max_tools"]) for w in warnings()] == [("small", RICH_TOOLS, 3)]
        status = json.loads((await anyio.to_thread.run_sync(daemon.cli, "status", "--json")).stdout)
        by_name = {p["name"]: p for p in status["profiles"]}
        assert by_name[None] == {
            "name": None,
            "mode": "list",
            "extensions": None,
            "tools": RICH_TOOLS,
            "listed": RICH_TOOLS,
            "max_tools": 128,
            "over_budget": False,
        }
        assert by_name["small"]["over_budget"] and by_name["small"]["listed"] == RICH_TOOLS
        finder = by_name["finder"]
        assert finder["listed"] == 3 and finder["tools"] == RICH_TOOLS  # search: 3 meta-tools
        assert not by_name["finder"]["over_budget"]
        table = (await anyio.to_thread.run_sync(daemon.cli, "status")).stdout
        assert "small      list    15     15      3    over budget: a client that takes 3 drops 12" in table
        tools = (await anyio.to_thread.run_sync(daemon.cli, "tools")).stdout
        assert "PROFILE" in tools and "finder" in tools
        async with gateway_session(daemon.mcp_sock) as session:  # a list_changed: no new warning
            await session.call_tool("echo__toggle_tool", {})
            await eventually(lambda: daemon.status()["echo"]["tools"] == RICH_TOOLS + 1)
        until(lambda: len(warnings()) == 2)  # a change of count: warned again, once
        assert warnings()[-1]["tools"] == RICH_TOOLS + 1


class TestSearchMode:
    async def test_three_meta_tools_that_search_describe_and_call(self, gateway) -> None:
        daemon = gateway({"rich": RICH, "echo": ECHO}, profiles=PROFILES)
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async with gateway_session(daemon.mcp_sock, profile="finder") as session:
            listed = (await session.list_tools()).tools
            assert [t.name for t in listed] == ["search_tools", "describe_tool", "call_tool"]
            found = await session.call_tool("search_tools", {"query": "report progress", "limit": 3})
            assert not found.is_error and found.structured_content is not None
            hits = found.structured_content["tools"]
            assert hits[0]["name"] == "rich__progress" and "inputSchema" in hits[0] and len(hits) <= 3
            assert json.loads(first_text(found)) == found.structured_content
            described = await session.call_tool("describe_tool", {"name": "rich__echo"})
            assert described.structured_content is not None
            assert described.structured_content["outputSchema"]["properties"]["text"] == {"type": "string"}
            called = await session.call_tool(
                "call_tool",
                {"name": "rich__progress", "arguments": {"steps": 2}},
                progress_callback=on_progress,
            )
            assert not called.is_error and progress == [1, 2]  # forwarded like a direct call
            echoed = await session.call_tool("call_tool", {"name": "echo__echo", "arguments": {"text": "x"}})
            assert first_text(echoed) == "x"
            with pytest.raises(MCPError) as direct:
                await session.call_tool("echo__fail", {})  # a direct call still works in search mode
            with pytest.raises(MCPError) as meta:
                await session.call_tool("call_tool", {"name": "echo__fail", "arguments": {}})
            assert str(meta.value) == str(direct.value) == "echo: boom"  # the child's error, as a direct call
            missing = await session.call_tool("call_tool", {"name": "call_tool", "arguments": {}})
            assert missing.is_error and "no tool named 'call_tool'" in first_text(missing)
        async with gateway_session(daemon.mcp_sock) as session:  # not a meta-tool outside search mode
            with pytest.raises(MCPError, match="unknown tool"):
                await session.call_tool("search_tools", {"query": "x"})

    async def test_finding_the_right_tool_among_500(self, gateway) -> None:
        """Natural requests against 504 realistic tools in four servers: hit rate at 1 and at 5."""
        sys.path.insert(0, str(SERVERS))
        import toolbank

        extensions = {
            group: extension_settings("many.py", group) for group in ("dev", "cloud", "office", "data")
        }
        daemon = gateway(extensions, profiles={"finder": {"mode": "search"}})
        assert sum(daemon.status()[g]["tools"] for g in extensions) == 504
        hits_at_1 = hits_at_5 = 0
        async with gateway_session(daemon.mcp_sock, profile="finder") as session:
            for query, wanted in toolbank.QUERIES:
                found = await session.call_tool("search_tools", {"query": query, "limit": 5})
                assert found.structured_content is not None
                ranked = [hit["name"].partition("__")[2] for hit in found.structured_content["tools"]]
                hits_at_1 += ranked[:1] == [wanted]
                hits_at_5 += wanted in ranked
            top = (
                await session.call_tool("search_tools", {"query": toolbank.QUERIES[0][0], "limit": 1})
            ).content
            name = json.loads(top[0].text)["tools"][0]["name"]  # type: ignore[union-attr]
            called = await session.call_tool(
                "call_tool", {"name": name, "arguments": {"fields": {"title": "t"}}}
            )
            assert first_text(called) == 'called github_create_pull_request {"fields": {"title": "t"}}'
        total = len(toolbank.QUERIES)
        print(f"search: {total} queries, hit@1 {hits_at_1 / total:.2f}, hit@5 {hits_at_5 / total:.2f}")
        assert hits_at_1 / total >= 0.65 and hits_at_5 / total >= 0.85
