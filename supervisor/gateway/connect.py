"""``mcp-supervisor connect``: an MCP client's stdio, pumped to the daemon's gateway socket.

Bytes pass through untouched both ways; ``resume`` looks at just enough of each line to know
the requests in flight and the session's set-up. When the daemon goes away (a restart, an
upgrade), connect keeps the client's stdio open, reconnects with backoff, replays the set-up
(``initialize`` under an id of its own, whose answer it drops, then ``notifications/initialized``)
and tells the client to re-list; requests in flight at the break get an error, since they may
or may not have run. Lines that arrive meanwhile are held, a few, and sent once reconnected:
they never reached a daemon, so sending them later is not a replay.

The byte path is asyncio protocols, not tasks: each chunk is handled in its ``data_received``
and written on at once, with no task switch, lock or per-read epoll re-registration (this
halved connect's CPU per call). Back-pressure pauses the reading side. One owner task (anyio)
runs the connections one after another.

Resource handling: :func:`run` owns its connections and the two fds, whose blocking mode it
restores on return. Nothing but protocol bytes goes to stdout; notes go to stderr.

Error handling: no daemon of our uid at the start, or none back within the reconnect timeout,
is :class:`~supervisor.client.DaemonUnreachable` (exit 3 in the CLI).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import socket
import stat
import sys
from collections import deque
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from supervisor.backoff import Backoff
from supervisor.client import DaemonUnreachable
from supervisor.sockets import peer_credentials

from .resume import Downstream, Kind, LineBuffer, Oversize, Peek, SessionMemory, error_line, peek

__all__ = ("EOF_GRACE", "MAX_CLIENT_LINE", "MAX_HELD_BYTES", "MAX_HELD_LINES", "gateway_socket", "run")

# The project's line cap everywhere (extension max_message_bytes, control replies): a client
# line is held whole until its newline, so this is also connect's worst-case memory.
MAX_CLIENT_LINE = 64 << 20
EOF_GRACE = 2.0  # after stdin ends: how long answers still due (and unread output) are waited for
RECONNECT = Backoff(initial=0.05, maximum=1.0, multiplier=2.0, jitter=0.1)  # jitter: N clients at once
MAX_HELD_LINES = 64  # client lines held while reconnecting ...
MAX_HELD_BYTES = 4 << 20  # ... and their bytes; past either, a request is answered with an error
RESTARTED = -32000
TOO_LARGE = -32600
_READ = 65536
_SLICE = 1 << 20  # a big line goes to the socket a slice at a time: never copied whole
_NOBODY_THERE = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR})
_LIST_CHANGED = {
    kind: {"jsonrpc": "2.0", "method": f"notifications/{kind}/list_changed"}
    for kind in ("tools", "prompts", "resources")
}
_LISTEN_KEYS = {"tools": "toolsListChanged", "prompts": "promptsListChanged"}
_LISTEN_KEYS["resources"] = "resourcesListChanged"
_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
# The errors a client may see; a model reads them, so they say what happened and what to do.
_IN_FLIGHT = "the mcp-supervisor daemon restarted during this request; it may or may not have run"
_HELD_OVER = "the mcp-supervisor daemon is restarting; the request was not sent, try again shortly"
_NOT_BACK = "the mcp-supervisor daemon did not come back; the request was not sent"
_INPUT_ENDED = "the client closed its input while the mcp-supervisor daemon was restarting; not sent"


def gateway_socket(control_socket: str) -> str:
    """The gateway's socket: ``mcp.sock`` beside the control socket."""
    return os.path.join(os.path.dirname(control_socket), "mcp.sock")


def _note(message: str) -> None:
    print(f"mcp-supervisor: {message}", file=sys.stderr, flush=True)


class _WrongOwner(DaemonUnreachable):
    """Something of another uid listens on the socket; nothing was sent to it."""


