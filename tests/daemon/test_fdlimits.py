"""File descriptors: the soft limit raised, caps that fit beside a reserve, a spare for the operator."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.daemon import fdlimits

pytestmark = pytest.mark.timeout(30)


class TestPlan:
    def test_a_generous_limit_gives_every_listener_its_default(self) -> None:
        fds = fdlimits.plan(65536, children=100)
        assert (fds.control, fds.unix, fds.http) == (64, 256, 256) and not fds.cramped

    @pytest.mark.parametrize("limit", [256, 512, 1024, 2048])
    @pytest.mark.parametrize("children", [0, 1, 10, 40])
    def test_caps_and_reserve_fit_the_limit(self, limit: int, children: int) -> None:
        """Whatever fits is shared; the caps never take the children's reserve, if there is room for
        it. An mcp.sock client may cost three fds (connect hands its pipes over)."""
        fds = fdlimits.plan(limit, children)
        assert min(fds.control, fds.unix, fds.http) >= fdlimits.MIN_SHARE
        unix_fds = fdlimits.UNIX_CLIENT_FDS * fds.unix
        if fds.reserved + (2 + fdlimits.UNIX_CLIENT_FDS) * fdlimits.MIN_SHARE <= limit:
            assert fds.reserved + fds.control + unix_fds + fds.http <= limit

    def test_a_low_limit_is_cramped_and_says_so(self) -> None:
        fds = fdlimits.plan(256, children=1)
        assert fds.cramped and fds.http < 256 and fds.unix < 256


def _run(script: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


class TestSoftLimit:
    def test_raised_to_the_hard_limit(self) -> None:
        out = _run(
            """
            import resource
            from supervisor.daemon import fdlimits
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))
            print(fdlimits.raise_soft_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            """
        )
        assert out == "1024 1024"


class TestSpare:
    def test_an_accept_gets_through_when_the_process_is_out_of_fds(self, short_tmp: Path) -> None:
        """The spare fd is given up for one accept: the client is served although every other fd is taken."""
        path = short_tmp / "s.sock"
        script = f"""
            import os, resource, anyio
            from supervisor import sockets
            from supervisor.sockets import Spare

            async def main():
                resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
                listener = await anyio.create_unix_listener({str(path)!r})
                spare = Spare()
                hog = []
                try:
                    while True:
                        hog.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    pass
                print("full", flush=True)
                with anyio.fail_after(10):
                    stream = await sockets.next_client(listener, event="t.accept_failed", spare=spare)
                await stream.send(b"in")
                print("accepted", spare.held, flush=True)

            anyio.run(main)
        """
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "full"
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(path))
                client.settimeout(10)
                assert client.recv(2) == b"in"
            assert (
                proc.stdout.readline().strip() == "accepted False"
            )  # given up, nothing to take it back with
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
            proc.wait()
