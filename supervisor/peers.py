"""Who is at the other end of a unix socket: SO_PEERCRED, and whether to trust that uid.

Apart from :mod:`supervisor.sockets` so that ``connect``, which checks the daemon before its
first byte, imports nothing of asyncio for it.
"""

from __future__ import annotations

import os
import socket
import struct

from supervisor.errors import SupervisorError

__all__ = ("UntrustedPeer", "check", "credentials", "trusted_uid")

_UCRED = struct.Struct("3i")  # pid, uid, gid


class UntrustedPeer(SupervisorError):
    """The process at the other end of a socket runs as a uid we do not trust."""


def trusted_uid(uid: int) -> bool:
    """Whether a peer running as *uid* may be talked to: ourselves, or root (who can do anything)."""
    return uid in (os.geteuid(), 0)


def credentials(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of the connected unix socket *sock*."""
    pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def check(sock: socket.socket, path: str) -> None:
    """Raise :class:`UntrustedPeer` unless the listener on *path* behind *sock* is to be trusted.

    Raises:
        UntrustedPeer: it runs as another user (neither us nor root): someone may have taken
            over the socket to read requests and forge answers.
        OSError: the credentials could not be read.
    """
    _pid, uid = credentials(sock)
    if not trusted_uid(uid):
        raise UntrustedPeer(
            f"refusing to talk to {path}: the process listening there runs as uid {uid}, not as you"
            f" (uid {os.geteuid()}); another user may have taken the socket over"
        )
