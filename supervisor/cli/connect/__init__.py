"""``mcp-supervisor connect``: an MCP client's stdio, pumped to the daemon's gateway socket.

Bytes pass through untouched both ways (``pump``); ``resume`` looks at just enough of each line
to know the requests in flight and the session's set-up. When the daemon goes away (a restart,
an upgrade), connect keeps the client's stdio open, reconnects with backoff, replays the set-up
(``initialize`` under an id of its own, whose answer it drops, then ``notifications/initialized``)
and tells the client to re-list; requests in flight at the break get an error, since they may
or may not have run. Lines that arrive meanwhile are held, a few, and sent once reconnected:
they never reached a daemon, so sending them later is not a replay.

Resource handling: :func:`run` owns its connections and the two fds, whose blocking mode it
restores on return. One owner task runs the connections one after another; the bytes move in
protocol callbacks. Nothing but protocol bytes goes to stdout; notes go to stderr.

Error handling: no daemon of our uid at the start, or none back within the reconnect timeout,
is :class:`~supervisor.control.client.DaemonUnreachable` (exit 3 in the CLI); a profile the daemon does
not know, :class:`UnknownProfile` (exit 2).

Profiles: with ``--profile NAME``, each connection (the first and every reconnection) starts
with one line of our own, a ``mcp-supervisor/profile`` request, and its answer, before the
client's first byte; the pump itself never sees either.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import socket
import stat

import anyio
import anyio.abc
import anyio.to_thread

from supervisor import sockets
from supervisor.cli.connect.pump import ClientIn, ClientOut, Link, Pump, note
from supervisor.control.client import DaemonUnreachable
from supervisor.errors import ConfigError
from supervisor.extension.backoff import Backoff
from supervisor.gateway.hello import HELLO_METHOD

__all__ = ("EOF_GRACE", "RECONNECT", "UnknownProfile", "gateway_socket", "run")

EOF_GRACE = 2.0  # after stdin ends: how long answers still due (and unread output) are waited for
RECONNECT = Backoff(initial=0.05, maximum=1.0, multiplier=2.0, jitter=0.1)  # jitter: N clients at once
_READ = 65536
_HELLO_ID = "mcp-supervisor-connect-profile"
_HELLO_TIMEOUT = 10.0  # seconds for the daemon to answer the profile line
_HELLO_MAX = 65536  # bytes of that answer
_NOBODY_THERE = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR})
_NOT_BACK = "the mcp-supervisor daemon did not come back; the request was not sent"
_INPUT_ENDED = "the client closed its input while the mcp-supervisor daemon was restarting; not sent"


def gateway_socket(control_socket: str) -> str:
    """The gateway's socket: ``mcp.sock`` beside the control socket."""
    return os.path.join(os.path.dirname(control_socket), "mcp.sock")


class _WrongOwner(DaemonUnreachable):
    """Something of another uid listens on the socket; nothing was sent to it."""


class UnknownProfile(ConfigError):
    """The daemon has no profile of that name (its answer says which it has)."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


async def _choose(stream: anyio.abc.SocketStream, path: str, profile: str) -> None:
    """Send the profile line and read its answer, which is all the daemon sends until we speak."""
    hello = {"jsonrpc": "2.0", "id": _HELLO_ID, "method": HELLO_METHOD, "params": {"name": profile}}
    await stream.send(json.dumps(hello).encode() + b"\n")
    answer = b""
    try:
        with anyio.fail_after(_HELLO_TIMEOUT):
            while b"\n" not in answer and len(answer) < _HELLO_MAX:
                answer += await stream.receive()
        reply = json.loads(answer.partition(b"\n")[0])
    except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError):
        raise DaemonUnreachable(path, f"the daemon on {path} did not answer the profile request") from None
    error = reply.get("error") if isinstance(reply, dict) else None
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else None
        raise UnknownProfile(str(message or f"the daemon refused profile {profile!r}"))


async def _dial(path: str, profile: str | None = None) -> socket.socket:
    """A socket connected to *path*, once the daemon is known to run as our uid (or root).

    With a *profile*, the daemon has accepted it (:class:`UnknownProfile` if not).
    """
    try:
        stream = await sockets.connect(path)
    except sockets.UntrustedPeer as exc:
        raise _WrongOwner(path, str(exc)) from None
    except PermissionError:
        raise DaemonUnreachable(path, f"permission denied connecting to {path}") from None
    except OSError as exc:
        if exc.errno in _NOBODY_THERE:
            raise DaemonUnreachable(path) from None
        raise DaemonUnreachable(path, f"cannot connect to {path}: {exc.strerror or exc}") from None
    if profile is not None:
        try:
            await _choose(stream, path, profile)
        except BaseException:
            await stream.aclose()
            raise
    raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    return socket.socket(fileno=raw.detach())


def _pollable(fd: int) -> bool:
    """Whether epoll can watch *fd* (pipes, sockets, terminals; not files or /dev/null)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


async def run(
    socket_path: str,
    *,
    reconnect_timeout: float = 60.0,
    profile: str | None = None,
    stdin: int = 0,
    stdout: int = 1,
) -> int:
    """Pump *stdin*/*stdout* to the gateway socket at *socket_path* until stdin ends; return 0.

    Raises:
        DaemonUnreachable: nothing listens at *socket_path*, a process of another uid does (no
            byte is sent to it), or the daemon went away and did not come back (or would not
            resume the session) within *reconnect_timeout* seconds.
        UnknownProfile: the daemon has no *profile* (at the start; after a restart, the daemon
            is given up on as unreachable, saying why).
    """
    sock = await _dial(socket_path, profile)
    blocking = [(fd, os.get_blocking(fd)) for fd in {stdin, stdout}]
    try:
        return await _Owner(socket_path, reconnect_timeout, profile).serve(sock, stdin, stdout)
    finally:
        for fd, mode in blocking:  # the fds may be shared with the client's terminal
            os.set_blocking(fd, mode)


