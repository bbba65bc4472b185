"""The suite's fixtures; tests/conftest.py registers them. Daemon fixtures all make a harness Daemon."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc
import pytest

from supervisor.config.settings import StdioConfig
from supervisor.extension.supervised import Extension
from supervisor.process import children as process
from supervisor.process import sandbox

from .daemon import Daemon

__all__ = (
    "INLINE",
    "anyio_backend",
    "daemons",
    "gateway",
    "hostile",
    "http_gateway",
    "make_extension",
    "marker_prefix",
    "ondemand",
    "pinned",
    "short_tmp",
    "state_directory",
    "task_group",
    "temporary_directory",
)

INLINE = 4096  # spool.max_inline_bytes for the gateway and hostile fixtures
End = Literal["kill", "terminate", "exit 0"]


@pytest.fixture(scope="session", autouse=True)
def state_directory() -> Iterator[Path]:
    """Saved catalogs of the daemons under test go to a directory of this session, not ~/.local/state."""
    path = Path(tempfile.mkdtemp(prefix="mcps-state-"))
    before = os.environ.get("STATE_DIRECTORY")
    os.environ["STATE_DIRECTORY"] = str(path)
    yield path
    if before is None:
        os.environ.pop("STATE_DIRECTORY", None)
    else:
        os.environ["STATE_DIRECTORY"] = before
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def temporary_directory() -> Iterator[Path]:
    """The daemons under test keep their temporary directories (the sandboxes' private ones among
    them) in a directory of this session: a daemon a test SIGKILLs cannot remove its own."""
    path = Path(tempfile.mkdtemp(prefix="mcps-tmp-", dir="/tmp"))  # short: sockets may live below
    before, cached = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(path)  # tests ask where a daemon's would be
    yield path
    tempfile.tempdir = cached
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def marker_prefix() -> Iterator[str]:
    """A marker prefix of this test's own; after the test no process may carry it."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    leftovers = process.find_marked(prefix)
    for pid in leftovers:  # clean up before failing, so one failure does not cascade
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    assert not leftovers, f"processes outlived the test: {sorted(leftovers)}"


@pytest.fixture
def make_extension(marker_prefix: str) -> Callable[..., Extension]:
    def make(config: StdioConfig, name: str = "fx") -> Extension:
        return Extension(name, config, environ=dict(os.environ), marker_prefix=marker_prefix)

    return make


@pytest.fixture
async def task_group() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A long-lived task group standing in for the daemon's; cancelled (not awaited) at the end."""
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="mcps-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---- daemons ----------------------------------------------------------------------------------


_STARTED = pytest.StashKey[list[tuple[Daemon, End]]]()


@pytest.fixture
def daemons(short_tmp: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Daemon]]:
    """Make a :class:`Daemon` (started unless asked not to); after the test none of its processes is left.

    ``end`` says what happens to one still running at the end: "kill" (SIGKILL), "terminate"
    (SIGTERM), or "exit 0" (SIGTERM, and it must exit 0).
    """
    started: list[tuple[Daemon, End]] = []
    request.node.stash[_STARTED] = started  # for the report of a failure: their logs

    def make(
        extensions: dict[str, Any] | None = None,
        *,
        start: bool = True,
        directory: Path | None = None,
        end: End = "kill",
        **options: Any,
    ) -> Daemon:
        daemon = Daemon(directory or short_tmp, extensions, **options)
        started.append((daemon, end))
        return daemon.start() if start else daemon

    yield make
    unclean = []
    for daemon, end in started:
        if not daemon.running():
            continue
        if end == "kill":
            daemon.kill()
            continue
        try:
            code = daemon.terminate()
        finally:
            daemon.kill()
        if end == "exit 0" and code != 0:
            unclean.append(f"exit {code}: {daemon.log.read_text()[-3000:]}")
    for daemon, _ in started:  # whatever a killed daemon left behind
        leftovers = _left_by(daemon)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A killed daemon's sandbox temporary directories: its next start would sweep them, and
        # no test starts a daemon on this socket again.
        shutil.rmtree(sandbox.tmp_base(daemon.instance), ignore_errors=True)
        assert not leftovers, f"processes outlived the daemon: {sorted(leftovers)}"
    assert not unclean, unclean


