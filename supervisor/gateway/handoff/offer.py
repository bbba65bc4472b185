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

from supervisor.gateway.hello import HANDOFF_METHOD

__all__ = ("MAX_FDS", "Offer", "answer", "parse", "refuse")

MAX_FDS = 2  # stdin, stdout: fds beyond these are closed by the kernel (MSG_CTRUNC)
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
    if len(fds) != MAX_FDS:
        _close(fds)
        offer.problem = f"expected {MAX_FDS} fds (stdin, stdout), got {len(fds)}"
        return offer
    offer.stdin, offer.stdout = fds
    try:
        offer.problem = _unusable(offer.stdin, _READABLE, "stdin") or _unusable(
            offer.stdout, _WRITABLE, "stdout"
        )
    except OSError as exc:
        offer.problem = f"cannot use the fds: {exc.strerror or exc}"
    if offer.problem is not None:
        offer.close()
    return offer


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