class _Owner:
    """Runs the connections one after another: reconnect, resume, and when to stop."""

    def __init__(self, path: str, reconnect_timeout: float, profile: str | None = None) -> None:
        self.path, self.reconnect_timeout, self.profile = path, reconnect_timeout, profile
        self.pump = Pump()
        self.gave_up: str | None = None
        self._deadline: float | None = None  # of the current reconnection
        self._ids = itertools.count(1)
        self._scope = anyio.CancelScope()

    async def serve(self, sock: socket.socket, stdin: int, stdout: int) -> int:
        loop, pump = asyncio.get_running_loop(), self.pump
        out = ClientOut(pump)
        if _pollable(stdout):  # a dup: the transport closes its file, fd 1 stays ours
            pipe = os.fdopen(os.dup(stdout), "wb", buffering=0)
            pump.stdout, _ = await loop.connect_write_pipe(lambda: out, pipe)
        else:
            pump.stdout_fd = stdout  # a file: plain blocking writes
        pump.live = link = await self._open(sock)
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    if _pollable(stdin):
                        pipe = os.fdopen(os.dup(stdin), "rb", buffering=0)
                        pump.stdin, _ = await loop.connect_read_pipe(lambda: ClientIn(pump), pipe)
                    else:
                        tg.start_soon(self._read_file, stdin)
                    tg.start_soon(self._watch_end)
                    await self._connections(link)
        finally:
            await self._close(out)
        if self.gave_up is not None:
            raise DaemonUnreachable(self.path, self.gave_up)
        return 0

    async def _close(self, out: ClientOut) -> None:
        pump = self.pump
        for link in list(pump.links):
            if link.transport is not None:
                link.transport.abort()
        if pump.stdin is not None:
            pump.stdin.close()
        if pump.stdout is not None:  # let the last answers out, within the grace
            pump.stdout.close()
            with anyio.move_on_after(EOF_GRACE, shield=True):
                await out.flushed.wait()
            if not out.flushed.is_set():  # the client stopped reading: give up on it
                pump.stdout.abort()

    async def _read_file(self, fd: int) -> None:
        while chunk := await anyio.to_thread.run_sync(os.read, fd, _READ, abandon_on_cancel=True):
            self.pump.from_client(chunk)
            while self.pump.stdin_paused:
                await self.pump.stdin_resumed.wait()
        self.pump.client_ended()

    async def _watch_end(self) -> None:
        pump = self.pump
        await pump.ending.wait()
        if not pump.gone and pump.live is None:
            pump.answer_held(_INPUT_ENDED)
        elif not pump.gone and pump.waiting():
            with anyio.move_on_after(EOF_GRACE):
                await pump.drained.wait()
        self._scope.cancel()

    async def _open(self, sock: socket.socket) -> Link:
        link = Link(self.pump)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(link.protocol, sock=sock)
        self.pump.link(transport, link)
        return link

    async def _connections(self, link: Link) -> None:
        while True:
            await link.closed.wait()  # the pump failed its requests in flight already
            if self.pump.ending.is_set():
                return  # _watch_end finishes
            if self._deadline is None:
                self._deadline = anyio.current_time() + self.reconnect_timeout
                note(f"lost the daemon on {self.path}; reconnecting for up to {self.reconnect_timeout:g} s")
            next_link = None if self.gave_up is not None else await self._redial()
            if next_link is None:
                self.pump.answer_held(_NOT_BACK)
                self._scope.cancel()
                return
            link = next_link
            if not await self._resume(link) and link.transport is not None:
                link.transport.abort()

    async def _redial(self) -> Link | None:
        """A new connection, trying with backoff until the deadline; None when giving up."""
        assert self._deadline is not None
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._open(await _dial(self.path, self.profile))
            except (_WrongOwner, UnknownProfile) as exc:
                self.gave_up = str(exc)
                return None
            except (DaemonUnreachable, OSError):
                pass
            remaining = self._deadline - anyio.current_time()
            if remaining <= 0:
                timeout = f"{self.reconnect_timeout:g} s"
                self.gave_up = f"the daemon on {self.path} went away and did not come back within {timeout}"
                return None
            await anyio.sleep(min(RECONNECT.delay(attempt), remaining))

    async def _resume(self, link: Link) -> bool:
        """Replay the session's set-up on *link*, send what was held, and make it live."""
        assert self._deadline is not None
        pump = self.pump

        def new_id() -> str:
            request_id = f"mcp-supervisor-connect-{os.getpid()}-{next(self._ids)}"
            link.dropped.add(request_id)
            return request_id

        initialize, lines = pump.memory.replay(new_id)
        if initialize is not None:
            link.initialize_id = initialize["id"]
            link.write([json.dumps(initialize).encode()])
            with anyio.move_on_after(self._deadline - anyio.current_time()):
                await link.answered.wait()
            answer = link.initialize_answer
            if answer is None:
                return False  # it closed, or the deadline passed (the next dial gives up)
            if "error" in answer:
                error = answer["error"]
                reason = error.get("message") if isinstance(error, dict) else error
                self.gave_up = f"the restarted daemon on {self.path} would not resume the session: {reason}"
                return False
        if link.closed.is_set():
            return False
        link.write(lines)
        pump.send_held(link)  # no await since the write above: nothing can overtake the held lines
        pump.live, self._deadline = link, None
        note(f"reconnected to the daemon on {self.path}")
        pump.write(pump.changes(link))
        return True
