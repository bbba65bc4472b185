"""process.py: spawning, exit detection by event, and killing whole process trees."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import psutil
import pytest
from structlog.testing import capture_logs

from supervisor.errors import SpawnError
from supervisor.process import children as process
from supervisor.process import reaper, spawner
from supervisor.process import tree as proctree
from tests.harness import eventually, server_argv
from tests.harness.timing import fail_after, patience

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

EXIT_LEAVING_GRANDCHILD = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])  # inherits stdout\n"
    "sys.exit(3)\n"
)

ASYNCIO_WAIT_PROBE = """
import asyncio, os, signal, subprocess, sys
async def main():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.readline()\\n" + sys.argv[1],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    waiter = asyncio.ensure_future(proc.wait())
    await asyncio.sleep(0)  # one loop turn: the watcher waits before the child can exit
    proc.stdin.write(b"go\\n")
    while proc.returncode is None:
        await asyncio.sleep(0.01)
    done, _ = await asyncio.wait([waiter], timeout=0.5)
    print("wait() returned" if done else "wait() blocked", flush=True)
    os.killpg(proc.pid, signal.SIGKILL)
    await waiter
asyncio.run(main())
"""


LOOP_STALL_PROBE = """
import anyio, os, sys, time
from supervisor.process import children as process
from supervisor.process import spawner
heap = bytearray(1 << 30)  # a big daemon: copying its page tables makes a fork() slow
for i in range(0, len(heap), 4096):
    heap[i] = 1
async def ticking(during):
    # The loop's gaps while during() runs: the third longest (a fork on the loop stalls each of
    # five spawns; a loaded machine's scheduler takes one or two gaps of its own).
    gaps, last, going = [], time.perf_counter(), True
    async def tick():
        nonlocal last
        while going:
            await anyio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        result = await during()
        going = False
    return sorted(gaps)[-3] * 1000, result
async def main():
    env, mark = dict(os.environ), sys.argv[1]
    async def spawn():
        return [await process.spawn(["/bin/sleep", "9"], env=env, cwd=None, marker=mark) for _ in "12345"]
    started = time.perf_counter()
    spawning, children = await ticking(spawn)
    took = time.perf_counter() - started
    idle, _ = await ticking(lambda: anyio.sleep(took))  # the same time without spawning: the machine's own
    for child in children:
        await process.terminate_tree(child, grace=0)
    print(round(spawning, 1), round(idle, 1))
anyio.run(main)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def spawn(argv: list[str], marker: str, **kwargs: object) -> process.ChildProcess:
    return await process.spawn(argv, env=dict(os.environ), cwd=None, marker=marker, **kwargs)  # type: ignore[arg-type]


async def read_line(reader: process.PipeReader, startswith: str = "") -> str:
    """The first whole line from *reader* that starts with *startswith* (the rest is dropped)."""
    pending = b""
    with fail_after(10):
        while chunk := await reader.read():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.decode().startswith(startswith):
                    return line.decode()
    raise AssertionError(f"no line starting with {startswith!r}")


async def read_stderr_line(child: process.ChildProcess, startswith: str) -> str:
    return await read_line(child.stderr, startswith)


