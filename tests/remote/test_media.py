"""A remote server's media goes to the spool as its answer streams: the daemon never holds it whole.

The unit tests of the scanner and the diversions are in ``tests/upstream/test_diverted.py``;
here a real fixture server sends a 24 MiB image (32 MiB of base64) in each transport, and the
daemon's peak resident memory (``VmHWM``) is read before and after.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness import Daemon, memory
from tests.remote import Remote

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SIZE = 24 << 20  # bytes of the image: 32 MiB of base64, with room under max_message_bytes (64 MiB)


class TestStreamedSpool:
    @pytest.mark.parametrize("mode", ["http", "json", "sse"])
    async def test_a_big_image_reaches_the_spool_without_being_held_whole(
        self, daemons: Callable[..., Daemon], remotes: Callable[[str], Remote], short_tmp: Path, mode: str
    ) -> None:
        remote = remotes(mode)
        spool = short_tmp / "spool"
        settings = {"spool": {"dir": str(spool), "max_inline_bytes": 4096}}
        daemon = daemons({"far": remote.entry(call_timeout=60)}, settings=settings)
        daemon.wait_state("far", "running")
        (warm,) = daemon.call("far", "image", bytes=100_000)["content"]  # every code path loaded once
        before = memory(daemon.pid, "VmHWM")
        (item,) = daemon.call("far", "image", bytes=SIZE)["content"]
        grown = memory(daemon.pid, "VmHWM") - before
        assert item["type"] == "resource_link" and item["size"] == SIZE, item
        # About 8 MiB here; read whole (no diversions), 164-227 MiB: its base64 alone is 32 MiB.
        assert grown < 16 << 20, f"the peak grew by {grown / (1 << 20):.1f} MiB"
        files = sorted(p for p in spool.rglob("*") if p.is_file())
        assert sorted(p.stat().st_size for p in files) == [100_000, SIZE]  # no diverted file is left
        assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
        assert warm["size"] == 100_000
