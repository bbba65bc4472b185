"""spool.py: which items move to disk, what replaces them, the limits, and failures that lose nothing."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.upstream import spool as spool_module
from supervisor.upstream.spool import Spool, SpoolStats, decoded_size, filesystem_type

LIMIT = 1000


def b64(size: int, fill: int = 7) -> str:
    return base64.b64encode(bytes([fill]) * size).decode()


def image(size: int, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "data": b64(size), "mimeType": mime}


def result(*content: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"content": list(content), **extra}}


def path_of(link: dict[str, Any]) -> Path:
    assert link["uri"].startswith("file:///")
    return Path(link["uri"].removeprefix("file://"))


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    """A spool whose files may be evicted at once (min_age 0): eviction order without waiting."""
    return Spool(
        tmp_path / "spool", instance="abc", max_inline_bytes=LIMIT, max_total_bytes=10 * LIMIT, min_age=0
    )


class TestRewrite:
    def test_exactly_the_limit_stays_inline(self, spool: Spool) -> None:
        """A payload decoding to exactly max_inline_bytes is left alone."""
        message = result(image(LIMIT))
        assert spool.rewrite(message, "fx") == 0
        assert message["result"]["content"][0]["type"] == "image"

    def test_one_byte_more_is_spooled_as_a_link(self, spool: Spool) -> None:
        """One byte over the limit becomes a resource_link to a 0600 file holding the bytes."""
        message = result(image(LIMIT + 1))
        assert spool.rewrite(message, "fx") == 1
        link = message["result"]["content"][0]
        path = path_of(link)
        assert path.read_bytes() == bytes([7]) * (LIMIT + 1)
        assert link["type"] == "resource_link" and link["mimeType"] == "image/png"
        assert link["size"] == LIMIT + 1 and link["name"] == path.name and path.suffix == ".png"
        assert link["_meta"] == {
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "originalType": "image",
        }
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(spool.run_dir.stat().st_mode) == 0o700

    def test_audio_and_blob_are_spooled_order_and_neighbours_kept(self, spool: Spool) -> None:
        """Audio and blobs move too; text, small items, links and structured content stay, in order."""
        blob = {
            "type": "resource",
            "resource": {"uri": "mem://b", "mimeType": "application/pdf", "blob": b64(5000)},
        }
        text_resource = {"type": "resource", "resource": {"uri": "mem://t", "text": "x" * 5000}}
        content = [
            {"type": "text", "text": "before"},
            {"type": "audio", "data": b64(4000), "mimeType": "audio/wav", "annotations": {"priority": 1}},
            image(10),
            blob,
            text_resource,
            {"type": "resource_link", "uri": "file:///x", "name": "x"},
        ]
        message = result(*content, structuredContent={"ok": True})
        assert spool.rewrite(message, "fx") == 2
        out = message["result"]["content"]
        assert [item["type"] for item in out] == [
            "text",
            "resource_link",
            "image",
            "resource_link",
            "resource",
            "resource_link",
        ]
        assert out[1]["_meta"]["originalType"] == "audio" and out[1]["annotations"] == {"priority": 1}
        assert out[3]["_meta"]["originalUri"] == "mem://b" and path_of(out[3]).suffix == ".pdf"
        assert out[4] is text_resource and out[2]["data"] == b64(10)
        assert message["result"]["structuredContent"] == {"ok": True}

    def test_names_are_unguessable(self, spool: Spool) -> None:
        """Two spooled files get distinct random names of at least 128 bits."""
        message = result(image(LIMIT + 1), {**image(LIMIT + 1), "data": b64(LIMIT + 1, fill=8)})
        spool.rewrite(message, "fx")
        names = [path_of(link).stem for link in message["result"]["content"]]
        assert names[0] != names[1] and all(len(name) >= 21 for name in names)

    @pytest.mark.parametrize("data", ["!" * 4000, "abc" * 1001])
    def test_undecodable_base64_passes_through_with_a_warning(self, spool: Spool, data: str) -> None:
        """Invalid base64 is left inline, a warning names the extension, and no file remains."""
        message = result({"type": "image", "data": data, "mimeType": "image/png"})
        with capture_logs() as logs:
            assert spool.rewrite(message, "fx") == 0
        assert message["result"]["content"][0]["data"] == data
        assert [(e["event"], e["extension"]) for e in logs] == [("spool.not_base64", "fx")]
        assert spool.stats().files == 0 and not list(spool.run_dir.rglob("*.png"))

    @pytest.mark.parametrize("message", [{"id": 1}, {"result": {"content": "no"}}, {"result": {}}, [], "x"])
    def test_other_messages_are_ignored(self, spool: Spool, message: Any) -> None:
        """Anything that is not a tool result with a content list passes untouched."""
        assert spool.rewrite(message, "fx") == 0

    def test_decoded_size(self) -> None:
        """The decoded size comes from length and padding alone."""
        assert [decoded_size(b64(n)) for n in (0, 1, 2, 3, 1000)] == [0, 1, 2, 3, 1000]
        assert decoded_size("abc") is None


class TestLimits:
    def test_total_bytes_evicts_oldest_first(self, spool: Spool) -> None:
        """Past max_total_bytes the oldest files go, and the spool holds what the quota allows."""
        links = []
        for _ in range(12):
            message = result(image(2 * LIMIT))
            spool.rewrite(message, "fx")
            links.append(message["result"]["content"][0])
        alive = [path_of(link).exists() for link in links]
        assert alive == [False] * 7 + [True] * 5
        assert spool.stats().bytes == 10 * LIMIT and spool.stats().files == 5

    def test_file_count_is_bounded(self, tmp_path: Path) -> None:
        """max_files bounds the number of files whatever their size."""
        small = Spool(
            tmp_path, instance="abc", max_inline_bytes=0, max_total_bytes=10**9, max_files=3, min_age=0
        )
        for _ in range(10):
            small.rewrite(result(image(1)), "fx")
        assert small.stats().files == 3 and len(list(small.run_dir.rglob("*.png"))) == 3

    def test_payload_larger_than_the_quota_stays_inline(self, spool: Spool) -> None:
        """A payload over max_total_bytes is not spooled (it would evict everything and still not fit)."""
        message = result(image(11 * LIMIT))
        with capture_logs() as logs:
            assert spool.rewrite(message, "fx") == 0
        assert [e["event"] for e in logs] == ["spool.over_quota"]

    def test_a_result_never_evicts_its_own_files(self, spool: Spool) -> None:
        """With room for one item, a result of two keeps its first link valid; the second stays inline."""
        other = {**image(6 * LIMIT), "data": b64(6 * LIMIT, fill=8)}
        message = result(image(6 * LIMIT), dict(other))
        with capture_logs() as logs:
            assert spool.rewrite(message, "fx") == 1
        first, second = message["result"]["content"]
        assert first["type"] == "resource_link" and path_of(first).exists()
        assert second == other
        assert [e["event"] for e in logs] == ["spool.no_room"]
        assert spool.stats() == SpoolStats(1, 6 * LIMIT)

    def test_files_younger_than_min_age_are_not_evicted(self, tmp_path: Path) -> None:
        """A file whose link was just handed out survives; the new item stays inline until it ages."""
        young = Spool(
            tmp_path, instance="abc", max_inline_bytes=LIMIT, max_total_bytes=10 * LIMIT, min_age=0.3
        )
        old = result(image(6 * LIMIT))
        young.rewrite(old, "fx")
        new = result(image(6 * LIMIT))
        assert young.rewrite(new, "fx") == 0 and path_of(old["result"]["content"][0]).exists()
        time.sleep(0.35)  # the age is the point: nothing to wait on but the clock
        again = result(image(6 * LIMIT))
        assert young.rewrite(again, "fx") == 1
        assert not path_of(old["result"]["content"][0]).exists()
        assert young.stats() == SpoolStats(1, 6 * LIMIT)

    def test_the_default_min_age_is_a_second(self, tmp_path: Path) -> None:
        """Without a min_age argument, spooled files are safe for a second."""
        assert Spool(tmp_path, instance="abc", max_inline_bytes=1, max_total_bytes=1).min_age == 1.0


class TestFailures:
    def test_a_failed_write_evicts_nothing(self, spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
        """When the write that needed room fails, the files that would have made room stay."""
        kept = result(image(6 * LIMIT))
        spool.rewrite(kept, "fx")

        def disk_full(path: Path, data: str) -> str:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(spool_module, "write_decoded", disk_full)
        message = result(image(6 * LIMIT))
        assert spool.rewrite(message, "fx") == 0
        assert path_of(kept["result"]["content"][0]).exists()
        assert spool.stats() == SpoolStats(1, 6 * LIMIT)

    def test_injected_write_failure_keeps_the_payload_inline(
        self, spool: Spool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A failing write (disk full) leaves the item inline and logs the extension and the reason."""

        def disk_full(path: Path, data: str) -> str:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(spool_module, "write_decoded", disk_full)
        message = result(image(LIMIT + 1))
        with capture_logs() as logs:
            assert spool.rewrite(message, "fx") == 0
        assert message["result"]["content"][0] == image(LIMIT + 1)
        assert [(e["event"], e["extension"], e["reason"]) for e in logs] == [
            ("spool.write_failed", "fx", "No space left on device")
        ]

    def test_read_only_directory_keeps_the_payload_inline(self, read_only_dir: Path) -> None:
        """A spool on a read-only directory degrades to inline content with a warning."""
        spool = Spool(
            read_only_dir / "spool", instance="abc", max_inline_bytes=LIMIT, max_total_bytes=10 * LIMIT
        )
        message = result(image(LIMIT + 1))
        with capture_logs() as logs:
            assert spool.rewrite(message, "fx") == 0
        assert message["result"]["content"][0]["type"] == "image"
        assert [e["event"] for e in logs] == ["spool.write_failed"]
        assert "read-only" in logs[0]["reason"].lower() or "permission" in logs[0]["reason"].lower()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A real read-only directory: a read-only tmpfs mount as root (root ignores modes), else chmod 0500."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o500)
        yield path
        path.chmod(0o700)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs as root: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


