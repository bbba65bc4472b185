"""Unix socket files the daemon listens on: safe to bind, safe to remove, peers identified.

Shared by the control socket and the gateway socket, and by their clients. The rules: the
socket's directory is owned by the effective uid and closed to everyone else (mode 0700; it
is created so when missing, and anything else is refused: another local user who pre-creates
``/tmp/mcp-supervisor-$UID`` could otherwise swap the socket), the socket is 0600, a stale
socket is replaced but a live one is refused, on exit only the file we created is removed,
and each end checks the other's uid with SO_PEERCRED before trusting a byte from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from supervisor import peers
from supervisor.errors import SupervisorError
from supervisor.peers import UntrustedPeer, trusted_uid

__all__ = (
    "ACCEPT_RETRY_DELAY",
    "TRANSIENT_ACCEPT_ERRORS",
    "FdStream",
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


class FdStream(anyio.abc.ByteStream):
    """A stream read and written only when asked: no buffer the caller does not see.

    anyio's transport-based stream (``SocketStream.from_socket``) never pauses the transport
    it wraps, so asyncio kept reading a client that pipelined without reading its replies:
    1.9 GB in 30 s. Here a byte leaves the kernel only when :meth:`receive` asks for it, and
    a cancelled receive or send leaves nothing behind (the raw UNIXSocketStream's
    ``add_reader(future.set_result)`` logs InvalidStateError then). A subclass says how its
    fds are read (:meth:`_recv`), written (:meth:`_send`) and closed: a socket
    (:class:`Stream`), or a client's own stdin and stdout (the gateway's handoff).

    Resource handling: one task may receive while another sends, but never two at once of
    the same kind; the owner closes it once no receive or send is pending.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd, self._write_fd = read_fd, write_fd
        self._closed = False
        # Readiness is watched from the first receive that has to wait until nobody waits when
        # it fires: a request-answer client then costs no epoll registration per receive (the
        # loop's sock_recv adds and removes one each time). Bytes are read only for a receive.
        self._watching: asyncio.AbstractEventLoop | None = None
        self._receiving: tuple[asyncio.Future[bytes], int] | None = None  # a waiting receive, its max
        self._kept: bytes | None = None  # read for a receive cancelled before it took them: the next's
        self._writable: asyncio.Future[None] | None = None  # a send waiting for room

    def _recv(self, max_bytes: int) -> bytes:
        """Read at most *max_bytes* now (``BlockingIOError`` if none are there)."""
        raise NotImplementedError

    def _send(self, data: bytes | memoryview) -> int:
        """Write what the fd takes now (``BlockingIOError`` if none)."""
        raise NotImplementedError

    def _close_fds(self) -> None:
        raise NotImplementedError

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._kept is not None:
            data, self._kept = self._kept, None
        else:
            try:
                data = self._recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                data = await self._receive_when_readable(max_bytes)
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            else:  # it did not wait: yield all the same, or a client that never pauses holds the loop
                await anyio.lowlevel.cancel_shielded_checkpoint()  # shielded: the bytes are ours now
        if not data:
            raise anyio.EndOfStream
        return data

    async def _receive_when_readable(self, max_bytes: int) -> bytes:
        loop = asyncio.get_running_loop()
        if self._watching is None:
            loop.add_reader(self._read_fd, self._on_readable)
            self._watching = loop
        future = loop.create_future()
        self._receiving = future, max_bytes
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._kept = future.result()
            raise
        except OSError as exc:
            raise anyio.BrokenResourceError from exc
        finally:
            self._receiving = None

    def _on_readable(self) -> None:
        if self._receiving is None:  # nobody receives: stop watching, or it fires every loop round
            self._unwatch()
            return
        future, max_bytes = self._receiving
        if future.done():
            return
        # Read here, as the loop's sock_recv does: readiness seen before the last receive took
        # the bytes wakes nobody then (a wake-up, a task step and a recv each call otherwise).
        try:
            data = self._recv(max_bytes)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            future.set_exception(exc)
        else:
            future.set_result(data)

    def _unwatch(self) -> None:
        if self._watching is not None:
            self._watching.remove_reader(self._read_fd)
            self._watching = None

    async def send(self, item: bytes | memoryview) -> None:
        await anyio.lowlevel.checkpoint()
        view = memoryview(item)
        while view:
            view = view[self.send_now(view) :]
            if view:
                await self._room()

    async def _room(self) -> None:
        loop = asyncio.get_running_loop()
        self._writable = future = loop.create_future()
        loop.add_writer(self._write_fd, _wake, future)
        try:
            await future
        finally:
            if self._writable is future:  # else aclose stopped watching already
                self._writable = None
                loop.remove_writer(self._write_fd)

    def send_now(self, data: bytes | memoryview) -> int:
        """Send what the fd takes at once, without waiting; how many bytes that was.

        Error handling: ``BrokenResourceError`` if the peer is gone, ``ClosedResourceError``
        once closed.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self._send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._unwatch()  # before the fd is closed (and maybe reused)
            if self._receiving is not None and not self._receiving[0].done():
                self._receiving[0].set_exception(anyio.ClosedResourceError())  # for that receive
            if self._writable is not None:
                asyncio.get_running_loop().remove_writer(self._write_fd)
                if not self._writable.done():
                    self._writable.set_exception(anyio.ClosedResourceError())
                self._writable = None
            self._close_fds()
        await anyio.lowlevel.checkpoint()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Stream(FdStream, anyio.abc.SocketStream):
    """A connected socket as an :class:`FdStream`."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        super().__init__(sock.fileno(), sock.fileno())

    @property
    def _raw_socket(self) -> socket.socket:
        return self._sock

    def _recv(self, max_bytes: int) -> bytes:
        return self._sock.recv(max_bytes)

    def _send(self, data: bytes | memoryview) -> int:
        return self._sock.send(data)

    def _close_fds(self) -> None:
        self._sock.close()

    async def receive_with_fds(self, max_bytes: int, max_fds: int) -> tuple[bytes, list[int]]:
        """The next bytes (empty at the end), and the fds (SCM_RIGHTS) that came with them, at
        most *max_fds* (the kernel closes the others); the caller owns those fds."""
        if self._closed:
            raise anyio.ClosedResourceError
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, max_bytes, max_fds)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            return data, fds

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)


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
