"""connect's side of fd passing: hand the client's stdio to the daemon, and take it back if it dies.

When stdin and stdout are pipes or sockets, connect offers them to the daemon (SCM_RIGHTS on
``mcp.sock``), which then reads and writes the client directly: no byte passes through
connect, which waits on the socket. The daemon answers with the session's journal
(:mod:`supervisor.gateway.handoff.journal`) and tells connect, in short lines on the socket,
what it would need to resume the session elsewhere (:class:`BackLines`). The socket ending
with a bye means the client ended; ending without one means the daemon is gone, and connect
carries the client on itself (:func:`taken_back`), as it does when it pumps.

``MCP_SUPERVISOR_HANDOFF=0`` in connect's environment keeps it pumping.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from supervisor.cli.connect.lines import Kind, RequestId, is_id, peek
from supervisor.cli.connect.loop import Loop
from supervisor.cli.connect.pump import Link, Pump
from supervisor.cli.connect.resume import SessionMemory
from supervisor.extension.backoff import Backoff
from supervisor.gateway.handoff.journal import Recovered, recover
from supervisor.gateway.hello import (
    ANSWERED,
    BYE,
    HANDOFF_ID,
    HANDOFF_METHOD,
    HELD_LONG,
    RELEASED_LONG,
    SET_UP,
    SWITCH_FDS,
    TAKEN,
)

__all__ = (
    "MAX_BACK_LINE",
    "SWITCH_RETRY",
    "BackLines",
    "NotSwitched",
    "SwitchTries",
    "Taken",
    "eligible",
    "offer",
    "switch",
    "taken_back",
)

MAX_BACK_LINE = 2 << 20  # bytes of one back line: a set-up line of up to 1 MiB and its tag
_ANSWER_TIMEOUT = 10.0  # seconds for the daemon to take the handoff or refuse it
_ANSWER_MAX = 65536
_MAX_LONG_IDS = 10_000
SWITCH_RETRY = Backoff(initial=1.0, maximum=60.0, multiplier=2.0, jitter=0.1)  # after a failed switch
_METHOD_NOT_FOUND = -32601  # JSON-RPC: a daemon that does not know the switch says so


def eligible(stdin: int, stdout: int) -> bool:
    """Whether to offer *stdin* and *stdout*: both pipes or sockets, and not switched off."""
    if os.environ.get("MCP_SUPERVISOR_HANDOFF", "1") == "0":
        return False
    try:
        kinds = [stat.S_IFMT(os.fstat(fd).st_mode) for fd in (stdin, stdout)]
    except OSError:
        return False
    return all(kind in (stat.S_IFIFO, stat.S_IFSOCK) for kind in kinds)


def offer(sock: socket.socket, stdin: int, stdout: int, profile: str | None) -> int | None:
    """Offer *stdin* and *stdout* on *sock*, a fresh connection; the journal's memfd once the
    daemon took them, None if it would not (connect then dials again and pumps).

    The daemon touches the fds only once connect acknowledged its answer (:data:`TAKEN`), so
    that a late answer never leaves two readers of stdin."""
    request = {"jsonrpc": "2.0", "id": HANDOFF_ID, "method": HANDOFF_METHOD, "params": {"profile": profile}}
    answer, fds = bytearray(), []
    deadline = time.monotonic() + _ANSWER_TIMEOUT
    try:
        sock.settimeout(_ANSWER_TIMEOUT)
        socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [stdin, stdout])
        while b"\n" not in answer and len(answer) < _ANSWER_MAX:
            data = _receive(sock, fds, deadline)
            if not data:
                break
            answer += data
        if _accepted(answer) and len(fds) == 1:
            sock.sendall(TAKEN)
            return fds.pop()
    except OSError:  # a timeout too
        pass
    finally:
        sock.setblocking(False)
        for fd in fds:
            os.close(fd)
    return None


def _receive(sock: socket.socket, fds: list[int], deadline: float) -> bytes:
    """What the daemon sends next, by *deadline*; an fd that comes with it (the journal) is
    added to *fds*, not inheritable."""
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    data, got, _, _ = socket.recv_fds(sock, _ANSWER_MAX, 1)
    for fd in got:  # recv_fds (3.11) drops its flags: no MSG_CMSG_CLOEXEC
        os.set_inheritable(fd, False)
    fds += got
    return data


def _accepted(answer: bytes | bytearray) -> bool:
    try:
        reply = json.loads(answer.partition(b"\n")[0])
    except ValueError:
        return False
    return isinstance(reply, dict) and reply.get("result") == {"handoff": True}


class BackLines:
    """The daemon's lines on the socket after a handoff, into the session's *memory*."""

    def __init__(self, memory: SessionMemory) -> None:
        self.memory = memory
        self.bye = False
        self._skipping = False  # the rest of a line over MAX_BACK_LINE
        self.long_ids: set[RequestId] = set()  # in flight, too long for the journal
        self._partial = bytearray()

    def feed(self, data: bytes) -> None:
        self._partial += data
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        for line in lines:
            if self._skipping:  # the rest of a line over the limit
                self._skipping = False
                continue
            self._line(bytes(line[:1]), bytes(line[1:]))
        if len(self._partial) > MAX_BACK_LINE:  # not one of ours: dropped
            self._partial.clear()
            self._skipping = True

    def _line(self, tag: bytes, payload: bytes) -> None:
        if tag == SET_UP:
            self.memory.sent(payload, peek(payload))
        elif tag == BYE:
            self.bye = True
        elif tag in (ANSWERED, HELD_LONG, RELEASED_LONG):
            try:
                request_id = json.loads(payload)
            except ValueError:
                return
            if not is_id(request_id):
                return
            if tag == ANSWERED:
                self.memory.answered(request_id)
            elif tag == RELEASED_LONG:
                self.long_ids.discard(request_id)
            elif len(self.long_ids) < _MAX_LONG_IDS:
                self.long_ids.add(request_id)


@dataclass(frozen=True, slots=True)
class Taken:
    """What connect carries on with: end a half-written line, fail *failed*, and hold *unsent*."""

    mid_line: bool
    failed: list[RequestId]
    unsent: bytes


def taken_back(memfd: int, back: BackLines) -> Taken:
    """The session the dead daemon leaves: from its journal in *memfd* and what *back* heard.

    The requests to fail are those it held (in the journal, or too long for it) and the set-up
    requests not answered, but the listen streams, which connect resumes. The client's bytes it
    read and did not take are sent on, but the requests among them that it held: those get
    the error.
    """
    recovered = recover(memfd) or Recovered(mid_line=False, ids=[], unconsumed=b"")
    memory = back.memory
    failed = memory.broken()
    journaled = _unique([*recovered.ids, *back.long_ids])
    failed += [i for i in journaled if i not in memory.listens and i not in failed]
    held = set(failed) | set(memory.listens)
    return Taken(recovered.mid_line, failed, _unsent(recovered.unconsumed, held))


def _unique(ids: Iterable[RequestId]) -> list[RequestId]:
    return list(dict.fromkeys(ids))


def _unsent(unconsumed: bytes, held: set[RequestId]) -> bytes:
    *lines, partial = unconsumed.split(b"\n")
    kept = []
    for line in lines:
        seen = peek(line)
        if seen.kind is Kind.REQUEST and seen.id in held:
            continue  # the daemon took it: it is answered with an error
        kept.append(line + b"\n")
    return b"".join(kept) + partial


@dataclass(frozen=True, slots=True)
class NotSwitched:
    """Why a switch did not happen: *final* when the daemon never will (it does not know the
    method: an older one); else it may later (out of fds, a client slow to read, a timeout)."""

    reason: str
    final: bool = False


class SwitchTries:
    """When to try the next switch: at once on a new daemon (or after one succeeded); never
    again on a daemon that cannot (an older one; its successor after a restart is asked); after a
    failure that may pass (the daemon out of fds, a client slow to read), after
    :data:`SWITCH_RETRY`, which grows with each failure in a row up to a minute."""

    def __init__(self) -> None:
        self.failures = 0  # in a row, on this daemon
        self._never = False
        self._not_before = 0.0  # time.monotonic()

    def ready(self) -> bool:
        return not self._never and time.monotonic() >= self._not_before

    def due(self) -> float | None:
        """Seconds until the next try may be made; None when there is nothing to wait for."""
        remaining = self._not_before - time.monotonic()
        return None if self._never or remaining <= 0 else remaining

    def failed(self) -> float:
        """One more failure in a row: the seconds until the next try."""
        self.failures += 1
        delay = SWITCH_RETRY.delay(self.failures)
        self._not_before = time.monotonic() + delay
        return delay

    def never(self) -> None:
        self._never = True

    def reset(self) -> None:
        self.failures, self._never, self._not_before = 0, False, 0.0


def switch(
    loop: Loop, pump: Pump, link: Link, stdin: int, stdout: int, request_id: str, timeout: float
) -> tuple[socket.socket, int] | NotSwitched:
    """Hand the client over on *link*, a live pumped connection with nothing on its way
    (``pump.quiet``): the same session goes on, served by the daemon on the client's pipes.

    connect stops reading stdin first; it asks (*request_id*), sends the fds once the daemon is
    ready, passes on what the daemon still writes until its answer, lets its own output out,
    and commits with :data:`TAKEN`. Then the link is let go of (its socket stays open as the
    returned one) and the pump no longer touches stdin or stdout. Else why not, with the pump
    reading stdin again: on *link* still, unless the fds went and the daemon did not say no
    (then *link* is ended, see :func:`_stay`)."""
    assert link.channel is not None
    try:  # the pump's input again if the switch fails, taken first: fds may run out meanwhile
        spare = os.dup(stdin)
    except OSError as exc:
        return NotSwitched(f"connect could not keep its input: {exc.strerror or exc}")
    pump.detach(output=False)
    link.channel.pause_reading()
    link.switch_id, link.switch_answers = request_id, []
    fds: list[int] = []
    deadline = time.monotonic() + timeout
    params = {"switch": True, "listens": list(pump.memory.listens)}  # the streams it keeps open
    request = {"jsonrpc": "2.0", "id": request_id, "method": HANDOFF_METHOD, "params": params}
    step = "asking"
    try:
        sock = socket.socket(fileno=os.dup(link.channel.fd))
    except OSError as exc:
        why = NotSwitched(f"connect could not use its socket: {exc.strerror or exc}")
        return _stay(loop, pump, link, None, fds, spare, step, why)
    try:
        sock.settimeout(timeout)
        sock.sendall(json.dumps(request).encode() + b"\n")
        answer = _answered(sock, pump, link, fds, deadline)
        if answer.get("result") != {"ready": True}:
            link.switch_id = None  # its one answer came (or the end): none is left to drop
            step = step if answer else "ended"
            return _stay(loop, pump, link, sock, fds, spare, step, _not_ready(answer))
        step = "handing"
        socket.send_fds(sock, [SWITCH_FDS], [stdin, stdout])
        answer = _answered(sock, pump, link, fds, deadline)
        link.switch_id = None  # its second and last answer came
        if "error" in answer:  # the daemon said no, and closed the fds: the session goes on here
            step = "refused"
        if answer.get("result") != {"handoff": True} or len(fds) != 1:
            return _stay(loop, pump, link, sock, fds, spare, step, _not_taken(answer, len(fds)))
        out = pump.stdout
        drained = out is None or loop.run_until(lambda: out.buffered == 0, deadline - time.monotonic())
        if not drained or pump.gone:  # the client does not read: not now
            reason = NotSwitched(f"the client did not read its output within {timeout:g} s")
            return _stay(loop, pump, link, sock, fds, spare, step, reason)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(TAKEN)
    except OSError as exc:  # a timeout too
        why = NotSwitched(f"{exc.strerror or exc} while {step}")
        if isinstance(exc, ConnectionError) and step == "asking":
            step = "ended"  # reset, as by a daemon that ended it before reading the switch
        return _stay(loop, pump, link, sock, fds, spare, step, why)
    os.close(spare)
    pump.detach(output=True)
    link.switch_id = None
    link.channel.on_lost = None
    link.channel.abort()
    pump.links.discard(link)
    pump.live = None
    sock.setblocking(False)
    return sock, fds.pop()


def _answered(sock: socket.socket, pump: Pump, link: Link, fds: list[int], deadline: float) -> dict[str, Any]:
    """The next answer to the switch's request, passing on the daemon's other lines; empty at
    the end of the connection."""
    while not link.switch_answers:
        data = _receive(sock, fds, deadline)
        if not data:
            return {}
        pump.write(link.downstream.feed(data))
    return link.switch_answers.pop(0)


def _not_ready(answer: dict[str, Any]) -> NotSwitched:
    """Why the daemon did not say ready: only one that does not know the method never will (a
    daemon that does says ready to every switch it reads; see ``gateway.stdio``)."""
    error = answer.get("error")
    if not isinstance(error, dict):
        return NotSwitched("the daemon ended the connection" if not answer else "an odd answer")
    final = error.get("code") == _METHOD_NOT_FOUND
    return NotSwitched(f"the daemon refused: {error.get('message')}", final=final)


def _not_taken(answer: dict[str, Any], fds: int) -> NotSwitched:
    error = answer.get("error")
    if isinstance(error, dict):  # cannot take the session over: Too many open files, ...
        return NotSwitched(f"the daemon refused: {error.get('message')}")
    if not answer:
        return NotSwitched("the daemon ended the connection")
    return NotSwitched(f"an answer with {fds} fds, not the journal")


def _stay(
    loop: Loop,
    pump: Pump,
    link: Link,
    sock: socket.socket | None,
    fds: list[int],
    spare: int,
    step: str,
    why: NotSwitched,
) -> NotSwitched:
    """The switch did not happen (*why*): the pump reads stdin again, through *spare*. Asked but
    not answered, the daemon may still say ready and wait for the fds: a blank line (which it
    skips) ends its wait. Once the fds went, the daemon may take them yet, unless it said no: the
    link is ended, and the client's lines are held for the next connection. A link the daemon
    ended while asked is ended here too: a failed switch, whose backoff holds (not a restart)."""
    for fd in fds:
        os.close(fd)
    if link.switch_id is not None:  # an answer still to come is ours, not the client's (no
        link.dropped.add(link.switch_id)  # switch is tried on the link until it came)
    link.switch_id = None
    if sock is not None:
        if step == "asking":
            with contextlib.suppress(OSError):
                sock.sendall(b"\n")
        sock.close()
    pump.attach_input(loop, spare)
    if link.channel is not None:
        if step in ("handing", "ended"):  # a failure either way: ended here, the backoff holds
            link.abort()
        elif not pump.daemon_paused:  # else the client's reading of its stdout resumes it
            link.channel.resume_reading()
    pump.flow()
    return why
