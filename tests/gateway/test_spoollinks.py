"""Spool links read back: only regular files beneath the spool, no symlink on the way, no fd kept."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import anyio
import pytest
from mcp import MCPError

from supervisor.gateway import spoollinks

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


@pytest.fixture(params=["openat2", "walk"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with openat2 and with the component-by-component walk kernels without it need."""
    monkeypatch.setattr(spoollinks, "_have_openat2", None if request.param == "openat2" else False)
    yield request.param


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "secret").write_text("secret")
    os.symlink(tmp_path / "secret", tmp_path / "ext" / "planted")
    os.symlink(tmp_path / "ext", tmp_path / "linked")
    os.mkfifo(tmp_path / "ext" / "fifo")
    return tmp_path


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class TestOpenBeneath:
    def test_a_file_beneath_opens(self, spool: Path, way: str) -> None:
        fd = spoollinks.open_beneath(spool, PurePosixPath("ext/a.png"))
        try:
            assert os.read(fd, 4) == b"\x89PNG"
        finally:
            os.close(fd)

    @pytest.mark.parametrize("relative", ["ext/planted", "linked/a.png"])
    def test_a_symlink_anywhere_on_the_way_is_refused(self, spool: Path, way: str, relative: str) -> None:
        with pytest.raises(OSError) as caught:
            spoollinks.open_beneath(spool, PurePosixPath(relative))
        assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV)

    @pytest.mark.parametrize("relative", ["../secret", "ext/../../secret", "."])
    def test_no_way_out(self, spool: Path, way: str, relative: str) -> None:
        with pytest.raises(OSError):
            spoollinks.open_beneath(spool, PurePosixPath(relative))


class TestRead:
    @pytest.mark.parametrize(("name", "why"), [("ext", "a directory"), ("ext/fifo", "not a regular file")])
    async def test_anything_but_a_regular_file_is_a_clear_error_and_keeps_no_fd(
        self, spool: Path, way: str, name: str, why: str
    ) -> None:
        before = _fds()
        for _ in range(20):
            with pytest.raises(MCPError) as caught:
                await spoollinks.read(spool, (spool / name).as_uri(), anyio.CapacityLimiter(2))
            assert (
                caught.value.error.code == spoollinks.RESOURCE_NOT_FOUND and why in caught.value.error.message
            )
        assert _fds() == before

    async def test_a_spooled_file_reads_back(self, spool: Path, way: str) -> None:
        read = await spoollinks.read(spool, (spool / "ext" / "a.png").as_uri(), anyio.CapacityLimiter(2))
        assert read.contents[0].mime_type == "image/png"  # type: ignore[union-attr]

    @pytest.mark.parametrize("uri", ["file:///etc/passwd", "file://elsewhere/x", "http://x/y"])
    async def test_outside_the_spool_is_refused_before_any_open(self, spool: Path, uri: str) -> None:
        with pytest.raises(MCPError) as caught:
            await spoollinks.read(spool, uri, anyio.CapacityLimiter(2))
        assert caught.value.error.code == spoollinks.RESOURCE_NOT_FOUND
