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
import itertools
import json
import os
import socket
import time
from collections.abc import Callable

from supervisor.cli.connect import handoff
from supervisor.cli.connect.dial import UnknownProfile, WrongOwner, dial
from supervisor.cli.connect.lines import error_line
from supervisor.cli.connect.loop import Channel, Loop
from supervisor.cli.connect.pump import IN_FLIGHT, RESTARTED, Link, Pump, note
from supervisor.errors import DaemonUnreachable
from supervisor.extension.backoff import Backoff

__all__ = ("EOF_GRACE", "RECONNECT", "UnknownProfile", "command", "gateway_socket", "run")

EOF_GRACE = 2.0  # after stdin ends: how long answers still due (and unread output) are waited for
RECONNECT = Backoff(initial=0.05, maximum=1.0, multiplier=2.0, jitter=0.1)  # jitter: N clients at once
_SWITCH_TIMEOUT = 5.0  # seconds for a handoff on a live link (the daemon waits 10 s for TAKEN)
_NOT_BACK = "the mcp-supervisor daemon did not come back; the request was not sent"
_INPUT_ENDED = "the client closed its input while the mcp-supervisor daemon was restarting; not sent"


def gateway_socket(control_socket: str) -> str:
    """The gateway's socket: ``mcp.sock`` beside the control socket."""
    return os.path.join(os.path.dirname(control_socket), "mcp.sock")


def command(args: argparse.Namespace) -> int:
    """``mcp-supervisor connect``, as parsed by the CLI."""
    path = gateway_socket(args.socket)
    return run(path, reconnect_timeout=args.reconnect_timeout, profile=args.profile)


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
            owner.stdio = (stdin, stdout)
            if handoff.eligible(stdin, stdout):
                sock = dial(loop, socket_path)
                memfd = handoff.offer(sock, stdin, stdout, profile)
                owner.may_switch = True  # refused (out of fds, say): a switch asks again later
                if memfd is not None:
                    return owner.serve_handed(sock, memfd, stdin, stdout)
                sock.close()  # an older daemon, or one out of fds: connect pumps
            sock = dial(loop, socket_path, profile)
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
        self.stdio = (0, 1)  # the client's fds (the pump's channels own dups of them)
        self.may_switch = False  # hand the client over on a live link (after a daemon restart)
        self._tries = handoff.SwitchTries()
        self._id_prefix = f"mcp-supervisor-connect-{os.getpid()}-"  # of connect's own requests
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
        if self._handed(sock, memfd):
            return 0
        return self._until_the_end(None)

    def _handed(self, sock: socket.socket, memfd: int) -> bool:
        """While the daemon serves the client itself: True once the client ended, False when
        the daemon went and the pump carries the client on (its requests in flight failed)."""
        stdin, stdout = self.stdio
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
                return True
            taken = handoff.taken_back(memfd, back)
        finally:
            os.close(memfd)
        pump = self.pump
        pump.attach(self.loop, os.dup(stdin), os.dup(stdout))
        pump.write(b"\n" if taken.mid_line else b"")  # the daemon died mid-answer: end the line
        failed = [request_id for request_id in taken.failed if not self._own(request_id)]
        pump.write(b"".join(error_line(request_id, RESTARTED, IN_FLIGHT) for request_id in failed))
        pump.from_client(taken.unsent)  # held for the next daemon
        return False

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
            if link is not None and self._on(link):
                return True
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

    def _on(self, link: Link) -> bool:
        """Pump on *link* until the client ends (True) or the link does (False: reconnect). While
        nothing is on its way, the client is handed over when connect may (``handoff.SwitchTries``)."""
        pump = self.pump
        while True:  # the pump fails its requests in flight when the link closes
            self._wait(lambda: link.closed or self._switchable(link), self._tries.due())
            if pump.ending:
                return True
            if link.closed:
                self._tries.reset()  # the daemon went: its successor is asked at once
                return False
            if not self._switchable(link):
                continue  # the time for the next try came while the link was busy
            handed = self._switch(link)
            if not isinstance(handed, handoff.NotSwitched):
                return self._handed(*handed)  # False: the daemon went, the pump carries the client on
            if link.closed or link.channel is None or link.channel.closed:  # on_lost comes later
                return False  # ended by the switch: reconnect, the next try still backed off

    def _switchable(self, link: Link) -> bool:
        pump = self.pump
        idle = link.downstream.idle and not link.backlog and not link.dropped and link.channel is not None
        # Not before a request was answered on the link: as its first message, a switch would set
        # the session's protocol era (a 2026-07-28 client's requests are then refused).
        ready = self.may_switch and self._tries.ready() and link.spoken
        return ready and link is pump.live and idle and pump.quiet and link.channel.buffered == 0

    def _switch(self, link: Link) -> tuple[socket.socket, int] | handoff.NotSwitched:
        request_id = self._own_id()
        stdin, stdout = self.stdio
        handed = handoff.switch(self.loop, self.pump, link, stdin, stdout, request_id, _SWITCH_TIMEOUT)
        if not isinstance(handed, handoff.NotSwitched):
            self._tries.reset()
            note(f"handed the client over to the daemon on {self.path} again")
        elif handed.final:
            self._tries.never()
            note(f"the daemon on {self.path} cannot take the client over ({handed.reason}); pumping on")
        else:
            delay = self._tries.failed()
            why = f"could not hand the client over to the daemon on {self.path} ({handed.reason})"
            note(f"{why}; trying again in {delay:.1f} s")
        return handed

    def _own_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    def _own(self, request_id: object) -> bool:
        """Whether *request_id* is one of connect's own requests (no error of ours for it)."""
        return isinstance(request_id, str) and request_id.startswith(self._id_prefix)

    def _redial(self) -> Link | None:
        """A new connection, trying with backoff until the deadline; None when giving up or ending."""
        assert self._deadline is not None
        attempt = 0
        while not self.pump.ending:
            attempt += 1
            try:
                return self._open(dial(self.loop, self.path, self.profile, lambda: self.pump.ending))
            except (WrongOwner, UnknownProfile) as exc:
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
            request_id = self._own_id()
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