def logs_of(item: pytest.Item, tail: int = 6000) -> list[tuple[str, str]]:
    """The end of each log the test's daemons wrote, as report sections: a failure under load
    happens once in a hundred runs, and without the daemon's side it cannot be understood."""
    sections = []
    for log in dict.fromkeys(daemon.log for daemon, _ in item.stash.get(_STARTED, [])):
        with contextlib.suppress(OSError):
            sections.append((f"daemon log {log}", log.read_text(errors="replace")[-tail:]))
    return sections


def _left_by(daemon: Daemon, within: float = 30.0) -> set[int]:
    """The processes still carrying *daemon*'s marker once its guardian had *within* s to end them.

    A SIGKILLed daemon's guardian ends its trees after the kernel tells it the daemon died, and
    the children's own death signal is delivered after that exit too: a scan at once can see a
    process that is already condemned (CI, under load).
    """
    deadline = time.monotonic() + within
    while (leftovers := process.find_marked(daemon.instance)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leftovers


@pytest.fixture
def gateway(daemons: Callable[..., Daemon], short_tmp: Path) -> Callable[..., Daemon]:
    """Start a daemon on *extensions* (plus top-level *settings*) and wait until they run.

    Its spool is in the test's directory, with ``max_inline_bytes`` INLINE; it must exit 0.
    """

    def start(extensions: dict[str, Any], wait: tuple[str, ...] | None = None, **settings: Any) -> Daemon:
        spool = {"dir": str(short_tmp / "spool"), "max_inline_bytes": INLINE}
        daemon = daemons(extensions, settings={"spool": spool, **settings}, end="exit 0")
        for name in extensions if wait is None else wait:
            daemon.wait_state(name, "running")
        if wait is None or wait:
            daemon.wait_announced()
        return daemon

    return start


@pytest.fixture
def http_gateway(daemons: Callable[..., Daemon], short_tmp: Path) -> Callable[..., Daemon]:
    """A daemon with the HTTP listener on a free port (*http* its extra settings), extensions running."""

    def start(extensions: dict[str, Any], **http: Any) -> Daemon:
        settings = {"spool": {"dir": str(short_tmp / "spool")}}
        daemon = daemons(extensions, settings=settings, http=http, end="exit 0")
        for name in extensions:
            daemon.wait_state(name, "running")
        daemon.wait_announced()
        return daemon

    return start


@pytest.fixture
def hostile(daemons: Callable[..., Daemon], short_tmp: Path) -> Callable[..., Daemon]:
    """A daemon with the HTTP listener on a free port, started under an fd limit of the test's."""

    def start(extensions: dict[str, Any], *, nofile: tuple[int, int] | None = None, **http: Any) -> Daemon:
        settings = {"spool": {"dir": str(short_tmp / "spool"), "max_inline_bytes": INLINE}}
        daemon = daemons(extensions, settings=settings, http=http, nofile=nofile, end="terminate")
        for name in extensions:
            daemon.wait_state(name, "running", within=20)
        daemon.wait_announced()
        return daemon

    return start


@pytest.fixture
def pinned(daemons: Callable[..., Daemon], short_tmp: Path) -> Callable[..., Daemon]:
    """A daemon with its own ``STATE_DIRECTORY`` (pins, catalogs), spool and environment."""

    def make(extensions: dict[str, Any], *, env: dict[str, str] | None = None, **settings: Any) -> Daemon:
        spool = {"dir": str(short_tmp / "spool")}
        return daemons(extensions, settings={"spool": spool, **settings}, env=env, state=True, end="exit 0")

    return make


@pytest.fixture
def ondemand(pinned: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """A daemon with its own ``STATE_DIRECTORY`` (where saved catalogs go) and spool."""
    return pinned