class TestSpawn:
    async def test_command_not_found_is_permanent(self, marker_prefix: str) -> None:
        """A missing command is a permanent error that names the command."""
        with pytest.raises(SpawnError, match="command 'no-such-command-xyz' not found") as info:
            await spawn(["no-such-command-xyz"], marker_prefix)
        assert info.value.permanent

    async def test_not_executable_is_permanent(self, marker_prefix: str, tmp_path: Path) -> None:
        """A file without the execute bit is a permanent error."""
        script = tmp_path / "script.sh"
        script.write_text("#!/bin/sh\n")
        with pytest.raises(SpawnError, match="is not executable") as info:
            await spawn([str(script)], marker_prefix)
        assert info.value.permanent

    async def test_missing_cwd_is_named(self, marker_prefix: str) -> None:
        """A missing working directory is reported as such, not as a missing command."""
        with pytest.raises(SpawnError, match="working directory '/no/such/dir' not found"):
            await process.spawn([sys.executable], env={}, cwd="/no/such/dir", marker=marker_prefix)

    async def test_child_gets_environment_and_marker_in_own_session(self, marker_prefix: str) -> None:
        """The child sees the given environment plus the marker, and leads a new session."""
        code = (
            "import os, json\n"
            "print(json.dumps([os.environ['GREETING'], os.environ['MCP_SUPERVISOR_MARK'], os.getsid(0)]))"
        )
        child = await process.spawn(
            [sys.executable, "-c", code], env={**os.environ, "GREETING": "hi"}, cwd=None, marker=marker_prefix
        )
        with fail_after(10):
            greeting, mark, sid = json.loads(await read_line(child.stdout))
            await child.exited.wait()
        assert (greeting, mark, sid) == ("hi", marker_prefix, child.pid)
        await process.terminate_tree(child, grace=0)

    async def test_command_is_looked_up_in_the_childs_path(self, marker_prefix: str, tmp_path: Path) -> None:
        """A bare command name is found through the PATH given to the child, not the daemon's."""
        script = tmp_path / "only-here"
        script.write_text("#!/bin/sh\necho found\n")
        script.chmod(0o755)
        child = await process.spawn(
            ["only-here"], env={"PATH": str(tmp_path)}, cwd=None, marker=marker_prefix
        )
        assert await read_line(child.stdout) == "found"
        await process.terminate_tree(child, grace=1)

    async def test_cwd_that_is_a_file_is_permanent(self, marker_prefix: str, tmp_path: Path) -> None:
        """A working directory that is a file is a permanent error naming it."""
        (tmp_path / "file").write_text("")
        with pytest.raises(SpawnError, match="is not a directory") as info:
            await process.spawn([sys.executable], env={}, cwd=str(tmp_path / "file"), marker=marker_prefix)
        assert info.value.permanent

    @pytest.mark.timeout(150)  # its idle half lasts as long as spawning took: minutes under load
    def test_spawning_does_not_stall_the_event_loop(self, marker_prefix: str) -> None:
        """Forking happens off the event loop: spawning from a 1 GiB process stalls it < 25 ms more
        than the same time without spawning does (a loaded machine's scheduler stalls it too).

        Before, Popen with a preexec_fn forked (no vfork) on the loop's thread: about 60 ms
        here per spawn, all of it with the loop stopped.
        """
        result = subprocess.run(
            [sys.executable, "-c", LOOP_STALL_PROBE, marker_prefix],
            capture_output=True,
            text=True,
            timeout=patience(120),
        )
        assert result.returncode == 0, result.stderr
        spawning, idle = map(float, result.stdout.split())
        assert spawning < idle + 25, f"the loop stalled {spawning} ms spawning, {idle} ms idle"


class TestShim:
    def test_argv_is_bare_without_setpriv_or_cgroup(self) -> None:
        """With neither a death-signal helper nor a cgroup, the command is executed as is."""
        assert spawner.shim_argv(["/bin/x", "a"], cgroup=None, setpriv=None) == ["/bin/x", "a"]

    def test_argv_arms_the_death_signal_then_joins_the_cgroup(self, tmp_path: Path) -> None:
        """setpriv first, then sh checks our pid and joins the cgroup, then execs the command."""
        argv = spawner.shim_argv(["/bin/x", "a"], cgroup=tmp_path, setpriv="/usr/bin/setpriv")
        assert argv[:4] == ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"]
        assert argv[4:6] == ["/bin/sh", "-c"] and argv[-4:] == [
            str(os.getpid()),
            str(tmp_path / "cgroup.procs"),
            "/bin/x",
            "a",
        ]

    @pytest.mark.skipif(spawner._SETPRIV is None, reason="no setpriv (util-linux) here")
    def test_shim_refuses_to_run_once_its_parent_is_gone(self) -> None:
        """The shim exits 125 without running the command when its parent is not the daemon."""
        argv = spawner.shim_argv(["/bin/true"], cgroup=None)
        argv[argv.index(str(os.getpid()))] = "1"  # as if the daemon had died and PID 1 adopted us
        assert subprocess.run(argv, timeout=10).returncode == 125


