"""``mcp-supervisor connect``: an MCP client's stdio, pumped to the daemon's gateway socket.

Bytes pass through untouched both ways (``pump``); ``resume`` looks at just enough of each line
to know the requests in flight and the session's set-up. When the daemon goes away (a restart,
an upgrade), connect keeps the client's stdio open, reconnects with backoff, replays the set-up
(``initialize`` under an id of its own, whose answer it drops, then ``notifications/initialized``)
and tells the client to re-list; requests in flight at the break get an error, since they may
or may not have run. Lines that arrive meanwhile are held, a few, and sent once reconnected:
they never reached a daemon, so sending them later is not a replay.

Resource handling: :func:`run` owns its loop (:mod:`.loop`, selectors and no asyncio: connect
starts in a few tens of milliseconds and stays small), its connections and dups of the two
fds, whose blocking mode it restores on return. The bytes move in the loop's callbacks; the
owner (reconnect, resume, the end) waits in ``Loop.run_until``, one thing at a time. Nothing
but protocol bytes goes to stdout; notes go to stderr.

Error handling: no daemon of our uid at the start, or none back within the reconnect timeout,
is :class:`~supervisor.errors.DaemonUnreachable` (exit 3 in the CLI); a profile the daemon does
not know, :class:`UnknownProfile` (exit 2).

Profiles: with ``--profile NAME``, each connection (the first and every reconnection) starts
with one line of our own, a ``mcp-supervisor/profile`` request, and its answer, before the
client's first byte; the pump itself never sees either.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import json
import os
import socket
import time
from collections.abc import Callable

from supervisor import peers
from supervisor.cli.connect import handoff
from supervisor.cli.connect.lines import error_line
from supervisor.cli.connect.loop import Channel, Loop
from supervisor.cli.connect.pump import IN_FLIGHT, RESTARTED, Link, Pump, note
from supervisor.errors import ConfigError, DaemonUnreachable
from supervisor.extension.backoff import Backoff
from supervisor.gateway.hello import HELLO_METHOD

__all__ = ("EOF_GRACE", "RECONNECT", "UnknownProfile", "command", "gateway_socket", "run")

EOF_GRACE = 2.0  # after stdin ends: how long answers still due (and unread output) are waited for
RECONNECT = Backoff(initial=0.05, maximum=1.0, multiplier=2.0, jitter=0.1)  # jitter: N clients at once
_HELLO_ID = "mcp-supervisor-connect-profile"
_HELLO_TIMEOUT = 10.0  # seconds for the daemon to answer the profile line
_HELLO_MAX = 65536  # bytes of that answer
_BUSY_TIMEOUT = 1.0  # seconds to retry a listener whose backlog is full
_NOBODY_THERE = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR})
_NOT_BACK = "the mcp-supervisor daemon did not come back; the request was not sent"
_INPUT_ENDED = "the client closed its input while the mcp-supervisor daemon was restarting; not sent"


def gateway_socket(control_socket: str) -> str:
    """The gateway's socket: ``mcp.sock`` beside the control socket."""
    return os.path.join(os.path.dirname(control_socket), "mcp.sock")


def command(args: argparse.Namespace) -> int:
    """``mcp-supervisor connect``, as parsed by the CLI."""
    path = gateway_socket(args.socket)
    return run(path, reconnect_timeout=args.reconnect_timeout, profile=args.profile)


class _WrongOwner(DaemonUnreachable):
    """Something of another uid listens on the socket; nothing was sent to it."""


