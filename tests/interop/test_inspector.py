"""A third-party client: the MCP Inspector's CLI (the TypeScript SDK) on the gateway.

Through ``connect`` (the inspector spawns ``mcp-supervisor connect --socket ...`` as its stdio
server) and over streamable HTTP (``--transport http`` to the daemon's ``/mcp``), in both
protocol eras (``--protocol-era legacy``: initialize; ``modern``: 2026-07-28). The published
``server-everything`` stands behind the gateway, so tools, resources and prompts are real.
Assertions are on the JSON the inspector prints.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .conftest import Interop

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

CONNECT = str(Path(sys.executable).with_name("mcp-supervisor"))
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EXT = "everything"


def inspect(interop: Interop, transport: str, era: str, method: str, *args: str) -> dict[str, Any]:
    """Run the inspector's CLI once; the ``result`` object it printed as JSON."""
    home = interop.work / "inspector-home"  # it keeps a catalog under ~/.mcp-inspector
    home.mkdir(exist_ok=True)
    if transport == "connect":
        target = [CONNECT, "connect", "--socket", interop.daemon.socket]
    else:
        authorization = f"Authorization: Bearer {interop.daemon.token}"
        target = [interop.http_url, "--transport", "http", "--header", authorization]
    inspector = str(interop.toolchain.bin / "mcp-inspector")
    options = ["--cli", "--format", "json", "--quiet", "--protocol-era", era]
    argv = [inspector, *options, *target, "--method", method, *args]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**env, **interop.toolchain.env}
    )
    assert done.returncode == 0, (method, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    printed = json.loads(done.stdout)
    assert "result" in printed, printed
    return printed["result"]


FULL = [("connect", "legacy"), ("http", "modern")]  # what desktop clients use, and the newest era
SMOKE = [("connect", "modern"), ("http", "legacy")]  # each CLI run costs a node start: one call each


CALLS = [(EXT, *way) for way in SMOKE] + [("remote-everything", *way) for way in (*FULL, *SMOKE)]


@pytest.mark.parametrize(("extension", "transport", "era"), CALLS)
def test_call(interop: Interop, extension: str, transport: str, era: str) -> None:
    """The TypeScript client calls a tool through the other two combinations; and a remote
    extension (server-everything over streamable HTTP) through all four."""
    interop.ensure_running(extension)
    if extension != EXT:  # the local one's listing is test_tools_resources_prompts'
        listed = inspect(interop, transport, era, "tools/list")
        assert f"{extension}__echo" in [tool["name"] for tool in listed["tools"]]
    called = inspect(
        interop, transport, era, "tools/call", "--tool-name", f"{extension}__echo", "--tool-arg", "message=hi"
    )
    assert called["content"] == [{"type": "text", "text": "Echo: hi"}], called


@pytest.mark.parametrize(("transport", "era"), FULL)
def test_tools_resources_prompts(interop: Interop, transport: str, era: str) -> None:
    """The TypeScript client lists and calls tools, lists and reads resources, lists and gets prompts."""
    interop.ensure_running(EXT)
    requests = {  # independent: two at a time, so a node start overlaps another's waiting
        "tools": ("tools/list",),
        "echo": ("tools/call", "--tool-name", f"{EXT}__echo", "--tool-arg", "message=hi"),
        "sum": ("tools/call", "--tool-name", f"{EXT}__get-sum", "--tool-arg", "a=2", "b=3"),
        "resources": ("resources/list",),
        "templates": ("resources/templates/list",),
        "prompts": ("prompts/list",),
        "prompt": ("prompts/get", "--prompt-name", f"{EXT}__simple-prompt"),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            key: pool.submit(inspect, interop, transport, era, *argv) for key, argv in requests.items()
        }
        got = {key: future.result() for key, future in futures.items()}

    names = [tool["name"] for tool in got["tools"]["tools"]]
    assert f"{EXT}__echo" in names and f"{EXT}__get-sum" in names, names
    assert all(NAME.match(name) for name in names) and names == sorted(names)
    echo = next(tool for tool in got["tools"]["tools"] if tool["name"] == f"{EXT}__echo")
    assert echo["inputSchema"]["required"] == ["message"]  # definitions pass through whole

    assert got["echo"]["content"] == [{"type": "text", "text": "Echo: hi"}], got["echo"]
    assert "5" in got["sum"]["content"][0]["text"], got["sum"]

    resources = got["resources"]["resources"]
    uris = [r["uri"] for r in resources if r["uri"].startswith(f"mcp-supervisor://{EXT}/demo://")]
    assert len(uris) >= 7, [r["uri"] for r in resources]  # its documents, under its extension
    templates = [t["uriTemplate"] for t in got["templates"]["resourceTemplates"]]
    assert f"mcp-supervisor://{EXT}/demo://resource/dynamic/text/{{resourceId}}" in templates, templates
    read = inspect(interop, transport, era, "resources/read", "--uri", uris[0])
    assert read["contents"][0]["uri"] == uris[0] and read["contents"][0]["text"], read

    prompts = [prompt["name"] for prompt in got["prompts"]["prompts"]]
    assert f"{EXT}__simple-prompt" in prompts and f"{EXT}__args-prompt" in prompts, prompts
    assert got["prompt"]["messages"][0]["content"]["type"] == "text", got["prompt"]
