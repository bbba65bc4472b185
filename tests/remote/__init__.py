"""Remote extensions' tests: :func:`entry` is the entry they share, :class:`Remote` the fixture
server (tests/servers/remote.py) they run, and the ``remotes`` fixture (conftest.py) starts them;
:func:`together` how many calls a run serves at once."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import anyio

from tests.harness import SERVERS, Daemon, first_text, gateway_session, zygote
from tests.harness.timing import fail_after, patience


async def together(daemon: Daemon, count: int) -> list[str]:
    """What *count* calls of the fixture's ``together`` at once, from a gateway client (beside
    the session: it listed tools), say: how many of them ran at once, each."""
    seen: list[str] = []
    async with gateway_session(daemon.mcp_sock) as session:
        await session.list_tools()

        async def one() -> None:
            arguments = {"count": count, "seconds": patience(20)}
            seen.append(first_text(await session.call_tool("far__together", arguments)))

        with fail_after(patience(40)):
            async with anyio.create_task_group() as calls:
                for _ in range(count):
                    calls.start_soon(one)
    return seen


def entry(url: str, **overrides: Any) -> dict[str, Any]:
    """A remote extension's entry for *url*, restarting fast and stopping soon (tests wait on it)."""
    settings = {
        "url": url,
        "backoff": {"initial": 0.1, "max": 0.5, "jitter": 0},
        "start_timeout": patience(10),
        "stop_timeout": 1,
    }
    return {**settings, **overrides}


class Remote:
    """tests/servers/remote.py in one of its modes, on a port that stays its own across restarts."""

    def __init__(self, mode: str, tls: tuple[str, str] | None = None) -> None:
        self.mode, self.port, self.tls = mode, 0, tls
        self.proc: subprocess.Popen[str] | zygote.Forked | None = None
        self.url = ""

    def start(self) -> Remote:
        argv = [sys.executable, str(SERVERS / "remote.py"), self.mode, str(self.port), *(self.tls or ())]
        self.proc = zygote.popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()  # printed once it listens
        assert self.url.startswith(("http://127.0.0.1:", "https://127.0.0.1:")), self.url
        self.port = int(self.url.split(":")[2].split("/")[0])
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def entry(self, **overrides: Any) -> dict[str, Any]:
        return entry(self.url, **overrides)


def text(result: dict[str, Any]) -> str:
    """The first text of a call's wire result."""
    return str(result["content"][0]["text"])
