"""Smoke tests for tests/servers/media.py through the SDK's own stdio client."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import random
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.harness.timing import fail_after

MEDIA = Path(__file__).parent / "servers" / "media.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def media_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    """An initialized SDK session with the media fixture (its stderr goes to a file)."""
    params = StdioServerParameters(command=sys.executable, args=[str(MEDIA)], env=dict(os.environ))
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            with fail_after(5):
                await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, arguments: dict[str, Any] | None = None) -> Any:
    with fail_after(5):
        result = await session.call_tool(tool, arguments or {})
    assert not result.is_error, result.content
    return result


def expected(header: bytes, n: int, seed: int = 0) -> bytes:
    return header[:n] + random.Random(seed).randbytes(n - len(header[:n]))


async def test_image_has_exact_size_and_deterministic_bytes(tmp_path: Path) -> None:
    async with media_session(tmp_path) as session:
        result = await call(session, "image", {"bytes": 1000})
        seeded = await call(session, "image", {"bytes": 1000, "seed": 7, "mime": "image/x-test"})
    text, image = result.content
    assert (text.type, text.text) == ("text", "raw=1000")
    assert (image.type, image.mime_type) == ("image", "image/png")
    data = base64.b64decode(image.data, validate=True)
    assert len(data) == 1000
    assert data.startswith(PNG_SIGNATURE)
    assert data == expected(PNG_SIGNATURE, 1000)
    assert seeded.content[1].mime_type == "image/x-test"
    assert base64.b64decode(seeded.content[1].data) == expected(PNG_SIGNATURE, 1000, seed=7)


async def test_mixed_has_every_block_in_order(tmp_path: Path) -> None:
    async with media_session(tmp_path) as session:
        result = await call(session, "mixed", {"bytes": 300})
        digest = await call(session, "sha256", {"bytes": 300, "kind": "blob"})
    content = result.content
    assert [block.type for block in content] == [
        "text", "image", "text", "resource", "image", "audio", "resource", "resource_link",
    ]  # fmt: skip
    before, big, middle, embedded, small, audio, blob, link = content
    assert (before.text, middle.text) == ("before", "middle")
    assert base64.b64decode(big.data) == expected(PNG_SIGNATURE, 300)
    assert (str(embedded.resource.uri), embedded.resource.mime_type) == ("file:///a.txt", "text/plain")
    assert embedded.resource.text == "hello"
    assert base64.b64decode(small.data) == expected(PNG_SIGNATURE, 16)
    audio_bytes = base64.b64decode(audio.data)
    assert audio.mime_type == "audio/wav"
    assert (len(audio_bytes), audio_bytes[:4], audio_bytes[8:12]) == (300, b"RIFF", b"WAVE")
    assert str(blob.resource.uri) == "file:///fixture/blob.bin"
    assert blob.resource.mime_type == "application/octet-stream"
    blob_bytes = base64.b64decode(blob.resource.blob)
    assert blob_bytes == expected(b"", 300)
    assert digest.content[0].text == hashlib.sha256(blob_bytes).hexdigest()
    assert (str(link.uri), link.name) == ("file:///x", "x")
    assert result.structured_content == {"ok": True}


async def test_bad_base64_is_not_decodable(tmp_path: Path) -> None:
    async with media_session(tmp_path) as session:
        result = await call(session, "bad_base64")
    (image,) = result.content
    assert (image.type, image.mime_type) == ("image", "image/png")
    assert len(image.data) >= 400_000
    with pytest.raises(binascii.Error):
        base64.b64decode(image.data, validate=True)
