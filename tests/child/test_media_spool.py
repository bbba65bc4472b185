"""The media spool end to end: real media server, real extension, real daemon, real files."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from anyio.abc import TaskGroup

from supervisor.control import client
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from supervisor.upstream.spool import Spool
from tests.harness import CLI, SERVERS, Daemon, fast_config, first_text, memory, running, zygote
from tests.harness.timing import fail_after, patience

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

MIB = 1 << 20
LIMIT = 256 * 1024


def spooled_path(block: types.ContentBlock) -> Path:
    assert isinstance(block, types.ResourceLink), block
    return Path(str(block.uri).removeprefix("file://"))


@pytest.fixture
def media_spool(tmp_path: Path) -> Spool:
    return Spool(tmp_path / "spool", instance="test", max_inline_bytes=LIMIT, max_total_bytes=64 * MIB)


@pytest.fixture
def media(media_spool: Spool, marker_prefix: str) -> Extension:
    return Extension(
        "media",
        fast_config("media.py"),
        environ=dict(os.environ),
        marker_prefix=marker_prefix,
        spool=media_spool.for_extension("media"),
    )


async def expected_sha256(ext: Extension, **arguments: Any) -> str:
    return first_text(await ext.call_tool("sha256", arguments))


class TestThroughAnExtension:
    async def test_a_5_mib_image_arrives_as_a_link_to_its_bytes(
        self, media: Extension, task_group: TaskGroup
    ) -> None:
        """The image becomes a resource_link whose file holds exactly the bytes the server sent."""
        await running(media, task_group)
        result = await media.call_tool("image", {"bytes": 5 * MIB, "seed": 3})
        text, link = result.content
        assert isinstance(text, types.TextContent) and text.text == f"raw={5 * MIB}"
        assert isinstance(link, types.ResourceLink) and link.mime_type == "image/png" and link.size == 5 * MIB
        data = spooled_path(link).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) == 5 * MIB
        digest = await expected_sha256(media, bytes=5 * MIB, seed=3)
        assert hashlib.sha256(data).hexdigest() == digest == (link.meta or {})["sha256"]
        await media.stop()

    async def test_mixed_content_keeps_order_and_small_items(
        self, media: Extension, task_group: TaskGroup
    ) -> None:
        """Only the oversized image, audio and blob move; everything else stays, in order."""
        await running(media, task_group)
        result = await media.call_tool("mixed", {"bytes": LIMIT + 1})
        kinds = [block.type for block in result.content]
        assert kinds == [
            "text",
            "resource_link",
            "text",
            "resource",
            "image",
            "resource_link",
            "resource_link",
            "resource_link",
        ]
        assert [
            (b.meta or {}).get("originalType") for b in result.content if isinstance(b, types.ResourceLink)
        ] == [
            "image",
            "audio",
            "resource",
            None,  # the server's own link passes through
        ]
        assert result.structured_content == {"ok": True}
        await media.stop()

    async def test_boundary_through_the_whole_path(self, media: Extension, task_group: TaskGroup) -> None:
        """Exactly max_inline_bytes arrives inline; one byte more arrives as a link."""
        await running(media, task_group)
        inline = await media.call_tool("image", {"bytes": LIMIT})
        spooled = await media.call_tool("image", {"bytes": LIMIT + 1})
        assert isinstance(inline.content[1], types.ImageContent)
        assert isinstance(spooled.content[1], types.ResourceLink)
        await media.stop()

    async def test_bad_base64_passes_through(self, media: Extension, task_group: TaskGroup) -> None:
        """Undecodable data stays inline and the call still succeeds."""
        await running(media, task_group)
        result = await media.call_tool("bad_base64", {})
        assert isinstance(result.content[0], types.ImageContent)
        await media.stop()

    async def test_files_survive_a_crash_restart_and_go_on_stop(
        self, media: Extension, media_spool: Spool, task_group: TaskGroup
    ) -> None:
        """Links stay valid across a crash-restart; stopping the extension removes its directory."""
        await running(media, task_group)
        path = spooled_path((await media.call_tool("image", {"bytes": LIMIT + 1})).content[1])
        pid = media.snapshot().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with fail_after(10):
            await media.wait_for(lambda s: s.state is State.RUNNING and s.pid != pid)
        assert path.exists()
        await media.stop()
        assert not path.parent.exists() and media_spool.stats().files == 0


@pytest.fixture
def daemon(
    daemons: Callable[..., Daemon], short_tmp: Path
) -> Callable[..., tuple[subprocess.Popen[bytes], str]]:
    """Start a daemon serving tests/servers/media.py with these spool settings: (process, socket)."""

    def start(**spool: Any) -> tuple[subprocess.Popen[bytes], str]:
        extensions = {"media": {"command": sys.executable, "args": [str(SERVERS / "media.py")]}}
        started = daemons(extensions, settings={"spool": {"dir": str(short_tmp / "spool"), **spool}})
        assert started.proc is not None
        return started.proc, started.socket

    return start


async def wait_running(sock: str) -> None:
    with fail_after(30):  # an SDK server's start, two suites at once: 20 s was missed (pair 3)
        while True:
            try:
                records = (await client.request(sock, "status"))["extensions"]
                if records and all(r["state"] == "running" for r in records):
                    return
            except client.DaemonUnreachable:
                pass
            await anyio.sleep(0.05)


class TestThroughTheDaemon:
    async def test_100_calls_of_1_mib_leave_memory_flat_and_the_spool_within_quota(
        self, daemon: Callable[..., tuple[subprocess.Popen[bytes], str]], short_tmp: Path
    ) -> None:
        """100 calls of 1 MiB images: RSS grows < 16 MiB after warm-up; the spool holds 40 files.

        The bound: one payload held by mistake per call would be 80 x 1 MiB = 80 MiB, one
        held at a time about 2.5 MiB (the line plus its parsed string); 16 MiB leaves room for
        allocator noise while failing on any per-call retention. The quota holds more than a
        second of calls: files younger than a second are never evicted (their links are new).
        (bench/media.py measures 20 MiB images, more and longer.)
        """
        size = MIB
        proc, sock = daemon(max_total_bytes=40 * size)
        await wait_running(sock)

        async def call() -> dict[str, Any]:
            args = {"name": "media", "tool": "image", "arguments": {"bytes": size}}
            return await client.request(sock, "call", args, timeout=60)

        for _ in range(20):
            await call()
        warm = memory(proc.pid)
        for _ in range(80):
            reply = await call()
            assert reply["content"][1]["type"] == "resource_link"
        growth = memory(proc.pid) - warm
        files = list((short_tmp / "spool").rglob("*.png"))
        assert len(files) == 40 and sum(f.stat().st_size for f in files) == 40 * size
        assert growth < 16 * MIB, f"daemon RSS grew {growth / MIB:.1f} MiB over 80 calls"
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(proc.wait) == 0
        assert list((short_tmp / "spool").iterdir()) == []  # the run directory is gone at exit

    async def test_cli_prints_a_spooled_item_as_path_type_and_size(
        self, daemon: Callable[..., tuple[subprocess.Popen[bytes], str]], short_tmp: Path
    ) -> None:
        """`call` shows the file path, the type and the size; `--json` the result as returned."""
        proc, sock = daemon()
        await wait_running(sock)
        argv = [*CLI, "call", "media", "image", "--args", '{"bytes": 1048576}', "--socket", sock]

        async def run(*extra: str) -> str:
            done = await anyio.to_thread.run_sync(lambda: zygote.run([*argv, *extra], timeout=patience(60)))
            assert done.returncode == 0, done.stderr
            return done.stdout

        line = (await run()).splitlines()[1]
        path, details = line.split("  ", 1)
        assert (await anyio.Path(path).stat()).st_size == MIB
        assert details == "[image/png, 1.0 MiB, spooled image]"
        raw = json.loads(await run("--json"))
        assert raw["content"][1]["type"] == "resource_link" and raw["content"][1]["size"] == MIB
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(proc.wait) == 0

    async def test_start_sweeps_the_spool_of_a_killed_daemon(
        self, daemon: Callable[..., tuple[subprocess.Popen[bytes], str]], short_tmp: Path
    ) -> None:
        """A SIGKILLed daemon's spool files are removed by the next daemon on the same socket."""
        proc, sock = daemon()
        await wait_running(sock)
        await client.request(sock, "call", {"name": "media", "tool": "image", "arguments": {"bytes": MIB}})
        leftover = next((short_tmp / "spool").iterdir())
        proc.kill()
        proc.wait()
        successor, sock = daemon()
        await wait_running(sock)
        assert not leftover.exists()
        successor.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(successor.wait) == 0
