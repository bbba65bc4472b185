"""Unix socket files the daemon listens on: safe to bind, safe to remove, peers identified.

Shared by the control socket and (later) the gateway socket. The rules: the directory is
created 0700 (an existing one open to others is reported), the socket is 0600, a stale socket
is replaced but a live one is refused, and on exit only the file we created is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct

import anyio
import anyio.abc
import structlog

from .errors import SupervisorError

__all__ = (
    "ACCEPT_RETRY_DELAY",
    "TRANSIENT_ACCEPT_ERRORS",
    "accept",
    "identity",
    "listen",
    "peer_credentials",
    "unlink_if_ours",
)

log = structlog.get_logger(__name__)

ACCEPT_RETRY_DELAY = 0.1  # after EMFILE and friends, so the accept loop does not spin
TRANSIENT_ACCEPT_ERRORS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}
)
_PROBE_TIMEOUT = 5.0  # connecting to an existing socket to see whether a daemon is behind it


async def accept(listener: anyio.abc.SocketListener) -> anyio.abc.SocketStream | None:
    """Accept one client as a transport-based stream; None if it hung up already.

    anyio 4.16's UNIXSocketStream waits with ``loop.add_reader(future.set_result)``: a cancel
    (idle timeout, shutdown) landing in the loop iteration where the socket becomes ready makes
    asyncio log ``InvalidStateError``. The transport-based SocketStream has no such race.
    """
    accepted = await listener.accept()
    raw: socket.socket = accepted.extra(anyio.abc.SocketAttribute.raw_socket)
    sock = socket.socket(fileno=raw.detach())
    try:
        return await anyio.abc.SocketStream.from_socket(sock)
    except (OSError, ValueError) as exc:
        sock.close()
        log.debug("socket.client_gone", error=str(exc))
        return None
    except BaseException:
        sock.close()
        raise


def peer_credentials(stream: anyio.abc.SocketStream) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end, from SO_PEERCRED."""
    raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _prepare_directory(path: str) -> None:
    """Create the socket's directory 0700, or warn when an existing one is open to others."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = stat.S_IMODE(os.stat(directory).st_mode)
    except FileNotFoundError:
        os.makedirs(directory, mode=0o700)
        os.chmod(directory, 0o700)
        return
    if mode & 0o077:
        log.warning("socket.dir_open", path=directory, mode=oct(mode))


async def _remove_stale(path: str) -> None:
    """Unlink a socket no daemon answers on; refuse when one does."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SupervisorError(f"{path} exists and is not a socket")
    try:
        with anyio.fail_after(_PROBE_TIMEOUT):
            probe = await anyio.connect_unix(path)
    except ConnectionRefusedError:
        log.info("socket.stale_removed", path=path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except TimeoutError:
        raise SupervisorError(f"another daemon is listening on {path}") from None
    await probe.aclose()
    raise SupervisorError(f"another daemon is listening on {path}")


async def listen(path: str) -> anyio.abc.SocketListener:
    try:
        _prepare_directory(path)
        await _remove_stale(path)
        return await anyio.create_unix_listener(path, mode=0o600)  # chmod before listen()
    except OSError as exc:
        raise SupervisorError(f"cannot listen on {path}: {exc.strerror or exc}") from exc


def unlink_if_ours(path: str, ours: tuple[int, int]) -> None:
    with contextlib.suppress(OSError):
        if identity(path) == ours:
            os.unlink(path)


def identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino
