"""Published servers under the daemon: running, listed through the gateway, callable, stopped whole.

Each runs as the installed binary and through its wrapper (``npx -y`` spawns ``sh`` and then
``node``; ``uvx`` spawns ``uv`` and then ``python``): the tree recorded while it runs must be
gone, every process of it, once ``stop`` returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import psutil
import pytest

from tests.harness import gateway_session

from .conftest import Interop, reachable

pytestmark = [
    pytest.mark.interop,
    pytest.mark.anyio,
    pytest.mark.timeout(300),  # the first test also pays for the session's installs
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


@dataclass(frozen=True)
class Case:
    name: str
    tools: set[str]  # some of the tools it must list
    call: str  # a harmless tool
    arguments: dict[str, Any]  # "{files}" in a value stands for the directory the servers may read
    check: Callable[[str, Interop], bool]
    wrapper: tuple[str, ...] = ()  # process names its tree must contain (npx: npm exec, sh, node)
    then: tuple[str, dict[str, Any]] | None = field(default=None)  # a second call


def _listed_dir(text: str, interop: Interop) -> bool:
    return str(interop.work / "files") in text


def _graph_has_entity(text: str, interop: Interop) -> bool:
    return "interop-entity" in text and "seen by the interop test" in text


def _utc_time(text: str, interop: Interop) -> bool:
    return json.loads(text)["timezone"] == "UTC"


ENTITY = {"name": "interop-entity", "entityType": "test", "observations": ["seen by the interop test"]}
FS_TOOLS = {"read_text_file", "list_allowed_directories", "list_directory"}
MEMORY_TOOLS = {"create_entities", "read_graph", "search_nodes"}

CASES = [
    Case("everything", {"echo", "get-sum"}, "echo", {"message": "hi"}, lambda t, i: t == "Echo: hi"),
    Case("filesystem", FS_TOOLS, "list_allowed_directories", {}, _listed_dir),
    Case(
        "memory",
        MEMORY_TOOLS,
        "create_entities",
        {"entities": [ENTITY]},
        lambda t, i: "interop-entity" in t,
        then=("read_graph", {}),
    ),
    Case(
        "npx-everything",
        {"echo"},
        "echo",
        {"message": "via npx"},
        lambda t, i: t == "Echo: via npx",
        wrapper=("npm", "sh", "node"),
    ),
    Case(
        "npx-filesystem",
        FS_TOOLS,
        "read_text_file",
        {"path": "{files}/hello.txt"},
        lambda t, i: t.strip() == "hello from the interop test",
        wrapper=("npm", "sh", "node"),
    ),
    Case(
        "npx-memory",
        MEMORY_TOOLS,
        "create_entities",
        {"entities": [ENTITY]},
        lambda t, i: "interop-entity" in t,
        wrapper=("npm", "sh", "node"),
        then=("read_graph", {}),
    ),
    Case(  # a first start: an empty npm cache, network outbound (TCP connect only)
        "npx-cold",
        MEMORY_TOOLS,
        "create_entities",
        {"entities": [ENTITY]},
        lambda t, i: "interop-entity" in t,
        wrapper=("npm", "sh", "node"),
        then=("read_graph", {}),
    ),
    Case(
        "time",
        {"get_current_time", "convert_time"},
        "get_current_time",
        {"timezone": "UTC"},
        _utc_time,
        wrapper=("uv", "python"),  # uvx execs `uv tool uvx`, which spawns the tool's python
    ),
]


def tree_of(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_runs_lists_calls_and_stops_whole(interop: Interop, case: Case) -> None:
    """Running, its tools under its prefix on the gateway, a call answered, no process left after stop."""
    record = interop.ensure_running(case.name)
    tree = tree_of(record["pid"])
    names = {p.name() for p in tree}
    for wrapper in case.wrapper:
        assert any(name.startswith(wrapper) for name in names), names
    assert len(tree) >= len(case.wrapper), names

    async with gateway_session(interop.mcp_sock) as session:
        listed = {t.name for t in (await session.list_tools()).tools}
        prefixed = {f"{case.name}__{tool}" for tool in case.tools}
        assert prefixed <= listed, sorted(listed)
        files = str(interop.work / "files")
        arguments = {
            k: v.replace("{files}", files) if isinstance(v, str) else v for k, v in case.arguments.items()
        }
        answer = text_of(await session.call_tool(f"{case.name}__{case.call}", arguments))
        assert case.check(answer, interop), answer
        if case.then is not None:
            tool, arguments = case.then
            answer = text_of(await session.call_tool(f"{case.name}__{tool}", arguments))
            assert _graph_has_entity(answer, interop), answer

    stopped = interop.daemon.cli("stop", case.name)
    assert stopped.returncode == 0, stopped.stderr
    assert interop.daemon.status()[case.name]["state"] == "stopped"
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.name()) for p in alive]


async def test_server_filesystem_is_refused_outside_its_grant(interop: Interop) -> None:
    """Given two directories and granted one: the kernel hides the other from it (it says so in
    its log and drops it), so it serves and writes the granted one and nothing outside."""
    interop.ensure_running("fs-confined")
    files, outside = interop.work / "files", interop.work / "outside"
    async with gateway_session(interop.mcp_sock) as session:
        allowed = text_of(await session.call_tool("fs-confined__list_allowed_directories", {}))
        assert str(files) in allowed and str(outside) not in allowed
        written = {"path": str(files / "new.txt"), "content": "written while confined"}
        text_of(await session.call_tool("fs-confined__write_file", written))
        refused = await session.call_tool(
            "fs-confined__read_text_file", {"path": str(outside / "secret.txt")}
        )
        assert refused.is_error
    assert (files / "new.txt").read_text() == "written while confined"
    logs = interop.daemon.cli("logs", "fs-confined", "-n", "50").stdout
    assert f"Cannot access directory {outside}" in logs, logs


def test_an_unreachable_registry_is_named() -> None:
    """The probe that decides a skip returns the reason, quickly, when nothing answers."""
    why = reachable("http://127.0.0.1:9/")  # the discard port: refused at once
    assert why is not None and "127.0.0.1:9" in why
