"""Media in structured output end to end: a real daemon, the screenshot fixture, the SDK's client.

The SDK's ClientSession validates every tool result against the tool's outputSchema, so each
call here that returns at all proves the rewritten result still satisfies the schema.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from supervisor.control import client
from tests.harness import INLINE, Daemon, extension_settings, first_text, gateway_session
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

MIB = 1 << 20
SHOT = extension_settings("screenshot.py", call_timeout=30)  # a 3 MiB answer, on a loaded machine too


@pytest.fixture
def shot(gateway: Callable[..., Daemon]) -> Daemon:
    """A daemon running the screenshot fixture as extension ``shot``."""
    return gateway({"shot": SHOT})


def spooled_files(short_tmp: Path) -> list[Path]:
    return [p for p in (short_tmp / "spool").rglob("*") if p.is_file()]


async def read_back(session: Any, uri: str) -> bytes:
    read = await session.read_resource(uri)
    blob = read.contents[0]
    assert isinstance(blob, types.BlobResourceContents)
    return base64.b64decode(blob.blob)


class TestThroughTheGateway:
    async def test_a_3_mib_screenshot_costs_a_small_answer_and_one_file(
        self, shot: Daemon, short_tmp: Path
    ) -> None:
        """Content and structured copies become one file; the answer is small, valid, and reads back."""
        daemon = shot
        async with gateway_session(daemon.mcp_sock) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert tools["shot__items"].output_schema is not None  # so call_tool validates against it
            result = await session.call_tool("shot__items", {"bytes": 3 * MIB, "seed": 5})
            _, link = result.content
            assert isinstance(link, types.ResourceLink) and link.size == 3 * MIB
            assert result.structured_content == {
                "title": "shot",
                "content": [{"type": "image", "data": link.uri, "mimeType": "image/png"}],
            }
            assert len(result.model_dump_json(by_alias=True)) < 2048
            data = await read_back(session, link.uri)
            expected = first_text(await session.call_tool("shot__sha256", {"bytes": 3 * MIB, "seed": 5}))
        assert hashlib.sha256(data).hexdigest() == expected == (link.meta or {})["sha256"]
        assert len(spooled_files(short_tmp)) == 1

    @pytest.mark.parametrize("tool", ["field", "fastmcp"])
    async def test_fields_blobs_and_the_text_copy_point_at_the_same_file(
        self, shot: Daemon, short_tmp: Path, tool: str
    ) -> None:
        """data+mimeType, blob and the JSON text copy all carry the one file's URI."""
        daemon = shot
        async with gateway_session(daemon.mcp_sock) as session:
            result = await session.call_tool(f"shot__{tool}", {"bytes": MIB})
            link = result.content[-1]
            assert isinstance(link, types.ResourceLink)
            structured = result.structured_content
            assert structured is not None
            assert structured["screenshot"]["data"] == structured["file"]["blob"] == link.uri
            assert structured["file"]["uri"] == "file:///shot.png" and structured["width"] == 640
            if tool == "fastmcp":
                assert json.loads(first_text(result)) == structured
            assert len(result.model_dump_json(by_alias=True)) < 4096
            assert len(await read_back(session, structured["file"]["blob"])) == MIB
        assert len(spooled_files(short_tmp)) == 1

    async def test_a_schema_that_wants_base64_gets_it_inline(self, shot: Daemon, short_tmp: Path) -> None:
        """When the schema would reject a URI, structuredContent arrives as sent; content still moves."""
        daemon = shot
        async with gateway_session(daemon.mcp_sock) as session:
            result = await session.call_tool("shot__strict", {"bytes": 64 * 1024})
        assert isinstance(result.content[0], types.ResourceLink)
        structured = result.structured_content or {}
        assert len(base64.b64decode(structured["screenshot"]["data"], validate=True)) == 64 * 1024
        assert len(spooled_files(short_tmp)) == 1
        assert "spool.kept_inline" in [event.get("event") for event in daemon.events()]

    async def test_small_payloads_stay_inline(self, shot: Daemon, short_tmp: Path) -> None:
        """At or under max_inline_bytes nothing moves, in content or in structuredContent."""
        daemon = shot
        async with gateway_session(daemon.mcp_sock) as session:
            result = await session.call_tool("shot__items", {"bytes": INLINE})
        assert isinstance(result.content[1], types.ImageContent)
        assert result.structured_content["content"][0]["data"] == result.content[1].data  # type: ignore[index]
        assert spooled_files(short_tmp) == []

    async def test_deep_nesting_is_spooled_or_refused_never_fatal(
        self, gateway: Callable[..., Daemon], short_tmp: Path
    ) -> None:
        """Media 90 levels down is spooled; a result past the parser's depth fails its call only.

        The hostile answer cannot be parsed at all (nesting over the parser's limit of about
        200), so its call ends at call_timeout; the child and the daemon carry on.
        """
        daemon = gateway({"shot": {**SHOT, "call_timeout": 10}})  # small answers: 10 s is plenty
        pid = daemon.status()["shot"]["pid"]
        async with gateway_session(daemon.mcp_sock) as session:
            spooled = await session.call_tool("shot__deep", {"bytes": 2 * INLINE, "depth": 90})
            node = (spooled.structured_content or {})["root"]
            for _ in range(90):
                node = node["next"][0]
            assert node["data"].startswith("file:///")
            with fail_after(40):  # its call_timeout (10 s) ends it
                hostile = await session.call_tool("shot__deep", {"bytes": 2 * INLINE, "depth": 5000})
            assert hostile.is_error
            after = await session.call_tool("shot__items", {"bytes": 16})
        assert not after.is_error and daemon.status()["shot"]["pid"] == pid
        assert "extension.bad_message" in [event.get("event") for event in daemon.events()]


class TestThroughControl:
    async def test_call_returns_the_rewritten_structured_content(self, shot: Daemon, short_tmp: Path) -> None:
        """`call` over the control socket: a small reply, structured data pointing at the one file."""
        daemon = shot
        args = {"name": "shot", "tool": "items", "arguments": {"bytes": 3 * MIB}}
        reply = await client.request(daemon.socket, "call", args, timeout=30)
        link = reply["content"][1]
        assert link["type"] == "resource_link"
        assert reply["structuredContent"]["content"][0]["data"] == link["uri"]
        assert len(json.dumps(reply)) < 2048
        (path,) = spooled_files(short_tmp)
        assert path.as_uri() == link["uri"] and path.stat().st_size == 3 * MIB
