"""Who is at the other end of a socket: SO_PEERCRED for unix ones, sock_diag for a TCP peer on this
host; and whether to trust that uid.

Apart from :mod:`supervisor.sockets` so that ``connect``, which checks the daemon before its
first byte, imports nothing of asyncio for it.
"""

from __future__ import annotations

import os
import socket
import struct

from supervisor.errors import SupervisorError

__all__ = ("UntrustedPeer", "check", "credentials", "tcp_peer", "trusted_uid")

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


# ---- a TCP peer on loopback: the kernel knows its socket's owner (sock_diag) ----------------------

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBxI")  # family, protocol, extensions, states
_SOCKID = struct.Struct("!HH16s16s")  # source port, destination port, source, destination (network order)
_SOCKID_TAIL = struct.Struct("=I8s")  # interface, cookie
_NO_COOKIE = b"\xff" * 8
_ANSWER = struct.Struct("=BBBB48sIIIII")  # family, state, timer, retransmits, id, expires, rq, wq, uid, inode


def _address(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def tcp_peer(sock: socket.socket) -> tuple[int, int] | None:
    """The (uid, socket inode) of the process at the other end of the connected TCP *sock*,
    when that end is on this host (loopback); None when it is not, or the kernel does not say.

    One netlink request for exactly that socket (the 4-tuple seen from its side), no scan.
    """
    family = sock.family
    try:
        local, remote = sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        query = _SOCKID.pack(remote[1], local[1], _address(family, remote[0]), _address(family, local[0]))
    except (OSError, ValueError):
        return None
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + query + _SOCKID_TAIL.pack(0, _NO_COOKIE)
    message = _NLMSG.pack(_NLMSG.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + body
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            diag.send(message)
            answer = diag.recv(8192)
    except OSError:
        return None
    if len(answer) < _NLMSG.size + _ANSWER.size:
        return None
    _length, kind, _flags, _seq, _port = _NLMSG.unpack_from(answer)
    if kind == _NLMSG_ERROR:
        return None  # ENOENT: not a socket of this host (another network namespace, or gone)
    *_, uid, inode = _ANSWER.unpack_from(answer, _NLMSG.size)
    return uid, inode
