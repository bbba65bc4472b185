"""connect's dialling: a connection to the daemon's gateway socket, its peer checked, a profile chosen.

Before a byte is sent, the listener must run as our uid (or root); with ``--profile`` the
connection opens with one line of our own (:data:`~supervisor.gateway.hello.HELLO_METHOD`),
answered before anything else. Waits serve the loop, so the client is served meanwhile.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Callable

from supervisor import peers
from supervisor.cli.connect.loop import Channel, Loop
from supervisor.errors import ConfigError, DaemonUnreachable
from supervisor.gateway.hello import HELLO_METHOD

__all__ = ("UnknownProfile", "WrongOwner", "dial")

_HELLO_ID = "mcp-supervisor-connect-profile"
_HELLO_TIMEOUT = 10.0  # seconds for the daemon to answer the profile line
_HELLO_MAX = 65536  # bytes of that answer
_BUSY_TIMEOUT = 1.0  # seconds to retry a listener whose backlog is full
_NOBODY_THERE = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR})


class WrongOwner(DaemonUnreachable):
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


def dial(
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
        raise WrongOwner(path, str(exc)) from None
    except OSError as exc:
        sock.close()
        raise DaemonUnreachable(path, f"cannot connect to {path}: {exc.strerror or exc}") from None
    except BaseException:
        sock.close()
        raise
    return sock
