"""The handoff request: ``connect``'s first line on ``mcp.sock``, its client's stdin and stdout attached.

:func:`parse` takes it apart (or says it is no handoff), :func:`answer` accepts it, sending the
session's journal back (SCM_RIGHTS), and :func:`refuse` says why not, after which connect
dials again and pumps the bytes itself. Only a pipe or a socket is taken: a file cannot be
waited on, and a terminal is the user's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
from dataclasses import dataclass
from typing import Any

import anyio

from supervisor.gateway.handoff.journal import Journal
from supervisor.gateway.hello import HANDOFF_METHOD, SWITCH_FDS, TAKEN
from supervisor.streams import Stream

__all__ = ("MAX_FDS", "REFUSED", "Offer", "accept", "acknowledged", "answer", "parse", "refuse", "take_over")

MAX_FDS = 2  # stdin, stdout: fds beyond these are closed by the kernel (MSG_CTRUNC)
REFUSED = -32602  # the JSON-RPC code of a refused handoff (invalid params)
_READABLE = (os.O_RDONLY, os.O_RDWR)
_WRITABLE = (os.O_WRONLY, os.O_RDWR)


@dataclass(slots=True)
class Offer:
    """A handoff request: its id, the profile asked for, and the fds (owned until taken)."""

    id: str | int
    profile: str | None
    stdin: int | None
    stdout: int | None
    problem: str | None = None  # why it cannot be taken, if it cannot

    def take(self) -> tuple[int, int]:
        """The two fds, now the caller's to close."""
        assert self.stdin is not None and self.stdout is not None
        fds, self.stdin, self.stdout = (self.stdin, self.stdout), None, None
        return fds

    def close(self) -> None:
        for fd in (self.stdin, self.stdout):
            if fd is not None:
                os.close(fd)
        self.stdin = self.stdout = None


def parse(first: bytes, fds: list[int]) -> Offer | None:
    """The handoff in *first* (the connection's first bytes, with the *fds* that came along), or
    None (and *fds* closed) when it is none: the bytes are then the client's."""
    try:
        request = _request(first)
    except BaseException:
        _close(fds)
        raise
    if request is None:
        _close(fds)
        return None
    params = request.get("params")
    profile = params.get("profile") if isinstance(params, dict) else None
    offer = Offer(request["id"], profile if isinstance(profile, str) else None, None, None)
    if isinstance(params, dict) and params.get("switch"):
        _close(fds)
        offer.problem = "a switch is for a live session, not its first line"
        return offer
    _take_fds(offer, fds)
    return offer


def _take_fds(offer: Offer, fds: list[int]) -> None:
    """*offer* takes the two *fds* if they are usable; else they are closed and it says why."""
    if len(fds) != MAX_FDS:
        _close(fds)
        offer.problem = f"expected {MAX_FDS} fds (stdin, stdout), got {len(fds)}"
        return
    offer.stdin, offer.stdout = fds
    try:
        problem = _unusable(offer.stdin, _READABLE, "stdin")
        offer.problem = problem or _unusable(offer.stdout, _WRITABLE, "stdout")
    except OSError as exc:
        offer.problem = f"cannot use the fds: {exc.strerror or exc}"
    if offer.problem is not None:
        offer.close()


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _request(first: bytes) -> dict[str, Any] | None:
    if HANDOFF_METHOD.encode() not in first or not first.endswith(b"\n") or first.count(b"\n") != 1:
        return None  # connect sends the handoff alone and waits for the answer
    try:
        request = json.loads(first)
    except (ValueError, RecursionError):
        return None
    if not isinstance(request, dict) or request.get("method") != HANDOFF_METHOD:
        return None
    request_id = request.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    return request


def _unusable(fd: int, modes: tuple[int, ...], name: str) -> str | None:
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind not in (stat.S_IFIFO, stat.S_IFSOCK):
        return f"{name} is neither a pipe nor a socket"
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE not in modes:
        return f"{name} is not open for {'reading' if name == 'stdin' else 'writing'}"
    return None


def answer(sock: socket.socket, offer: Offer, journal_fd: int) -> bool:
    """Accept *offer*: the answer, the journal attached. False if the socket would not take it
    whole at once (connect then sees the socket end and pumps the bytes itself)."""
    line = _line({"jsonrpc": "2.0", "id": offer.id, "result": {"handoff": True}})
    try:
        return socket.send_fds(sock, [line], [journal_fd]) == len(line)
    except OSError:
        return False


def refuse(sock: socket.socket, request_id: str | int, code: int, message: str) -> None:
    """Refuse a handoff: an error connect reads (then it pumps, or gives up on an unknown profile)."""
    line = _line({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
    with contextlib.suppress(OSError):
        sock.send(line)


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


async def acknowledged(stream: Stream, within: float) -> bool:
    """Whether connect acknowledges the answer (:data:`TAKEN`) within *within* seconds."""
    with anyio.move_on_after(within):
        try:
            return await stream.receive(1) == TAKEN
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return False
    return False


async def accept(
    stream: Stream, handoff: Offer, capacity: int, within: float
) -> tuple[int, int, Journal] | str | None:
    """Take *handoff*, its fds usable: answer with a journal of *capacity* and wait (*within*
    seconds) for connect's :data:`TAKEN`. The fds and the journal, now the caller's; the reason
    of a refusal sent instead (no journal could be made); or None, nothing kept, when connect
    did not acknowledge in time."""
    sock = stream._raw_socket
    with contextlib.closing(handoff):  # its fds, unless taken
        try:
            journal = Journal(capacity)
        except OSError as exc:  # out of memory or fds
            reason = f"cannot take the session over: {exc.strerror or exc}"
            refuse(sock, handoff.id, REFUSED, reason)
            return reason
        try:
            assert journal.fd is not None
            taken = answer(sock, handoff, journal.fd) and await acknowledged(stream, within)
        except BaseException:  # the deadline's cancellation too
            journal.close()
            raise
        if not taken:
            journal.close()
            return None
        journal.close_fd()
        stdin, stdout = handoff.take()
        return stdin, stdout, journal


async def take_over(
    stream: Stream, request_id: str | int, capacity: int, within: float
) -> tuple[int, int, Journal] | bytes | None:
    """The daemon's half of a handoff on a live session (*stream*, its socket, nothing unread):
    say ready, take the fds that come with :data:`SWITCH_FDS`, then :func:`accept` them, within
    *within* seconds. The fds and the journal, now the caller's; the bytes read instead of the
    fds (connect gave up: they are the client's and the session goes on); or None, nothing
    kept, when the connection must end: after "ready", connect may have committed to a handoff
    that did not happen, and only the connection's end tells it to carry the client on itself."""
    with anyio.move_on_after(within):
        await stream.send(_line({"jsonrpc": "2.0", "id": request_id, "result": {"ready": True}}))
        data, fds = await stream.receive_with_fds(1, MAX_FDS)
        if data != SWITCH_FDS:
            _close(fds)
            return data
        handoff = Offer(request_id, None, None, None)
        _take_fds(handoff, fds)
        if handoff.problem is not None:
            refuse(stream._raw_socket, request_id, REFUSED, handoff.problem)
            return b""
        took = await accept(stream, handoff, capacity, within)
        return b"" if isinstance(took, str) else took
    return None
