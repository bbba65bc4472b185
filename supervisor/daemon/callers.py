"""Who may call the HTTP gateway from this host: the daemon's user, and none of its own extensions.

The control socket and ``mcp.sock`` know their peer by ``SO_PEERCRED``; a TCP connection knows
only an address. On this host the kernel still knows the peer's socket (``sock_diag``): the uid
that owns it, and its inode, which a process of the daemon's own trees holds when an extension
(or anything it started) is calling. Refused: another user's connection, and an extension's
unless its sandbox says ``gateway: true``: through the gateway any extension would call every
other's tools as their deputy, a ``sandbox: false`` one's included. A peer on another host is
the token's to admit.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping

from supervisor import peers
from supervisor.process import tree

__all__ = ("Callers",)


class Callers:
    """The screen of the HTTP listener's connections.

    *runs*: the pid of every running extension (and per-client instance), with its name;
    *allowed*: whether extension NAME may call the gateway.
    """

    def __init__(self, runs: Callable[[], Mapping[int, str]], allowed: Callable[[str], bool]) -> None:
        self._runs, self._allowed = runs, allowed
        self._daemon = os.getpid()

    def refusal(self, sock: socket.socket) -> str | None:
        """Why the peer of the accepted *sock* may not call, or None. Sync, well under a millisecond
        with tens of extensions (one netlink query, the daemon's own process tree)."""
        peer = peers.tcp_peer(sock)
        if peer is None:
            return None
        uid, inode = peer
        if not peers.trusted_uid(uid):
            return f"a connection of another user (uid {uid})"
        held, name = self._holder(inode)
        if not held or (name is not None and self._allowed(name)):
            return None
        who = repr(name) if name is not None else "an orphan of one (it left its extension's tree)"
        return f"a connection of the daemon's own extension {who}, whose sandbox has no `gateway: true`"

    def extension_of(self, sock: socket.socket) -> str | None:
        """The extension whose tree holds the peer of *sock* (``"(orphan)"`` for a process that
        left one), or None for anyone else: the dashboard serves no extension, ``gateway: true``
        or not (its cookie is sent by the person's browser to any loopback port)."""
        peer = peers.tcp_peer(sock)
        if peer is None:
            return None
        held, name = self._holder(peer[1])
        return (name or "(orphan)") if held else None

    def _holder(self, inode: int) -> tuple[bool, str | None]:
        """Whether one of the daemon's trees holds socket *inode*, and whose run it is (None: an orphan)."""
        chain = tree.holder_of_socket(inode, self._daemon)
        if chain is None:
            return False, None
        runs = self._runs()
        return True, next((runs[pid] for pid in chain if pid in runs), None)
