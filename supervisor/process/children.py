"""Child processes: spawn in a session of their own, notice exit at once, kill the whole tree.

Exit detection uses a pidfd watched by the event loop, and we reap the child ourselves.
``asyncio``'s ``Process.wait()`` is not enough: on CPython 3.11 it resolves only once every
pipe is closed, so a grandchild holding stdout hides the exit (tests/process/test_children.py shows it).

Spawning (:mod:`supervisor.process.spawner`) runs no Python code in the child and never blocks the
event loop. Where the daemon has a cgroup sub-tree (:func:`contain_in`), each run gets a
cgroup of its own, joined before the extension's first instruction, and teardown is exact:
SIGTERM to its members, then ``cgroup.kill``, waiting on ``cgroup.events``. Elsewhere the
tree is found by scanning ``/proc`` (:mod:`supervisor.process.tree`: the environment marker,
sessions, process groups, parent links, orphans handed to a subreaper daemon) and killed by
pidfd, stopping what it finds until a scan finds nothing new. A daemon start sweeps what a
crashed earlier daemon left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import signal
import struct
import subprocess
import termios
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

import anyio
import structlog

from supervisor.process import reaper, spawner
from supervisor.process import tree as proctree
from supervisor.process.cgroups import Subtree
from supervisor.process.teardown import terminate_tree
from supervisor.process.tree import MARKER_ENV, find_marked

__all__ = (
    "MARKER_ENV",
    "ChildProcess",
    "PipeReader",
    "Wrap",
    "contain_in",
    "find_marked",
    "spawn",
    "sweep_marked",
    "terminate_tree",
)

log = structlog.get_logger(__name__)

# (resolved argv, complete env, cwd) -> the argv and env to start instead: a launcher in front.
Wrap = Callable[[Sequence[str], Mapping[str, str], "str | None"], tuple[list[str], dict[str, str]]]


@dataclass(slots=True)
class _Containment:
    subtree: Subtree | None = None
    prefix: str = ""  # the daemon's marker prefix, left out of cgroup names


_containment = _Containment()  # process-wide, like the cgroup and the subreaper bit it stands for


def contain_in(subtree: Subtree | None, *, prefix: str = "") -> None:
    """Spawn every later child into its own cgroup under *subtree* (None: the scan fallback).

    Called once by the daemon at startup; *prefix* (the daemon's marker prefix) is dropped
    from the cgroup names, which are ``<extension>-<run id>``.
    """
    _containment.subtree, _containment.prefix = subtree, prefix


class PipeReader(asyncio.Protocol):
    """One pipe from the child, read in chunks, with at most *high_water* bytes buffered.

    Unlike ``asyncio.StreamReader`` it can tell when nothing is left in flight
    (:meth:`drained`): once a dead child's last bytes are delivered, its session can end
    at once, even while a grandchild keeps the pipe open.
    """

    def __init__(self, high_water: int = 1 << 20) -> None:
        self._buffer = bytearray()
        self._high_water = high_water
        # Offered each chunk that arrives while a reader waits with nothing buffered: True if it
        # took the chunk there and then (it is never buffered, nor the reader woken for it).
        self.take_at_once: Callable[[bytes], bool] | None = None
        self._eof = False
        self._paused = False
        self._ready: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.ReadTransport, transport)  # uvloop's are not asyncio's subclasses

    def data_received(self, data: bytes) -> None:
        taker = self.take_at_once
        if self._ready is not None and not self._buffer and taker is not None and taker(data):
            return
        self._buffer += data
        if len(self._buffer) >= self._high_water and not self._paused and self._transport:
            self._transport.pause_reading()  # backpressure: the child blocks on a full pipe
            self._paused = True
        self._wake()

    def eof_received(self) -> None:
        self._eof = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    async def read(self) -> bytes:
        """Everything buffered, waiting for at least one byte; ``b""`` at end of file."""
        while not self._buffer and not self._eof:
            self._ready = asyncio.get_running_loop().create_future()
            try:
                await self._ready
            finally:
                self._ready = None
        data = bytes(self._buffer)
        self._buffer.clear()
        if self._paused and self._transport:
            self._paused = False
            self._transport.resume_reading()
        return data

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    @property
    def buffered(self) -> int:
        """Bytes read from the pipe and not yet handed out (bounded by high_water plus one read)."""
        return len(self._buffer)

    def drained(self) -> bool:
        """Nothing buffered here and nothing waiting in the kernel's pipe."""
        return not self._buffer and (self._eof or _bytes_in_pipe(self._transport) == 0)


def _bytes_in_pipe(transport: asyncio.ReadTransport | None) -> int:
    pipe = transport.get_extra_info("pipe") if transport else None
    if pipe is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, ValueError):  # closed meanwhile
        return 0