class TestPipeReader:
    async def test_buffer_is_bounded_and_the_writer_waits(self, marker_prefix: str) -> None:
        """A child writing 4 MiB nobody reads fills at most high_water (+ one pipe read), then blocks."""
        writer = "import sys; sys.stdout.buffer.write(b'x' * (4 << 20)); sys.stdout.flush()"
        child = await spawn([sys.executable, "-c", writer], marker_prefix, pipe_limit=64 << 10)
        await eventually(lambda: child.stdout.buffered >= 64 << 10)
        assert child.stdout.buffered <= (64 << 10) + (256 << 10)  # asyncio reads pipes 256 KiB at a time
        assert not child.exited.is_set()  # blocked on the full pipe
        received = 0
        with fail_after(10):
            while chunk := await child.stdout.read():
                received += len(chunk)
        assert received == 4 << 20 and child.stdout.at_eof()
        await process.terminate_tree(child, grace=1)


class TestExitDetection:
    async def test_exit_noticed_while_grandchild_holds_stdout(self, marker_prefix: str) -> None:
        """The exit event fires at the child's exit even though its stdout stays open."""
        child = await spawn([sys.executable, "-c", EXIT_LEAVING_GRANDCHILD], marker_prefix)
        with fail_after(5):
            await child.exited.wait()
        assert child.returncode == 3
        assert not child.stdout.at_eof()  # the grandchild still holds the pipe
        await process.terminate_tree(child, grace=0)

    def test_asyncio_wait_alone_would_miss_that_exit(self) -> None:
        """Why process.py watches a pidfd: a wait() pending at exit blocks until every pipe closes.

        (On CPython 3.11 a wait() begun after the exit was recorded returns at once; a watcher
        is already waiting when the child dies, and that one blocks.) Run in its own
        interpreter: asyncio's transports complain when their loop closes under them.
        """
        result = subprocess.run(
            [sys.executable, "-c", ASYNCIO_WAIT_PROBE, EXIT_LEAVING_GRANDCHILD],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        assert result.stdout.strip() == "wait() blocked", result.stdout + result.stderr

    async def test_signal_death_reported_as_negative_code(self, marker_prefix: str) -> None:
        """A child killed by SIGKILL reports returncode -9, within milliseconds."""
        child = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], marker_prefix)
        killed_at = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        with fail_after(5):
            await child.exited.wait()
        assert child.returncode == -signal.SIGKILL
        assert time.monotonic() - killed_at < 1.0
        await process.terminate_tree(child, grace=0)