class UnknownProfile(ConfigError):
    """The daemon has no profile of that name (its answer says which it has)."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


def _connected(loop: Loop, path: str, stop: Callable[[], bool]) -> socket.socket:
    """A non-blocking socket connected to *path*; a listener with a full backlog is retried a while
    (serving the loop, until *stop()*)."""
    busy_until = time.monotonic() + _BUSY_TIMEOUT
    sock: socket.socket | None = None
    while True:
        try:
            sock = sock or socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect(path)
            return sock
        except BlockingIOError:  # EAGAIN: the daemon is not accepting as fast as clients come
            if time.monotonic() < busy_until and not stop():
                loop.pause(0.01)
                continue
            reason = f"the daemon on {path} is not accepting connections"
        except PermissionError:
            reason = f"permission denied connecting to {path}"
        except OSError as exc:  # nothing there, or no fd to spare (EMFILE): a redial tries again
            nobody = exc.errno in _NOBODY_THERE
            reason = None if nobody else f"cannot connect to {path}: {exc.strerror or exc}"
        if sock is not None:
            sock.close()
        raise DaemonUnreachable(path, reason)


def _choose(loop: Loop, sock: socket.socket, path: str, profile: str, stop: Callable[[], bool]) -> None:
    """Send the profile line and read its answer, which is all the daemon sends until we speak
    (serving the loop meanwhile, until *stop()*)."""
    hello = {"jsonrpc": "2.0", "id": _HELLO_ID, "method": HELLO_METHOD, "params": {"name": profile}}
    answer = bytearray()
    ended = False

    def read(data: bytes) -> None:
        answer.extend(data)

    def lost(_: OSError | None) -> None:
        nonlocal ended
        ended = True

    def done() -> bool:
        return ended or stop() or b"\n" in answer or len(answer) >= _HELLO_MAX

    # A throwaway channel on a dup: the link gets the socket itself, unread and untouched.
    channel = Channel(loop, os.dup(sock.fileno()), on_data=read, on_lost=lost)
    try:
        channel.write(json.dumps(hello).encode() + b"\n")
        loop.run_until(done, _HELLO_TIMEOUT)
    finally:
        channel.abort()
    try:
        reply = json.loads(answer.partition(b"\n")[0]) if b"\n" in answer else None
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise DaemonUnreachable(path, f"the daemon on {path} did not answer the profile request")
    error = reply.get("error")
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else None
        raise UnknownProfile(str(message or f"the daemon refused profile {profile!r}"))


def _dial(
    loop: Loop, path: str, profile: str | None = None, stop: Callable[[], bool] = lambda: False
) -> socket.socket:
    """A socket connected to *path*, once the daemon is known to run as our uid (or root).

    With a *profile*, the daemon has accepted it (:class:`UnknownProfile` if not). Waits end
    early when *stop()* (the client went, mid-redial).
    """
    sock = _connected(loop, path, stop)
    try:
        peers.check(sock, path)
        if profile is not None:
            _choose(loop, sock, path, profile, stop)
    except peers.UntrustedPeer as exc:
        sock.close()
        raise _WrongOwner(path, str(exc)) from None
    except OSError as exc:
        sock.close()
        raise DaemonUnreachable(path, f"cannot connect to {path}: {exc.strerror or exc}") from None
    except BaseException:
        sock.close()
        raise
    return sock


def run(
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
    loop = Loop()
    try:
        blocking = [(fd, os.get_blocking(fd)) for fd in {stdin, stdout}]
        try:
            owner = _Owner(loop, socket_path, reconnect_timeout, profile)
            if handoff.eligible(stdin, stdout):
                sock = _dial(loop, socket_path)
                memfd = handoff.offer(sock, stdin, stdout, profile)
                if memfd is not None:
                    return owner.serve_handed(sock, memfd, stdin, stdout)
                sock.close()  # an older daemon, or one out of fds: connect pumps
            sock = _dial(loop, socket_path, profile)
            return owner.serve(sock, os.dup(stdin), os.dup(stdout))
        finally:
            for fd, mode in blocking:  # the fds may be shared with the client's terminal
                os.set_blocking(fd, mode)
    finally:
        loop.close()


class _Owner:
    """Runs the connections one after another: reconnect, resume, and when to stop."""

    def __init__(self, loop: Loop, path: str, reconnect_timeout: float, profile: str | None = None) -> None:
        self.loop, self.path, self.reconnect_timeout, self.profile = loop, path, reconnect_timeout, profile
        self.pump = Pump()
        self.gave_up: str | None = None
        self._deadline: float | None = None  # of the current reconnection
        self._ids = itertools.count(1)

    def serve(self, sock: socket.socket, stdin: int, stdout: int) -> int:
        """Serve until the client's input ends (0) or the daemon is given up on (raises)."""
        pump = self.pump
        pump.attach(self.loop, stdin, stdout)
        pump.live = link = self._open(sock)
        return self._until_the_end(link)

    def serve_handed(self, sock: socket.socket, memfd: int, stdin: int, stdout: int) -> int:
        """Wait while the daemon serves the client on *stdin* and *stdout* itself; if it dies, carry
        the client on from its journal (*memfd*) and serve as :meth:`serve` does."""
        back = handoff.BackLines(self.pump.memory)
        ended = False

        def lost(_: OSError | None) -> None:
            nonlocal ended
            ended = True

        channel = Channel(self.loop, sock.detach(), on_data=back.feed, on_lost=lost)
        try:
            self.loop.run_until(lambda: ended or back.bye)
            channel.abort()
            if back.bye:
                return 0
            taken = handoff.taken_back(memfd, back)
        finally:
            os.close(memfd)
        pump = self.pump
        pump.attach(self.loop, os.dup(stdin), os.dup(stdout))
        pump.write(b"\n" if taken.mid_line else b"")  # the daemon died mid-answer: end the line
        pump.write(b"".join(error_line(failed, RESTARTED, IN_FLIGHT) for failed in taken.failed))
        pump.from_client(taken.unsent)  # held for the next daemon
        return self._until_the_end(None)

    def _until_the_end(self, link: Link | None) -> int:
        try:
            if self._connections(link):
                self._finish()
        finally:
            self._close()
        if self.gave_up is not None:
            raise DaemonUnreachable(self.path, self.gave_up)
        return 0

    def _wait(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Serve until *done()*, the client's end, or *timeout*."""
        pump = self.pump
        self.loop.run_until(lambda: pump.ending or done(), timeout)

    def _finish(self) -> None:
        """The client's input ended (or its output went): the answers still due, within a grace."""
        pump = self.pump
        if pump.gone:
            return
        if pump.live is None:
            pump.answer_held(_INPUT_ENDED)
        elif pump.waiting():
            self.loop.run_until(lambda: pump.drained, EOF_GRACE)

    def _close(self) -> None:
        pump = self.pump
        for link in list(pump.links):
            link.abort()
        if pump.stdin is not None:
            pump.stdin.abort()
        self.loop.settle()  # a link's end may still end a half-written line on stdout
        if pump.stdout is not None:  # let the last answers out, within the grace
            stdout = pump.stdout
            stdout.close()
            if not self.loop.run_until(lambda: stdout.closed, EOF_GRACE):
                stdout.abort()  # the client stopped reading: give up on it
            self.loop.settle()

    def _open(self, sock: socket.socket) -> Link:
        link = Link(self.pump)
        self.pump.link(self.loop, sock.detach(), link)
        return link

    def _connections(self, link: Link | None) -> bool:
        """Keep a live link until the client ends (True) or the daemon is given up on (False).
        None: the daemon is gone already."""
        pump = self.pump
        while True:
            if link is not None:  # the pump fails its requests in flight when the link closes
                self._wait(lambda current=link: current.closed)
            if pump.ending:
                return True
            if self._deadline is None:
                self._deadline = time.monotonic() + self.reconnect_timeout
                note(f"lost the daemon on {self.path}; reconnecting for up to {self.reconnect_timeout:g} s")
            next_link = None if self.gave_up is not None else self._redial()
            if next_link is None:
                if pump.ending and self.gave_up is None:
                    return True
                pump.answer_held(_NOT_BACK)
                return False
            link = next_link
            if not self._resume(link):
                link.abort()

    def _redial(self) -> Link | None:
        """A new connection, trying with backoff until the deadline; None when giving up or ending."""
        assert self._deadline is not None
        attempt = 0
        while not self.pump.ending:
            attempt += 1
            try:
                return self._open(_dial(self.loop, self.path, self.profile, lambda: self.pump.ending))
            except (_WrongOwner, UnknownProfile) as exc:
                self.gave_up = str(exc)
                return None
            except DaemonUnreachable:
                pass
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                timeout = f"{self.reconnect_timeout:g} s"
                self.gave_up = f"the daemon on {self.path} went away and did not come back within {timeout}"
                return None
            self._wait(lambda: False, min(RECONNECT.delay(attempt), remaining))
        return None

    def _resume(self, link: Link) -> bool:
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
            self._wait(lambda: link.answered, self._deadline - time.monotonic())
            answer = link.initialize_answer
            if answer is None:
                return False  # it closed, the client ended, or the deadline passed (the next dial gives up)
            if "error" in answer:
                error = answer["error"]
                reason = error.get("message") if isinstance(error, dict) else error
                self.gave_up = f"the restarted daemon on {self.path} would not resume the session: {reason}"
                return False
        if link.closed:
            return False
        link.write(lines)
        pump.send_held(link)  # nothing ran since the write above: nothing can overtake the held lines
        pump.live, self._deadline = link, None
        note(f"reconnected to the daemon on {self.path}")
        pump.write(pump.changes(link))
        return True