@dataclass(eq=False)
class ChildProcess:
    """A running child with non-blocking pipes and an exit event.

    Resource handling: created by :func:`spawn`; :func:`terminate_tree` kills it and its
    descendants, closes the pipes and removes its cgroup. The exit event fires when the
    child itself exits, whatever its descendants do with the pipes.
    """

    pid: int
    marker: str
    stdin: asyncio.StreamWriter
    stdout: PipeReader
    stderr: PipeReader
    exited: anyio.Event
    _popen: subprocess.Popen[bytes]
    _pipes: tuple[asyncio.BaseTransport, ...]
    cgroup: Path | None = None  # this run's own cgroup, when the daemon has a sub-tree
    started: int | None = None  # its start time: tells it apart from a later process with its pid
    returncode: int | None = None
    exited_at: datetime | None = None  # when the exit was noticed (wall clock)
    terminated: bool = False  # terminate_tree() has run to the end
    _pidfd: int = -1

    @property
    def pgid(self) -> int:
        return self.pid  # start_new_session: the child leads its group; never ask getpgid() after reaping

    def _on_pidfd_readable(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        try:
            _, status = os.waitpid(self.pid, 0)  # the pidfd says it exited: this cannot block
            self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere; the code is lost
            self.returncode = 255
        reaper.untrack(self.pid)
        self._popen.returncode = self.returncode  # so Popen.__del__ does not track it as running
        self.exited_at = datetime.now(UTC)
        self.exited.set()

    def signal(self, sig: int) -> None:
        """Signal the child itself through its pidfd (never a reused pid)."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.stdin.close()

    def close_pipes(self) -> None:
        """Close our ends of all three pipes. Idempotent."""
        for transport in self._pipes:
            transport.close()


async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    marker: str,
    pipe_limit: int = 1 << 20,
    wrap: Wrap | None = None,
) -> ChildProcess:
    """Start *argv* in a new session with stdio pipes; it dies with the daemon (PDEATHSIG).

    *env* is the complete environment; the marker is added to it. With a cgroup sub-tree
    (:func:`contain_in`) the child runs in a new cgroup of its own.

    *wrap*, given the resolved command line, returns the one to start instead (the sandbox's
    launcher, which execs the command in the same process).

    Error handling: raises :class:`SpawnError`, ``permanent`` when retrying cannot help.
    """
    env = {**env, MARKER_ENV: marker}
    command = spawner.resolve(argv[0], env=env, cwd=cwd)
    full = [command, *argv[1:]]
    if wrap is not None:
        full, env = wrap(full, env, cwd)
    subtree = _containment.subtree
    with anyio.CancelScope(shield=True):  # a cancel here would leave a child nobody watches
        leaf = subtree.leaf(marker.removeprefix(_containment.prefix).replace(":", "-")) if subtree else None
        try:
            popen = await spawner.popen(full, env=env, cwd=cwd, cgroup=leaf)
        except BaseException:
            if leaf is not None:
                Subtree.remove(leaf)
            raise
        return await _attach(popen, marker, pipe_limit, leaf)


async def _attach(
    popen: subprocess.Popen[bytes], marker: str, pipe_limit: int, cgroup: Path | None
) -> ChildProcess:
    """The running *popen* as a :class:`ChildProcess`. Should any step fail (out of fds), the
    child is killed and reaped and what was opened for it is closed, before the error goes on."""
    loop = asyncio.get_running_loop()
    assert popen.stdin and popen.stdout and popen.stderr
    transports: list[asyncio.BaseTransport] = []
    try:
        stdout, stderr = PipeReader(pipe_limit), PipeReader(pipe_limit)
        out_transport = await _connect(loop, transports, lambda: stdout, popen.stdout)
        err_transport = await _connect(loop, transports, lambda: stderr, popen.stderr)
        write_protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())  # provides drain() flow control
        in_transport = await _connect(loop, transports, lambda: write_protocol, popen.stdin)
        stdin = asyncio.StreamWriter(in_transport, write_protocol, None, loop)
        pipes = (in_transport, out_transport, err_transport)
        child = ChildProcess(popen.pid, marker, stdin, stdout, stderr, anyio.Event(), popen, pipes, cgroup)
        child._pidfd = os.pidfd_open(popen.pid)  # unreaped (tracked by the reaper): cannot be reused
    except BaseException:
        for transport in transports:
            transport.close()
        await _abandon(popen, cgroup)
        raise
    child.started = proctree.start_time(popen.pid)
    loop.add_reader(child._pidfd, child._on_pidfd_readable)
    return child


async def _connect(
    loop: asyncio.AbstractEventLoop,
    transports: list[asyncio.BaseTransport],
    protocol: Callable[[], asyncio.BaseProtocol],
    pipe: IO[bytes],
) -> Any:
    """A transport of *loop* for *pipe*, added to *transports*; the pipe is closed if that fails."""
    owned = _pipe_for(loop, pipe)
    try:
        if owned.writable():
            transport, _ = await loop.connect_write_pipe(protocol, owned)
        else:
            transport, _ = await loop.connect_read_pipe(protocol, owned)
    except BaseException:
        if owned.closefd:
            owned.close()
        else:  # uvloop would have closed it once its transport existed; there is none
            os.close(owned.fileno())
        raise
    transports.append(transport)
    return transport


async def _abandon(popen: subprocess.Popen[bytes], cgroup: Path | None) -> None:
    """Kill and reap a child that could not be attached, close its pipes, remove its cgroup."""
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)  # unreaped: its group id is still its own
    try:
        if cgroup is not None:
            with contextlib.suppress(OSError):  # out of fds, say: what just failed the attach
                Subtree.kill(cgroup)
    finally:
        await anyio.to_thread.run_sync(popen.wait)
        reaper.untrack(popen.pid)
    if cgroup is not None:
        Subtree.remove(cgroup)


def _pipe_for(loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> IO[bytes]:
    """*pipe* as a pipe transport of *loop* must get it: closed exactly once when it closes.

    uvloop closes the fd itself (libuv) and then the file object too: a second ``close(2)`` of
    the same number, which in a process with threads closes whatever another thread opened in
    between (a scan's ``/proc`` directory or stat file, a pidfd, a client's socket). So the fd
    moves to a file object that owns it (asyncio closes it through that), or that does not
    (libuv closes it), and *pipe* closes its own number now, before any transport exists.
    """
    fd = os.dup(pipe.fileno())
    mode = "wb" if pipe.writable() else "rb"
    pipe.close()
    return open(fd, mode, buffering=0, closefd=not _loop_closes_fds(loop))


def _loop_closes_fds(loop: asyncio.AbstractEventLoop) -> bool:
    return type(loop).__module__.partition(".")[0] == "uvloop"


async def sweep_marked(prefix: str, *, keep: str | None = None) -> int:
    """SIGKILL every tree whose marker starts with *prefix* (except marker prefix *keep*).

    For what a crashed earlier daemon left behind; returns how many processes were killed.
    """

    find = functools.partial(proctree.members, prefix=prefix, keep=keep)
    return await anyio.to_thread.run_sync(functools.partial(proctree.kill_tree, find))
