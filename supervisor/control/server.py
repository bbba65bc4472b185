"""The control socket: JSON-RPC 2.0 over a unix socket, one JSON object per line.

Resource handling: :func:`serve` owns the listener, the socket file and a task group with one
task per connection. That task reads one request, handles it, writes its reply, and only then
reads the next: one request in flight per connection, and nothing is read while a reply is
unsent, so a client that pipelines without reading fills its own socket buffer (which the
kernel charges to the sender), never the daemon. What one connection can hold is bounded: a
request line (:data:`MAX_FRAME`), one reply, :data:`REPLY_TIMEOUT` seconds to write it.

The operator always gets in: at :data:`MAX_CONNECTIONS` a new client is still accepted, and
the connection with the least recent activity that is not running a request is closed for
it; while at the limit, idle connections get :data:`CROWDED_IDLE_TIMEOUT` instead of
:data:`IDLE_TIMEOUT`. Error handling: whatever a client sends and whatever a handler raises
becomes a JSON-RPC error for that one client (:mod:`supervisor.control.rpc`), never reaching the group.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor import sockets
from supervisor.control import rpc
from supervisor.control.codes import INVALID_REQUEST, SUPERVISOR_ERROR
from supervisor.control.methods import METHODS, Backend, Method
from supervisor.sockets import Spare

__all__ = (
    "CROWDED_IDLE_TIMEOUT",
    "IDLE_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_FRAME",
    "METHODS",
    "REPLY_TIMEOUT",
    "Backend",
    "Method",
    "serve",
)

log = structlog.get_logger(__name__)

MAX_FRAME = 1 << 20  # bytes in one request line, newline excluded
MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 300.0  # seconds a connection may wait for its next request
CROWDED_IDLE_TIMEOUT = 5.0  # the same while MAX_CONNECTIONS are open
REPLY_TIMEOUT = 10.0  # seconds to write one reply; a client that does not read is then closed

_TOO_LARGE = "request too large (over 1 MiB)"
_EVICTED = "connection closed to make room for a new client (it was the idlest)"
_GOODBYE_TIMEOUT = 1.0  # a short notice to a client we are turning away or closing


class _FrameTooLarge(Exception):
    pass


@dataclass(eq=False, slots=True)
class _Connection:
    """One client as the server sees it; only its own task and the accept loop touch it."""

    scope: anyio.CancelScope
    last_activity: float  # monotonic: accepted, or last request received or reply written
    running: bool = False  # a request is being handled: never evicted then
    evicted: bool = False
    read_scope: anyio.CancelScope | None = None  # while waiting for a request; holds the idle deadline


class _Server:
    """The accept loop and the per-connection conversation; one instance per serve() call."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_connections: int,
        idle_timeout: float,
        crowded_idle_timeout: float,
        reply_timeout: float,
    ) -> None:
        self._backend = backend
        self._max_connections = max_connections
        self._idle_timeout = idle_timeout
        self._crowded_idle_timeout = min(crowded_idle_timeout, idle_timeout)
        self._reply_timeout = reply_timeout
        self._connections: set[_Connection] = set()

    async def run(self, listener: anyio.abc.SocketListener, task_status: anyio.abc.TaskStatus[None]) -> None:
        spare = Spare()  # the operator gets in even when the process is out of fds
        try:
            async with anyio.create_task_group() as connections:
                task_status.started()
                while True:
                    stream = await sockets.next_client(listener, event="control.accept_failed", spare=spare)
                    if len(self._connections) >= self._max_connections and not self._evict_idlest():
                        log.warning("control.too_many_connections", limit=self._max_connections)
                        await self._refuse(stream, "too many connections, each with a request in progress")
                        continue
                    connection = _Connection(anyio.CancelScope(), time.monotonic())
                    self._connections.add(connection)
                    self._apply_idle_timeout()
                    connections.start_soon(self._connection, stream, connection)
        finally:
            spare.close()

    def _current_idle_timeout(self) -> float:
        crowded = len(self._connections) >= self._max_connections
        return self._crowded_idle_timeout if crowded else self._idle_timeout

    def _apply_idle_timeout(self) -> None:
        """Move every waiting connection's deadline to the timeout that applies now."""
        timeout = self._current_idle_timeout()
        for connection in self._connections:
            if connection.read_scope is not None:
                connection.read_scope.deadline = connection.last_activity + timeout

    def _evict_idlest(self) -> bool:
        """Close the connection idle the longest, unless each one is running a request."""
        candidates = [c for c in self._connections if not c.running]
        if not candidates:
            return False
        victim = min(candidates, key=lambda c: c.last_activity)
        victim.evicted = True
        self._connections.discard(victim)
        # Waiting for a request: end just the wait, so it can say why. Else (a reply stuck
        # in a client that does not read) end the whole conversation.
        (victim.read_scope or victim.scope).cancel()
        log.info("control.connection_evicted", idle_s=round(time.monotonic() - victim.last_activity, 1))
        return True

    async def _refuse(self, stream: anyio.abc.SocketStream, message: str) -> None:
        """Tell a fresh client why it is turned away; a small reply never fills a new socket."""
        with (
            anyio.move_on_after(_GOODBYE_TIMEOUT),
            contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError),
        ):
            await stream.send(rpc.encode_error(None, SUPERVISOR_ERROR, message))
        await stream.aclose()

    async def _connection(self, stream: anyio.abc.SocketStream, connection: _Connection) -> None:
        try:
            async with stream:
                with connection.scope:
                    await self._converse(stream, connection)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            log.debug("control.client_gone")
        except Exception:
            log.exception("control.connection_crashed")
        finally:
            self._connections.discard(connection)
            self._apply_idle_timeout()  # below the limit again: the long timeout is back

    async def _converse(self, stream: anyio.abc.SocketStream, connection: _Connection) -> None:
        pid, uid = sockets.peer_credentials(stream)
        if not sockets.trusted_uid(uid):
            log.warning("control.peer_refused", uid=uid, pid=pid)
            refusal = f"permission denied: uid {uid} may not use this socket"
            await self._goodbye(stream, SUPERVISOR_ERROR, refusal)
            return
        reader = BufferedByteReceiveStream(stream)
        while True:
            try:
                line = await self._receive_line(reader, connection)
            except _FrameTooLarge:
                log.warning("control.frame_too_large", limit=MAX_FRAME, pid=pid)
                await self._goodbye(stream, INVALID_REQUEST, _TOO_LARGE)
                return
            if line is None:
                if connection.evicted:
                    await self._goodbye(stream, SUPERVISOR_ERROR, _EVICTED)
                return
            if not line.strip():
                continue
            connection.running = True
            exchange = _Exchange(lambda data: self._send(stream, data, self._reply_timeout), connection.scope)
            try:
                reply = await rpc.handle(self._backend, line, exchange.notify)
            finally:
                connection.running = False
            if reply is not None and not await exchange.reply(reply):
                return
            connection.last_activity = time.monotonic()

    async def _receive_line(self, reader: BufferedByteReceiveStream, connection: _Connection) -> bytes | None:
        """The next request line; None when the client has gone, stayed idle too long or was evicted."""
        line: bytes | None = None
        deadline = connection.last_activity + self._current_idle_timeout()
        with anyio.CancelScope(deadline=deadline) as connection.read_scope:
            try:
                line = await reader.receive_until(b"\n", MAX_FRAME)
            except anyio.DelimiterNotFound:
                raise _FrameTooLarge from None
            except anyio.IncompleteRead:
                return None
            finally:
                connection.read_scope = None
        if connection.evicted:  # also when the line came in just as the eviction did
            return None
        if line is None:
            log.debug("control.connection_idle", timeout=self._current_idle_timeout())
            return None
        if len(line) > MAX_FRAME:  # a long line can arrive whole in one read
            raise _FrameTooLarge
        connection.last_activity = time.monotonic()
        return line

    async def _goodbye(self, stream: anyio.abc.SocketStream, code: int, message: str) -> None:
        """A last error (id null) before closing; a client that does not take it is not waited for."""
        await self._send(stream, rpc.encode_error(None, code, message), _GOODBYE_TIMEOUT)

    async def _send(self, stream: anyio.abc.SocketStream, payload: bytes, timeout: float) -> bool:  # noqa: ASYNC109
        """Write one reply; False if the client did not take it within *timeout* seconds."""
        with anyio.move_on_after(timeout):
            await stream.send(payload)
            return True
        log.warning("control.client_not_reading", timeout=timeout, size=len(payload))
        return False


