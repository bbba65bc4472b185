"""transport.py: line splitting, and what a hostile child or unencodable input cannot do to the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import psutil
import pytest
from anyio.abc import TaskGroup
from structlog.testing import capture_logs

from supervisor.child.connection import LineSplitter, connect
from supervisor.errors import CallFailed
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from supervisor.process import tree as proctree
from supervisor.process.children import spawn
from supervisor.upstream.spool import Spool
from tests.harness import eventually, fast_config, first_text, running, server_argv
from tests.harness.timing import fail_after, patience

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MakeExtension = Callable[..., Extension]


async def wait_for(ext: Extension, predicate: Callable[[Snapshot], bool], within: float) -> Snapshot:
    with fail_after(within):
        return await ext.wait_for(predicate)


class TestLineSplitter:
    def test_lines_within_and_across_chunks(self) -> None:
        """Lines may end inside a chunk or span several; order and bytes are kept."""
        splitter = LineSplitter()
        assert splitter.feed(b"one\ntw") == [b"one"]
        assert splitter.feed(b"o\nthr") == [b"two"]
        assert splitter.feed(b"ee") == []
        assert splitter.pending == 5
        assert splitter.feed(b"\n\nfour\n") == [b"three", b"", b"four"]
        assert splitter.pending == 0

    def test_a_line_in_many_chunks(self) -> None:
        """A 1 MiB line fed in 4 KiB chunks comes out whole, once."""
        splitter = LineSplitter()
        payload = bytes(range(256)).replace(b"\n", b"x") * 4096
        out = [
            line
            for start in range(0, len(payload), 4096)
            for line in splitter.feed(payload[start : start + 4096])
        ]
        assert out == [] and splitter.pending == len(payload)
        assert splitter.feed(b"\n") == [payload]

    def test_partial_line_can_be_taken_or_discarded(self) -> None:
        """An over-long or unterminated line can be handed out or dropped, leaving nothing held."""
        splitter = LineSplitter()
        splitter.feed(b"abc")
        splitter.feed(b"def")
        assert splitter.take_partial() == b"abcdef" and splitter.pending == 0
        splitter.feed(b"ghi")
        splitter.discard()
        assert splitter.pending == 0 and splitter.feed(b"\n") == [b""]


async def peak_tasks(seconds: float) -> int:
    """The most asyncio tasks alive at any 10 ms sample over *seconds* (a measuring window)."""
    peak = 0
    with anyio.move_on_after(seconds):
        while True:
            peak = max(peak, len(asyncio.all_tasks()))
            await anyio.sleep(0.01)
    return peak


class TestHostileChild:
    async def test_a_list_changed_flood_costs_one_refresh_at_a_time(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Endless tools/list_changed: refreshes are coalesced, tasks stay flat, calls are served."""
        ext = make_extension(fast_config("flood.py", "list_changed"))
        idle = len(asyncio.all_tasks())
        with capture_logs() as logs:
            await running(ext, task_group)
            peak = await peak_tasks(1.5)
            # The flood arrived (on a loaded machine perhaps only after the window above).
            await eventually(lambda: any(e["event"] == "extension.listing_changed" for e in logs), within=10)
        assert peak < idle + 100, f"{peak - idle} tasks more than idle during the flood"
        assert first_text(await ext.call_tool("echo", {"text": "served"})) == "served"
        assert ext.snapshot().restarts == 0
        await ext.stop()

    async def test_a_ping_flood_from_a_child_not_reading_is_bounded_then_ended(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Endless pings, our answers unread: at most 32 answered at once, then the stall ends the run."""
        ext = make_extension(fast_config("flood.py", "ping", call_timeout=1))
        idle = len(asyncio.all_tasks())
        with capture_logs() as logs:
            await running(ext, task_group)
            peak = await peak_tasks(1.5)
            restarted = await wait_for(ext, lambda s: s.restarts >= 1, within=30)
            # Past the 32 at once: in the first run, or (a loaded machine slowing the flood) a later one.
            await eventually(lambda: any(e["event"] == "extension.requests_dropped" for e in logs), within=30)
        assert peak < idle + 100, f"{peak - idle} tasks more than idle during the flood"
        assert "did not read its stdin for 1s" in (restarted.last_error or "")
        await ext.stop()

    async def test_a_child_not_reading_its_stdin_is_ended_and_restarted(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A call the child never reads (1 MiB it leaves in the pipe) ends the run past the deadline."""
        config = fast_config("flood.py", "deaf", call_timeout=1, backoff={"initial": 0.5, "jitter": 0})
        ext = make_extension(config)
        first = await running(ext, task_group)
        with pytest.raises(CallFailed):
            await ext.call_tool("echo", {"text": "x" * (1 << 20)})
        ended = await wait_for(ext, lambda s: s.state is State.BACKOFF, within=10)
        assert ended.last_error == "it did not read its stdin for 1s"
        again = await wait_for(ext, lambda s: s.state is State.RUNNING, within=10)
        assert again.restarts == 1 and again.pid != first.pid
        await ext.stop()

    async def test_a_junk_flood_is_logged_sparingly(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Endless invalid lines: the first 10 are logged, then one in a thousand; calls are served."""
        ext = make_extension(fast_config("flood.py", "junk"))  # junk costs a call each, not a task
        with capture_logs() as logs:
            await running(ext, task_group)
            await eventually(lambda: any(e.get("count", 0) >= 1000 for e in logs), within=20)
            started = time.monotonic()
            assert first_text(await ext.call_tool("echo", {"text": "served"})) == "served"
            print(f"served after {time.monotonic() - started:.3f}s")
        bad = [e["count"] for e in logs if e["event"] == "extension.bad_message"]
        assert bad[:10] == list(range(1, 11)) and all(n % 1000 == 0 for n in bad[10:])
        await ext.stop()


class TestUnencodableInput:
    @pytest.mark.parametrize(
        "arguments",
        [
            {"text": "\ud800"},
            {"text": "ok", "\udfff": 1},
            {"text": functools.reduce(lambda x, _: [x], range(3000), [])},
            {"text": "ok", "n": float("nan")},
        ],
        ids=["lone-surrogate", "surrogate-key", "nested-3000", "nan"],
    )
    async def test_is_invalid_params_for_that_call_only(
        self, arguments: dict[str, Any], make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """Arguments that cannot be sent as JSON fail that call with -32602; the same child serves on."""
        ext = make_extension(fast_config("quick.py", restart="always"))
        first = await running(ext, task_group)
        with pytest.raises(CallFailed, match="cannot be encoded") as failed:
            await ext.call_tool("echo", arguments)
        assert failed.value.code == types.INVALID_PARAMS
        assert first_text(await ext.call_tool("echo", {"text": "after"})) == "after"
        after = ext.snapshot()
        assert (after.state, after.pid, after.restarts) == (State.RUNNING, first.pid, 0)
        await ext.stop()


class TestExit:
    async def test_a_result_written_before_the_exit_is_delivered_however_long_spooling_takes(
        self, tmp_path: Path, marker_prefix: str, task_group: TaskGroup
    ) -> None:
        """2 x 30 MiB images, then exit 0: the call gets both links, not 'exited during the call'."""
        spool = Spool(tmp_path, instance="t", max_inline_bytes=1 << 18, max_total_bytes=1 << 30)
        # 60 MiB of base64 to decode and spool: seconds on a loaded machine
        config = fast_config("last_words.py", max_message_bytes=128 << 20, call_timeout=patience(60))
        ext = Extension(
            "lw",
            config,
            environ=dict(os.environ),
            marker_prefix=marker_prefix,
            spool=spool.for_extension("lw"),
        )
        await running(ext, task_group)
        result = await ext.call_tool("images_then_exit", {"bytes": 30 << 20})
        sizes = [block.size for block in result.content if isinstance(block, types.ResourceLink)]
        assert sizes == [30 << 20, 30 << 20]
        await ext.stop()


class TestTeardown:
    async def test_a_broken_scan_with_a_pipe_held_by_a_survivor_still_ends_the_connection(
        self, marker_prefix: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The teardown's scan fails while an escaped grandchild keeps the child's stderr open:
        the context still exits (a watcher stuck here never restarted nor stopped its extension)."""
        lines: list[str] = []
        tag = f"held-{os.getpid()}-{time.monotonic_ns()}"
        argv = server_argv("tree.py", "--mode", "clearenv", "--tag", tag)
        try:
            with fail_after(20):
                child = await spawn(argv, env=dict(os.environ), cwd=None, marker=f"{marker_prefix}held")
                async with connect(
                    child,
                    stop_timeout=0.5,
                    max_message_bytes=1 << 20,
                    on_stderr=lines.append,
                    on_list_changed=lambda kind: None,
                    on_notification=lambda message: None,
                ) as connection:
                    await connection.handshake()
                    await eventually(lambda: "tree: ready clearenv" in lines)

                    def broken(**_: object) -> dict[int, proctree.Proc]:
                        raise RuntimeError("a scan that breaks")

                    monkeypatch.setattr(proctree, "scan", broken)
            assert connection.child.terminated
        finally:
            monkeypatch.undo()
            for survivor in psutil.process_iter(["cmdline"]):  # by tag: the last one has no marker
                if tag in " ".join(survivor.info["cmdline"] or ()):
                    with contextlib.suppress(psutil.Error):
                        survivor.kill()