async def _dial(path: str) -> socket.socket:
    """A socket connected to *path*, once the daemon is known to run as our uid."""
    try:
        stream = await anyio.connect_unix(path)
    except PermissionError:
        raise DaemonUnreachable(path, f"permission denied connecting to {path}") from None
    except OSError as exc:
        if exc.errno in _NOBODY_THERE:
            raise DaemonUnreachable(path) from None
        raise DaemonUnreachable(path, f"cannot connect to {path}: {exc.strerror or exc}") from None
    try:
        _pid, uid = peer_credentials(stream)
    except OSError:
        await stream.aclose()
        raise DaemonUnreachable(path, f"the daemon on {path} closed the connection at once") from None
    if uid != os.geteuid():
        await stream.aclose()
        message = f"refusing {path}: it is served by uid {uid}, not by this user (uid {os.geteuid()})"
        raise _WrongOwner(path, message)
    raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    return socket.socket(fileno=raw.detach())


def _pollable(fd: int) -> bool:
    """Whether epoll can watch *fd* (pipes, sockets, terminals; not files or /dev/null)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


class _Link:
    """One connection to the daemon: its transport, its pending slices, the answers awaited."""

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.downstream = Downstream(self._keep, self._done)
        self.backlog: deque[memoryview] = deque()  # slices of a big send, written as the socket drains
        self.full = False  # the socket's send buffer is over its high-water mark
        self.dropped: set[Any] = set()  # ids of connect's own replayed requests
        self.initialize_id: str | None = None
        self.initialize_answer: dict[str, Any] | None = None
        self.answered = anyio.Event()  # the replayed initialize was answered, or the link died
        self.closed = anyio.Event()

    def write(self, lines: list[bytes | bytearray]) -> None:
        """Send *lines*, a newline after each: small ones in one write, a big one in slices."""
        assert self.transport is not None
        if not self.backlog and sum(len(line) for line in lines) <= _SLICE:
            self.transport.write(b"".join(line + b"\n" for line in lines))
            return
        for line in lines:
            view = memoryview(line)
            self.backlog.extend(view[start : start + _SLICE] for start in range(0, len(view), _SLICE))
            self.backlog.append(memoryview(b"\n"))
        self.drain()

    def drain(self) -> None:
        """Write backlog slices while the socket takes them; stdin waits until it is empty."""
        assert self.transport is not None
        while self.backlog and self.transport.get_write_buffer_size() < _SLICE:
            self.transport.write(self.backlog.popleft())
        self.relay.flow(self)

    def _keep(self, seen: Peek) -> bool:
        if seen.kind is not Kind.RESPONSE or seen.id not in self.dropped:
            return True
        self.dropped.discard(seen.id)
        if seen.id == self.initialize_id:
            self.initialize_answer = seen.message or {"result": None}
            self.answered.set()
        return False

    def _done(self, seen: Peek) -> None:
        if seen.kind is Kind.RESPONSE:
            self.relay.memory.answered(seen.id)


class _DaemonSide(asyncio.Protocol):
    def __init__(self, link: _Link) -> None:
        self.link = link

    def data_received(self, data: bytes) -> None:
        self.link.relay.from_daemon(self.link, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.relay.daemon_lost(self.link)

    def pause_writing(self) -> None:
        self.link.full = True
        self.link.relay.flow(self.link)

    def resume_writing(self) -> None:
        self.link.full = False
        self.link.drain()


class _ClientIn(asyncio.Protocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_client(data)

    def eof_received(self) -> bool:
        self.relay.client_ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.client_ended()


class _ClientOut(asyncio.BaseProtocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.flushed = anyio.Event()  # the transport closed: all written, or the client is gone

    def pause_writing(self) -> None:
        self.relay.pause_daemon(True)

    def resume_writing(self) -> None:
        self.relay.pause_daemon(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.flushed.set()
        if exc is not None:  # EPIPE, or the read end closed: nobody reads the answers any more
            self.relay.client_gone()


async def run(socket_path: str, *, reconnect_timeout: float = 60.0, stdin: int = 0, stdout: int = 1) -> int:
    """Pump *stdin*/*stdout* to the gateway socket at *socket_path* until stdin ends; return 0.

    Raises:
        DaemonUnreachable: nothing listens at *socket_path*, a process of another uid does (no
            byte is sent to it), or the daemon went away and did not come back (or would not
            resume the session) within *reconnect_timeout* seconds.
    """
    sock = await _dial(socket_path)
    blocking = [(fd, os.get_blocking(fd)) for fd in {stdin, stdout}]
    try:
        return await _Relay(socket_path, reconnect_timeout).serve(sock, stdin, stdout)
    finally:
        for fd, mode in blocking:  # the fds may be shared with the client's terminal
            os.set_blocking(fd, mode)


class _Relay:
    """Owns the client's session across connections: sync handlers for the byte path, one owner task."""

    def __init__(self, path: str, reconnect_timeout: float) -> None:
        self.path, self.reconnect_timeout = path, reconnect_timeout
        self.memory = SessionMemory()
        self.lines = LineBuffer(MAX_CLIENT_LINE)
        self.live: _Link | None = None  # where client lines go; None while away or resuming
        self.links: set[_Link] = set()
        self.held: list[tuple[bytes | bytearray, Peek]] = []
        self.held_bytes = 0
        self.stdin_ended = self.gone = False
        self.ending = anyio.Event()  # stdin ended or stdout went away
        self.drained = anyio.Event()  # ... and no answer is due any more
        self.gave_up: str | None = None
        self._stdin: asyncio.ReadTransport | None = None
        self._stdin_paused = False
        self._stdin_resumed = anyio.Event()  # for the thread reader, when stdin is not pollable
        self._stdout: asyncio.WriteTransport | None = None
        self._stdout_fd = -1
        self._daemon_paused = False
        self._deadline: float | None = None  # of the current reconnection
        self._ids = itertools.count(1)
        self._scope = anyio.CancelScope()

    async def serve(self, sock: socket.socket, stdin: int, stdout: int) -> int:
        loop = asyncio.get_running_loop()
        out_protocol = _ClientOut(self)
        if _pollable(stdout):
            pipe = os.fdopen(os.dup(stdout), "wb", buffering=0)
            self._stdout, _ = await loop.connect_write_pipe(lambda: out_protocol, pipe)
        else:
            self._stdout_fd = stdout  # a file: plain blocking writes
        link = await self._open(sock)
        self.live = link
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    if _pollable(stdin):
                        pipe = os.fdopen(os.dup(stdin), "rb", buffering=0)
                        self._stdin, _ = await loop.connect_read_pipe(lambda: _ClientIn(self), pipe)
                    else:
                        tg.start_soon(self._read_file, stdin)
                    tg.start_soon(self._watch_end)
                    await self._connections(link)
        finally:
            await self._close(out_protocol)
        if self.gave_up is not None:
            raise DaemonUnreachable(self.path, self.gave_up)
        return 0

    async def _close(self, out_protocol: _ClientOut) -> None:
        for each in list(self.links):
            if each.transport is not None:
                each.transport.abort()
        if self._stdin is not None:
            self._stdin.close()
        if self._stdout is not None:  # let the last answers out, within the grace
            self._stdout.close()
            with anyio.move_on_after(EOF_GRACE, shield=True):
                await out_protocol.flushed.wait()
            if not out_protocol.flushed.is_set():  # the client stopped reading: give up on it
                self._stdout.abort()

    async def _read_file(self, fd: int) -> None:
        while chunk := await anyio.to_thread.run_sync(os.read, fd, _READ, abandon_on_cancel=True):
            self.from_client(chunk)
            while self._stdin_paused:
                await self._stdin_resumed.wait()
        self.client_ended()

    async def _watch_end(self) -> None:
        await self.ending.wait()
        if not self.gone and self.live is None:
            self._answer_held(_INPUT_ENDED)
        elif not self.gone and self._waiting():
            with anyio.move_on_after(EOF_GRACE):
                await self.drained.wait()
        self._scope.cancel()

    # --- the owner: one connection after another ---

    async def _open(self, sock: socket.socket) -> _Link:
        link = _Link(self)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: _DaemonSide(link), sock=sock)
        transport.set_write_buffer_limits(high=_SLICE, low=_SLICE // 4)
        link.transport = transport
        self.links.add(link)
        if self._daemon_paused:
            transport.pause_reading()
        return link

    async def _connections(self, link: _Link) -> None:
        while True:
            await link.closed.wait()
            if self.ending.is_set():
                return  # _watch_end finishes
            next_link = None if self.gave_up is not None else await self._redial()
            if next_link is None:
                self._answer_held(_NOT_BACK)
                self._scope.cancel()
                return
            link = next_link
            if not await self._resume(link) and link.transport is not None:
                link.transport.abort()

    def _lost(self) -> None:
        self.live = None
        self._deadline = anyio.current_time() + self.reconnect_timeout
        failed = self.memory.broken()
        self._write(b"".join(error_line(failed_id, RESTARTED, _IN_FLIGHT) for failed_id in failed))
        self._pause_stdin(False)
        _note(f"lost the daemon on {self.path}; reconnecting for up to {self.reconnect_timeout:g} s")

    async def _redial(self) -> _Link | None:
        """A new connection, trying with backoff until the deadline; None when giving up."""
        assert self._deadline is not None
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._open(await _dial(self.path))
            except _WrongOwner as exc:
                self.gave_up = str(exc)
                return None
            except (DaemonUnreachable, OSError):
                pass
            remaining = self._deadline - anyio.current_time()
            if remaining <= 0:
                timeout = f"{self.reconnect_timeout:g} s"
                self.gave_up = f"the daemon on {self.path} went away and did not come back within {timeout}"
                return None
            await anyio.sleep(min(RECONNECT.delay(attempt), remaining))

    async def _resume(self, link: _Link) -> bool:
        """Replay the session's set-up on *link*, send what was held, and make it live."""
        assert self._deadline is not None

        def new_id() -> str:
            request_id = f"mcp-supervisor-connect-{os.getpid()}-{next(self._ids)}"
            link.dropped.add(request_id)
            return request_id

        initialize, lines = self.memory.replay(new_id)
        if initialize is not None:
            link.initialize_id = initialize["id"]
            link.write([json.dumps(initialize).encode()])
            with anyio.move_on_after(self._deadline - anyio.current_time()):
                await link.answered.wait()
            answer = link.initialize_answer
            if answer is None:
                return False  # it closed, or the deadline passed (the next dial gives up)
            if "error" in answer:
                error = answer["error"]
                reason = error.get("message") if isinstance(error, dict) else error
                self.gave_up = f"the restarted daemon on {self.path} would not resume the session: {reason}"
                return False
        if link.closed.is_set():
            return False
        link.write(lines)  # type: ignore[arg-type]
        held, self.held, self.held_bytes = self.held, [], 0
        self._send(link, [line for line, _ in held])
        self.live, self._deadline = link, None
        _note(f"reconnected to the daemon on {self.path}")
        self._write(self._changes(link))
        return True

    def _changes(self, link: _Link) -> bytes:
        """list_changed for what the new daemon serves (both eras), so the client re-lists."""
        lines: list[dict[str, Any]] = []
        if self.memory.remembered.initialize is not None:
            result = (link.initialize_answer or {}).get("result")
            capabilities = result.get("capabilities") if isinstance(result, dict) else None
            kinds = [k for k in _LIST_CHANGED if not isinstance(capabilities, dict) or k in capabilities]
            lines += [_LIST_CHANGED[kind] for kind in kinds]
        for request_id, line in self.memory.listens.items():  # 2026-07-28: events on the listen stream
            params = json.loads(line).get("params") or {}
            wanted = params.get("notifications") or {}
            meta = {"_meta": {_SUBSCRIPTION_ID: request_id}}
            kinds = [kind for kind, key in _LISTEN_KEYS.items() if wanted.get(key)]
            lines += [{**_LIST_CHANGED[kind], "params": meta} for kind in kinds]
        return b"".join(json.dumps(line).encode() + b"\n" for line in lines)

    # --- the byte path (protocol callbacks: synchronous, in order) ---

    def _write(self, data: bytes) -> None:
        if not data or self.gone:
            return
        if self._stdout is not None:
            self._stdout.write(data)
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._stdout_fd, view) :]
        except OSError:
            self.client_gone()

    def from_daemon(self, link: _Link, data: bytes) -> None:
        self._write(link.downstream.feed(data))
        if self.stdin_ended and not self._waiting():
            self.drained.set()

    def daemon_lost(self, link: _Link) -> None:
        self._write(link.downstream.cut())
        link.backlog.clear()
        self.links.discard(link)
        link.answered.set()
        link.closed.set()
        if self.ending.is_set():
            self.drained.set()  # nothing more can come
        elif self.live is link:
            self._lost()  # now, so that no client line goes to the dead link meanwhile

    def from_client(self, data: bytes) -> None:
        lines = self.lines.feed(data)
        if not lines:
            return
        if self.live is None:
            self._hold(lines)
        else:
            self._send(self.live, lines)

    def client_ended(self) -> None:
        self.stdin_ended = True
        self.ending.set()

    def client_gone(self) -> None:
        self.gone = True
        self.ending.set()

    def _waiting(self) -> bool:
        """Whether an answer is still due (listen streams never end by themselves)."""
        return len(self.memory.in_flight) > len(self.memory.listens)

    def _send(self, link: _Link, lines: list[bytes | bytearray | Oversize]) -> None:
        out: list[bytes | bytearray] = []
        for line in lines:
            if isinstance(line, Oversize):
                self._write(self._too_large(line))
                continue
            self.memory.sent(line, peek(line))
            out.append(line)
        if out and not link.closed.is_set():  # else it is failed with the rest at the break
            link.write(out)

    def _too_large(self, line: Oversize) -> bytes:
        _note(f"a client message of {line.size} bytes is over the {MAX_CLIENT_LINE} byte limit; not sent")
        seen = peek(line.head, tail=line.tail)
        if seen.kind is not Kind.REQUEST or seen.id is None:
            return b""
        message = f"request too large ({line.size} bytes, over {MAX_CLIENT_LINE}); it was not sent"
        return error_line(seen.id, TOO_LARGE, message)

    def _hold(self, lines: list[bytes | bytearray | Oversize]) -> None:
        """While away: keep a few lines for the next connection; answer requests past that."""
        for line in lines:
            if isinstance(line, Oversize):
                self._write(self._too_large(line))
                continue
            seen = peek(line)
            if seen.kind is Kind.RESPONSE:
                continue  # to a request of the daemon that is gone
            if seen.method == "notifications/cancelled" and self._unhold(seen):
                continue
            if len(self.held) < MAX_HELD_LINES and self.held_bytes + len(line) <= MAX_HELD_BYTES:
                self.held.append((line, seen))
                self.held_bytes += len(line)
            elif seen.kind is Kind.REQUEST and seen.id is not None:
                self._write(error_line(seen.id, RESTARTED, _HELD_OVER))

    def _unhold(self, cancel: Peek) -> bool:
        params = (cancel.message or {}).get("params")
        target = params.get("requestId") if isinstance(params, dict) else None
        kept = [(line, p) for line, p in self.held if p.kind is not Kind.REQUEST or p.id != target]
        found = len(kept) < len(self.held)
        self.held, self.held_bytes = kept, sum(len(line) for line, _ in kept)
        return found

    def _answer_held(self, message: str) -> None:
        held, self.held, self.held_bytes = self.held, [], 0
        ids = [seen.id for _, seen in held if seen.kind is Kind.REQUEST and seen.id is not None]
        self._write(b"".join(error_line(request_id, RESTARTED, message) for request_id in ids))

    # --- back-pressure ---

    def flow(self, link: _Link) -> None:
        """stdin waits while the live link's socket is full or a big send is still going out."""
        if link is self.live:
            self._pause_stdin(link.full or bool(link.backlog))

    def _pause_stdin(self, paused: bool) -> None:
        if paused == self._stdin_paused:
            return
        self._stdin_paused = paused
        if self._stdin is not None:
            (self._stdin.pause_reading if paused else self._stdin.resume_reading)()
        elif not paused:
            self._stdin_resumed.set()
            self._stdin_resumed = anyio.Event()

    def pause_daemon(self, paused: bool) -> None:
        """The client is not reading its stdout: stop reading the daemon until it does."""
        self._daemon_paused = paused
        for link in self.links:
            if link.transport is not None and not link.transport.is_closing():
                (link.transport.pause_reading if paused else link.transport.resume_reading)()