class _Exchange:
    """One request's lines to its client: notifications (progress) first, then the reply; whole lines."""

    def __init__(self, send: Callable[[bytes], Awaitable[bool]], scope: anyio.CancelScope) -> None:
        self._send, self._scope = send, scope  # the connection's: cancelled when its client is gone
        self._sending = anyio.Lock()
        self._replied = False

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        async with self._sending:
            if self._replied:  # a late one: the client has its answer
                return
            line = rpc.encode_notification(method, params)
            if not await self._send(line):
                self._scope.cancel()  # as for a reply it does not take: the request ends

    async def reply(self, line: bytes) -> bool:
        async with self._sending:
            self._replied = True
            return await self._send(line)


async def serve(
    backend: Backend,
    path: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    idle_timeout: float = IDLE_TIMEOUT,
    crowded_idle_timeout: float = CROWDED_IDLE_TIMEOUT,
    reply_timeout: float = REPLY_TIMEOUT,
    listener: anyio.abc.SocketListener | None = None,
    socket_identity: tuple[int, int] | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control protocol on the unix socket *path* until cancelled.

    Args:
        backend: the daemon the methods act on.
        path: the socket file (0600); its directory must be ours and 0700, and is created so
            if missing (:func:`supervisor.sockets.prepare_directory`).
        max_connections: clients served at once; one more closes the idlest connection, or is
            told "too many connections" when every connection is running a request.
        idle_timeout: a connection that sends no request for this many seconds is closed.
        crowded_idle_timeout: the idle timeout while *max_connections* are open.
        reply_timeout: a reply the client has not taken within this many seconds closes it.
        listener: *path* already bound by :func:`supervisor.sockets.listen` (the daemon binds
            it first, so that a second daemon spawns nothing); served and closed from here on.
        socket_identity: the :func:`supervisor.sockets.identity` of *listener*'s file, taken
            when it was bound: what is removed on exit.
        task_status: ``started()`` once the socket accepts connections.

    Raises:
        SupervisorError: the directory is not safe, another daemon is listening on *path*,
            or it cannot be bound.

    Resource handling: the socket file is removed on exit unless another process replaced it.
    """
    listener = listener or await sockets.listen(path)
    identity = socket_identity or sockets.identity(path)
    server = _Server(
        backend,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
        crowded_idle_timeout=crowded_idle_timeout,
        reply_timeout=reply_timeout,
    )
    log.info("control.listening", path=path)
    try:
        async with listener:
            await server.run(listener, task_status)
    finally:
        sockets.unlink_if_ours(path, identity)
        log.info("control.closed", path=path)
