"""Shared fixtures: real fixture servers, per-test process markers and a leftover check."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from supervisor.config.settings import ExtensionConfig
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from supervisor.process import children as process

SERVERS = Path(__file__).parent / "servers"


def server_argv(script: str, *args: str) -> list[str]:
    return [sys.executable, str(SERVERS / script), *args]


async def eventually(predicate: Callable[[], bool], within: float = 5.0, interval: float = 0.01) -> None:
    """Poll *predicate* until true, failing after *within* s. For conditions that fire no event."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - bounded poll; callers have no event to wait on
            await anyio.sleep(interval)


def extension_settings(script: str, *args: str, **overrides: Any) -> dict[str, Any]:
    """The config entry (plain JSON) for a fixture server, with test-friendly timings."""
    path = str(SERVERS / script)
    command, argv = (path, list(args)) if script.endswith(".sh") else (sys.executable, [path, *args])
    settings: dict[str, Any] = {
        "command": command,
        "args": argv,
        "backoff": {"initial": 0, "jitter": 0},
        "start_timeout": 10,
        "stop_timeout": 1,
    }
    return {**settings, **overrides}


def fast_config(script: str, *args: str, **overrides: Any) -> ExtensionConfig:
    """A validated config for a fixture server (no backoff unless asked, 10 s call timeout)."""
    return ExtensionConfig.model_validate(
        extension_settings(script, *args, **{"call_timeout": 10, **overrides})
    )


async def running(ext: Extension, tg: anyio.abc.TaskGroup) -> Snapshot:
    """Start *ext* in *tg* and return its snapshot once it runs (failing if it does not)."""
    await ext.start(tg)
    with anyio.fail_after(10):
        snapshot = await ext.wait_for(lambda s: s.state in (State.RUNNING, State.FAILED))
    assert snapshot.state is State.RUNNING, snapshot
    return snapshot


def first_text(result: types.CallToolResult) -> str:
    """The text of a result's first content block, which must be text."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


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
    def make(config: ExtensionConfig, name: str = "fx") -> Extension:
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
