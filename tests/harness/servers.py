"""The fixture servers in tests/servers: their config entries, and helpers for an Extension running one."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types

from supervisor.config.settings import StdioConfig
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension

from .timing import fail_after, patience

__all__ = (
    "DATA",
    "ECHO",
    "RICH",
    "ROOT",
    "SERVERS",
    "counted",
    "eventually",
    "extension_settings",
    "fast_config",
    "first_text",
    "gated_start",
    "running",
    "server_argv",
    "spawns",
)

ROOT = Path(__file__).resolve().parents[2]  # the repository
SERVERS = ROOT / "tests" / "servers"
DATA = ROOT / "tests" / "data"


def server_argv(script: str, *args: str) -> list[str]:
    return [sys.executable, str(SERVERS / script), *args]


async def eventually(predicate: Callable[[], bool], within: float = 5.0, interval: float = 0.01) -> None:
    """Poll *predicate* until true, failing after *within* s (scaled by :data:`~.timing.SLOWDOWN`).
    For conditions that fire no event."""
    with fail_after(within):
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
        "start_timeout": patience(10),
        "stop_timeout": 1,
    }
    return {**settings, **overrides}


def gated_start(directory: Path, **overrides: Any) -> tuple[Path, dict[str, Any]]:
    """slow_start.py held in its start until the returned gate file exists (``gate.touch()``),
    and its config entry. The gate is in a folder of *directory* that its sandbox may read (not
    the socket directory itself, which the sandbox hides)."""
    gates = directory / "gates"
    gates.mkdir(exist_ok=True)
    gate = gates / "gate"
    settings = extension_settings(
        "slow_start.py", env={"SLOW_START_GATE": str(gate)}, sandbox={"read": [str(gates)]}, **overrides
    )
    return gate, settings


def fast_config(script: str, *args: str, **overrides: Any) -> StdioConfig:
    """A validated config for a fixture server (no backoff unless asked, 10 s call timeout)."""
    return StdioConfig.model_validate(
        extension_settings(script, *args, **{"call_timeout": patience(10), **overrides})
    )


async def running(ext: Extension, tg: anyio.abc.TaskGroup) -> Snapshot:
    """Start *ext* in *tg* and return its snapshot once it runs (failing if it does not)."""
    await ext.start(tg)
    with fail_after(10):
        snapshot = await ext.wait_for(lambda s: s.state in (State.RUNNING, State.FAILED))
    assert snapshot.state is State.RUNNING, snapshot
    return snapshot


def first_text(result: types.CallToolResult) -> str:
    """The text of a result's first content block, which must be text."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def counted(pids: Path, **overrides: Any) -> dict[str, Any]:
    """A fixture server that appends its pid to *pids* at each spawn (read it with :func:`spawns`).

    The file goes in a directory beside *pids*, which its sandbox may write: not the socket
    directory itself, which the sandbox hides.
    """
    own = _spawn_file(pids)
    own.parent.mkdir(exist_ok=True)
    granted = {"sandbox": {"write": [str(own.parent)]}}
    return extension_settings("counted.py", env={"COUNTED_PID_FILE": str(own)}, **granted, **overrides)


def _spawn_file(pids: Path) -> Path:
    return pids.parent / "spawns" / pids.name


def spawns(pids: Path) -> list[int]:
    own = _spawn_file(pids)
    return [int(line) for line in own.read_text().split()] if own.exists() else []


RICH = extension_settings("rich.py")
ECHO = extension_settings("echo.py")