class TestLifecycle:
    def test_each_extension_object_has_its_own_directory(self, spool: Spool) -> None:
        """Two spools for one name (an object and its successor after a reload) never share files."""
        old, new = spool.for_extension("fx"), spool.for_extension("fx")
        assert old.directory != new.directory and old.extension == new.extension == "fx"
        kept = result(image(LIMIT + 1))
        new.rewrite(kept)
        gone = result(image(LIMIT + 1))
        old.rewrite(gone)
        old.remove()  # the retired object's watcher ends after its successor started
        assert path_of(kept["result"]["content"][0]).exists()
        assert not path_of(gone["result"]["content"][0]).exists()
        assert spool.stats().files == 1

    def test_remove_extension_deletes_only_its_files(self, spool: Spool) -> None:
        """Stopping one extension deletes its directory and its share of the quota, nobody else's."""
        for name in ("a", "b"):
            spool.rewrite(result(image(LIMIT + 1)), name)
        spool.remove_extension("a")
        assert not (spool.run_dir / "a").exists() and (spool.run_dir / "b").exists()
        assert spool.stats().files == 1

    def test_close_removes_the_run_directory(self, spool: Spool) -> None:
        """Daemon exit removes everything this daemon spooled."""
        spool.rewrite(result(image(LIMIT + 1)), "a")
        spool.close()
        assert not spool.run_dir.exists() and spool.stats().files == 0

    def test_sweep_removes_dead_daemons_of_this_socket_only(self, tmp_path: Path) -> None:
        """A start removes run dirs of dead daemons on the same socket; live ones and other sockets stay."""
        dead = subprocess.Popen(["true"])
        dead.wait()
        leftovers = {
            "dead": tmp_path / f"abc-{dead.pid}",
            "alive": tmp_path / f"abc-{os.getppid()}",
            "other": tmp_path / f"xyz-{dead.pid}",
        }
        for path in leftovers.values():
            (path / "fx").mkdir(parents=True)
        spool = Spool(tmp_path, instance="abc", max_inline_bytes=LIMIT, max_total_bytes=LIMIT)
        assert spool.sweep() == 1
        assert {name: path.exists() for name, path in leftovers.items()} == {
            "dead": False,
            "alive": True,
            "other": True,
        }

    def test_warns_when_the_spool_lives_in_memory(self) -> None:
        """A spool on tmpfs defeats its purpose: the daemon says so."""
        if filesystem_type(Path("/dev/shm")) != "tmpfs":
            pytest.skip("no tmpfs at /dev/shm here")
        spool = Spool(
            Path("/dev/shm") / f"mcps-{uuid.uuid4().hex}",
            instance="abc",
            max_inline_bytes=1,
            max_total_bytes=1,
        )
        with capture_logs() as logs:
            spool.check_filesystem()
        assert [e["event"] for e in logs] == ["spool.in_memory_filesystem"]