class TestTerminateTree:
    async def test_kills_grandchild_and_setsid_great_grandchild(self, marker_prefix: str) -> None:
        """Teardown leaves nothing alive, including a descendant that left the process group."""
        child = await spawn(server_argv("tree.py"), marker_prefix)
        pids = json.loads((await read_stderr_line(child, "tree: pids")).split(" ", 2)[2])
        assert os.getsid(pids["great_grandchild"]) != os.getsid(child.pid)
        with fail_after(10):
            await process.terminate_tree(child, grace=1)
        assert [name for name, pid in pids.items() if alive(pid)] == []

    async def test_graceful_exit_on_stdin_eof_needs_no_signal(self, marker_prefix: str) -> None:
        """A child that exits on stdin EOF ends with its own code 0, quickly."""
        child = await spawn([sys.executable, "-c", "import sys; sys.stdin.read()"], marker_prefix)
        started = time.monotonic()
        with fail_after(10):
            await process.terminate_tree(child, grace=5)
        assert child.returncode == 0
        assert time.monotonic() - started < 2

    async def test_escalates_to_sigkill_for_a_stubborn_child(self, marker_prefix: str) -> None:
        """A child ignoring stdin EOF and SIGTERM is SIGKILLed after the graces."""
        child = await spawn(server_argv("stubborn.py"), marker_prefix)
        await read_stderr_line(child, "stubborn")
        started = time.monotonic()
        with fail_after(10):
            await process.terminate_tree(child, grace=0.2, term_grace=0.3)
        assert child.returncode == -signal.SIGKILL
        assert time.monotonic() - started < 3

    async def test_hurry_cuts_a_long_grace_short(self, marker_prefix: str) -> None:
        """A forced shutdown (hurry) SIGKILLs a stubborn child without waiting out a 30 s grace."""
        child = await spawn(server_argv("stubborn.py"), marker_prefix)
        await read_stderr_line(child, "stubborn")
        hurry = anyio.Event()
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: process.terminate_tree(child, grace=30, term_grace=30, hurry=hurry))
            await read_stderr_line(child, "stubborn: stdin closed")  # teardown is in its grace now
            hurry.set()
        assert child.returncode == -signal.SIGKILL
        assert time.monotonic() - started < 3

    async def test_finishes_even_when_the_caller_is_cancelled(self, marker_prefix: str) -> None:
        """Teardown is shielded: cancelling the caller does not leave the tree running."""
        child = await spawn(server_argv("tree.py"), marker_prefix)
        pids = json.loads((await read_stderr_line(child, "tree: pids")).split(" ", 2)[2])
        with anyio.CancelScope() as scope:
            scope.cancel()
            await process.terminate_tree(child, grace=0.2)
        assert [pid for pid in pids.values() if alive(pid)] == []

    async def test_a_failing_scan_is_logged_and_the_child_still_dies(
        self, marker_prefix: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bug in the scan never escapes the teardown (a watcher would be left waiting on
        its pipes): it is logged, the child and its group are SIGKILLed, the caller goes on."""
        child = await spawn(server_argv("stubborn.py"), marker_prefix)
        await read_stderr_line(child, "stubborn")
        assert child.cgroup is None  # the scan is the way here

        def broken(**_: object) -> dict[int, proctree.Proc]:
            raise RuntimeError("a scan that breaks")

        monkeypatch.setattr(proctree, "scan", broken)
        with capture_logs() as logs, fail_after(10):
            await process.terminate_tree(child, grace=0.2, term_grace=0.3)
        assert child.returncode == -signal.SIGKILL
        assert child.terminated
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["process.teardown_failed"]


UVLOOP_PIPES_PROBE = """
import os, sys, uvloop
from supervisor.process import children as process
async def main():
    for _ in range(3):
        child = await process.spawn([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                    env=dict(os.environ), cwd=None, marker=sys.argv[1])
        await process.terminate_tree(child, grace=1)
uvloop.run(main())
"""


class TestAttachFailure:
    async def test_a_child_that_cannot_be_attached_is_killed_and_nothing_of_it_stays_open(
        self, marker_prefix: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The last step of a spawn fails (out of fds, say): the error goes on, and the child,
        its pipes and their transports are gone with it."""
        fds_before = len(os.listdir("/proc/self/fd"))

        def out_of_fds(pid: int) -> int:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(process.os, "pidfd_open", out_of_fds)
        with pytest.raises(OSError, match="Too many open files"):
            await spawn([sys.executable, "-c", "import time; time.sleep(60)"], f"{marker_prefix}lost")
        monkeypatch.undo()
        assert proctree.find_marked(f"{marker_prefix}lost") == set()
        await eventually(lambda: len(os.listdir("/proc/self/fd")) == fds_before)

    async def test_a_cgroup_that_cannot_be_killed_still_leaves_the_child_reaped(
        self, marker_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Out of fds, ``cgroup.kill`` cannot be opened either: the child is still reaped and
        forgotten (no zombie the stranger reaper would skip as ours), its cgroup removed."""
        env = {**os.environ, process.MARKER_ENV: f"{marker_prefix}cg"}
        popen = await spawner.popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], env=env, cwd=None, cgroup=None
        )
        leaf = tmp_path / "leaf"
        leaf.mkdir()

        def out_of_fds(cgroup: Path) -> None:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(process.Subtree, "kill", staticmethod(out_of_fds))
        with fail_after(10):
            await process._abandon(popen, leaf)
        assert popen.returncode is not None and popen.pid not in reaper.tracked()
        assert not leaf.exists()


class TestPipesUnderUvloop:
    def test_each_pipe_fd_is_closed_once(self, marker_prefix: str, tmp_path: Path) -> None:
        """uvloop closes a pipe's fd and then its file object again: a second close(2) of a
        number that another thread may have opened in between (a scan's /proc, a pidfd, a
        client's socket: seen as teardowns failing and control connections dropped). Traced:
        no close(2) of the daemon's event loop process fails with EBADF."""
        strace = shutil.which("strace")
        if strace is None:
            pytest.skip("strace is not installed")
        trace = tmp_path / "trace"
        ran = subprocess.run(
            [strace, "-f", "-qq", "-o", str(trace), "-e", "trace=close", sys.executable, "-c",
             UVLOOP_PIPES_PROBE, f"{marker_prefix}uv"],
            capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        )  # fmt: skip
        if ran.returncode != 0 and b"ptrace" in ran.stderr:
            pytest.skip("ptrace is not permitted here")
        assert ran.returncode == 0, ran.stderr.decode()[-2000:]
        twice = [line for line in trace.read_text().splitlines() if "EBADF" in line]
        assert twice == []


class TestProcStat:
    def test_a_whole_line_parses_whatever_the_command_name(self) -> None:
        line = b"4242 (a) b (c) S 1 4242 4242 0 -1 4194304" + b" 0" * 12 + b" 777 0 0\n"
        fields = proctree.parse_stat(line, 20)
        assert fields is not None
        assert (fields[0], fields[1], fields[19]) == (b"S", b"1", b"777")

    def test_an_empty_or_cut_line_reads_as_gone(self) -> None:
        """A process being reaped can show an empty stat: a scan takes it for gone, never fails."""
        whole = b"4242 (python3) S 1 4242 4242 0 -1 4194304" + b" 0" * 12 + b" 777 0 0\n"
        assert proctree.parse_stat(b"", 20) is None
        assert proctree.parse_stat(whole[:40], 20) is None
        assert proctree.parse_stat(b"4242 (pyth", 20) is None

    def test_a_live_process_reads_whole(self) -> None:
        fields = proctree.stat_fields(os.getpid(), 20)
        assert fields is not None
        assert int(fields[1]) == os.getppid()


class TestSweep:
    async def test_sweeps_prefix_but_keeps_own_children(self, marker_prefix: str) -> None:
        """sweep_marked kills what an earlier daemon left and spares the current one's."""
        old = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], f"{marker_prefix}1:")
        ours = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], f"{marker_prefix}2:")
        assert await process.sweep_marked(marker_prefix, keep=f"{marker_prefix}2:") == 1
        with fail_after(5):
            await old.exited.wait()
        assert alive(ours.pid)
        await process.terminate_tree(old, grace=0)
        await process.terminate_tree(ours, grace=0)


class TestDeathSignal:
    def test_child_dies_with_a_sigkilled_parent(self, marker_prefix: str) -> None:
        """PDEATHSIG: SIGKILL of the spawning process takes its direct child down with it."""
        parent_code = (
            "import anyio, os, sys\n"
            "from supervisor.process import children as process\n"
            "async def main():\n"
            "    child = await process.spawn([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
            "                                env=dict(os.environ), cwd=None, marker=sys.argv[1])\n"
            "    print(child.pid, flush=True)\n"
            "    await anyio.sleep(60)\n"
            "anyio.run(main)\n"
        )
        parent = subprocess.Popen([sys.executable, "-c", parent_code, marker_prefix], stdout=subprocess.PIPE)
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
        parent.kill()
        parent.wait(timeout=5)
        deadline = time.monotonic() + 5
        while alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling with a deadline: the child is not ours to wait for
        assert not alive(child_pid)
