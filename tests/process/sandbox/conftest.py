"""The sandbox tests' daemons and listeners (shared by test_sandbox.py and test_levels.py)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Daemon


@pytest.fixture
def sandboxed(daemons: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """A daemon with a HOME of its own (holding a key and a .bashrc to steal) on *config*: the
    top-level settings, or a file used as it is."""

    def make(
        config: dict[str, Any] | Path, prefix: list[str] | None = None, env: dict[str, str] | None = None
    ) -> Daemon:
        if isinstance(config, Path):
            daemon = daemons(config=config, home=True, prefix=prefix, env=env, start=False, end="terminate")
        else:
            settings = {k: v for k, v in config.items() if k != "extensions"}
            daemon = daemons(
                config.get("extensions", {}),
                settings=settings,
                home=True,
                prefix=prefix,
                env=env,
                start=False,
                end="terminate",
            )
        (daemon.home / ".ssh").mkdir(parents=True)
        (daemon.home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
        (daemon.home / ".bashrc").write_text("# the user's\n")
        daemon.state.mkdir(parents=True)
        (daemon.state / "marker").write_text("state")
        return daemon.start()

    return make


@pytest.fixture
def tcp_listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    name = f"mcps-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("\0" + name)
        server.listen()
        yield name
