"""The harness's forked daemons are the processes ``python -m supervisor daemon`` would be."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.harness import Daemon, extension_settings, zygote

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not zygote.enabled(), reason="MCP_TEST_FORK=0: no zygote"),
]


def _links(pid: int) -> set[str]:
    """What the fds of *pid* point at, but stdio (sockets and pipes by inode)."""
    folder, links = f"/proc/{pid}/fd", set()
    for fd in os.listdir(folder):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing (the zygote forks on)
            if int(fd) > 2:
                links.add(os.readlink(f"{folder}/{fd}"))
    return links


def test_a_forked_daemon_has_its_own_stdio_environment_limits_and_exit_code(
    daemons: Callable[..., Daemon],
) -> None:
    daemon = daemons(
        {"env": extension_settings("getenv.py")}, env={"MCP_TEST_MARK": "forked"}, nofile=(512, 4096)
    )
    assert isinstance(daemon.proc, zygote.Forked)
    process = psutil.Process(daemon.pid)
    daemon.wait_state("env", "running")
    # /proc/PID/environ is the zygote's (it is fixed at exec); what the daemon passes on is its own.
    arguments = {"name": "MCP_TEST_MARK"}
    answer = daemon.request("call", {"name": "env", "tool": "getenv", "arguments": arguments})
    assert answer["content"][0]["text"] == "forked", answer
    assert process.rlimit(psutil.RLIMIT_NOFILE) == (4096, 4096)  # the daemon raises soft to hard
    fds = {fd: os.readlink(f"/proc/{daemon.pid}/fd/{fd}") for fd in (0, 1, 2)}
    assert fds == {0: os.devnull, 1: str(daemon.log), 2: str(daemon.log)}
    assert not _links(daemon.pid) & _links(process.ppid())  # none of the zygote's fds (its socket)
    assert daemon.find("daemon.ready")
    daemon.proc.send_signal(signal.SIGKILL)
    assert daemon.proc.wait(timeout=20) == -signal.SIGKILL  # as Popen reports it


def test_sigterm_ends_it_with_exit_0(daemons: Callable[..., Daemon], short_tmp: Path) -> None:
    daemon = daemons({})
    assert daemon.terminate() == 0
    assert daemon.find("daemon.stopped")


def test_a_stale_answer_or_a_failed_request_leaves_the_zygote_in_step(daemons: Callable[..., Daemon]) -> None:
    """An ask interrupted after its request (a test's timeout) leaves an answer unread; a request
    the zygote cannot serve gets an error. Neither shifts the answers of the next ones."""
    first = daemons({})
    the_zygote = zygote._the_zygote()
    the_zygote.channel.sendall(b'{"poll": 1, "n": -1}\n')  # its answer is never read
    with pytest.raises(RuntimeError, match="KeyError"):
        the_zygote.ask({"unknown": True})
    (first.directory / "second").mkdir(mode=0o700)  # a socket directory of its own
    second = daemons({}, directory=first.directory / "second")
    assert second.pid != first.pid and second.proc is not None and second.proc.poll() is None
    second.proc.kill()
    assert second.proc.wait(timeout=20) == -signal.SIGKILL
    assert first.proc is not None and first.proc.poll() is None
