"""Unix socket files the daemon listens on: safe to bind, safe to remove, peers identified.

Shared by the control socket and the gateway socket, and by their clients. The rules: the
socket's directory is owned by the effective uid and closed to everyone else (mode 0700; it
is created so when missing, and anything else is refused: another local user who pre-creates
``/tmp/mcp-supervisor-$UID`` could otherwise swap the socket), the socket is 0600, a stale
socket is replaced but a live one is refused, on exit only the file we created is removed,
and each end checks the other's uid with SO_PEERCRED before trusting a byte from it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from typing import Any

import anyio
import anyio.abc

from supervisor import peers
from supervisor.errors import SupervisorError
from supervisor.peers import UntrustedPeer, trusted_uid
from supervisor.streams import Stream

__all__ = (
    "ACCEPT_RETRY_DELAY",
    "TRANSIENT_ACCEPT_ERRORS",
    "Spare",
    "Stream",
    "UntrustedPeer",
    "accept",
    "check_directory",
    "connect",
    "identity",
    "listen",
    "next_client",
    "peer_credentials",
    "prepare_directory",
    "trusted_uid",
    "unlink_if_ours",
)

ACCEPT_RETRY_DELAY = 0.1  # after EMFILE and friends, so the accept loop does not spin
TRANSIENT_ACCEPT_ERRORS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}
)
_PROBE_TIMEOUT = 5.0  # connecting to an existing socket to see whether a daemon is behind it


def _log() -> Any:
    import structlog  # lazily: client commands import this module for connect() alone

    return structlog.get_logger(__name__)


async def accept(listener: anyio.abc.SocketListener) -> Stream | None:
    """Accept one client as a stream that reads only on demand; None if it hung up already."""
    sock = _detached(await listener.accept())
    try:
        sock.getpeername()
    except OSError as exc:
        sock.close()
        _log().debug("socket.client_gone", error=str(exc))
        return None
    return Stream(sock)


def _detached(stream: anyio.abc.SocketStream) -> socket.socket:
    """The socket under anyio's *stream*, ours alone from now on (to wrap in a :class:`Stream`)."""
    raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    return socket.socket(fileno=raw.detach())


async def next_client(
    listener: anyio.abc.SocketListener, *, event: str, spare: Spare | None = None
) -> Stream:
    """The next client of *listener*; transient accept errors (EMFILE, ...) are logged as *event*
    and retried after :data:`ACCEPT_RETRY_DELAY`, so the accept loop neither dies nor spins.

    With a *spare* fd (:class:`Spare`), running out of fds gives it up for
    this accept: the client gets in even then (the spare is taken again on the next call).
    """
    while True:
        try:
            stream = await accept(listener)
        except anyio.BrokenResourceError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, OSError) and cause.errno in TRANSIENT_ACCEPT_ERRORS):
                raise
            if cause.errno == errno.EMFILE and spare is not None and spare.release():
                continue
            _log().warning(event, error=str(cause))
            await anyio.sleep(ACCEPT_RETRY_DELAY)
            continue
        if spare is not None:
            spare.take()  # back in reserve, if an fd is free now
        if stream is not None:
            return stream


def peer_credentials(stream: anyio.abc.SocketStream) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end, from SO_PEERCRED."""
    return peers.credentials(stream.extra(anyio.abc.SocketAttribute.raw_socket))


async def connect(path: str) -> Stream:
    """Connect to the unix socket *path* and check who listens there before anything is sent.

    The stream is a :class:`Stream`: a receive cancelled (a timeout) leaves nothing behind,
    where anyio's own unix stream may still set the result of its cancelled future when the
    socket turns readable (an InvalidStateError from the event loop).

    Raises:
        OSError: nothing could be connected (missing file, refused, permission denied).
        UntrustedPeer: the listener runs as another user (neither us nor root): someone may
            have taken over the socket to read requests and forge answers; nothing was sent.
    """
    stream = Stream(_detached(await anyio.connect_unix(path)))
    try:
        peers.check(stream._raw_socket, path)
    except (OSError, UntrustedPeer):
        await stream.aclose()
        raise
    return stream


def check_directory(directory: str) -> None:
    """Raise unless *directory* is a real directory of ours that nobody else may enter.

    Raises:
        SupervisorError: a symlink or not a directory, owned by another uid, or open to group
            or others (anything wider than 0700); the message says what to do.
    """
    st = os.lstat(directory)
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise SupervisorError(f"refusing socket directory {directory}: it is not a directory (a symlink?)")
    if st.st_uid != euid:
        raise SupervisorError(
            f"refusing socket directory {directory}: it belongs to uid {st.st_uid}, not {euid};"
            " another user may have created it (remove it or choose another --socket)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SupervisorError(
            f"refusing socket directory {directory}: its mode is {mode:04o}, open to other users"
            f" (run 'chmod 700 {directory}')"
        )


def prepare_directory(path: str) -> str:
    """Create the directory of socket *path* (0700) if missing, check it, and return it.

    Raises:
        SupervisorError: see :func:`check_directory`.
        OSError: the directory could not be created.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass  # someone's: checked below, never chmod-ed into shape
    else:
        os.chmod(directory, 0o700)  # a umask may have taken owner bits away
    check_directory(directory)
    return directory


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
        _log().info("socket.stale_removed", path=path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except TimeoutError:
        raise SupervisorError(f"another daemon is listening on {path}") from None
    await probe.aclose()
    raise SupervisorError(f"another daemon is listening on {path}")


async def listen(path: str) -> anyio.abc.SocketListener:
    """Listen on the unix socket *path* (0600) in a directory of ours (see :func:`check_directory`).

    Raises:
        SupervisorError: the directory is not safe, a daemon already listens on *path*, a
            non-socket file is in the way, or binding failed.
    """
    try:
        prepare_directory(path)
        await _remove_stale(path)
        return await anyio.create_unix_listener(path, mode=0o600)  # chmod before listen()
    except OSError as exc:
        raise SupervisorError(f"cannot listen on {path}: {exc.strerror or exc}") from exc


def unlink_if_ours(path: str, ours: tuple[int, int]) -> None:
    """Remove *path* if it is still the file whose :func:`identity` is *ours*."""
    with contextlib.suppress(OSError):
        if identity(path) == ours:
            os.unlink(path)


def identity(path: str) -> tuple[int, int]:
    """(device, inode) of *path*: tells our socket file from one that replaced it."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


class Spare:
    """One fd held in reserve: given up when an accept fails for want of fds, taken again later."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.take()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self) -> None:
        """Hold the spare again, if there is an fd for it (sync, cheap when held)."""
        if self._fd is None:
            with contextlib.suppress(OSError):  # out of fds: no spare until some are free
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def release(self) -> bool:
        """Give the spare up for one accept; False if it was not held."""
        if self._fd is None:
            return False
        os.close(self._fd)
        self._fd = None
        return True

    def close(self) -> None:
        self.release()
