"""``mcp-supervisor connect``: an MCP client's stdio, pumped to the daemon's gateway socket.

Bytes pass through untouched both ways; ``resume`` looks at just enough of each line to know
the requests in flight and the session's set-up. When the daemon goes away (a restart, an
upgrade), connect keeps the client's stdio open, reconnects with backoff, replays the set-up
(``initialize`` under an id of its own, whose answer it drops, then ``notifications/initialized``)
and tells the client to re-list; requests in flight at the break get an error, since they may
or may not have run. Lines that arrive meanwhile are held, a few, and sent once reconnected:
they never reached a daemon, so sending them later is not a replay.

Resource handling: :func:`run` owns its connections and the two fds, set non-blocking while it
runs (restored on return). Nothing but protocol bytes goes to stdout; notes go to stderr.

Error handling: no daemon of our uid at the start, or none back within the reconnect timeout,
is :class:`~supervisor.client.DaemonUnreachable` (exit 3 in the CLI).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import socket
import sys
from typing import Any

import anyio
import anyio.abc

from supervisor.backoff import Backoff
from supervisor.client import DaemonUnreachable
from supervisor.sockets import peer_credentials

from .resume import Downstream, Kind, LineBuffer, Oversize, Peek, SessionMemory, error_line, peek

__all__ = ("EOF_GRACE", "MAX_CLIENT_LINE", "gateway_socket", "run")

# The project's line cap everywhere (extension max_message_bytes, control replies): a client
# line is held whole until its newline, so this is also connect's worst-case memory.
MAX_CLIENT_LINE = 64 << 20
EOF_GRACE = 2.0  # after stdin ends, how long answers still in flight are waited for
RECONNECT = Backoff(initial=0.05, maximum=1.0, multiplier=2.0, jitter=0.1)  # jitter: N clients at once
MAX_HELD_LINES = 64  # client lines held while reconnecting ...
MAX_HELD_BYTES = 4 << 20  # ... and their bytes; past either, a request is answered with an error
RESTARTED = -32000
TOO_LARGE = -32600
_READ = 65536  # under glibc's mmap threshold: a read buffer is a cheap heap block
_SEND_SLICE = 1 << 20  # a big line goes out in slices, so the transport never copies it whole
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


async def _dial(path: str) -> anyio.abc.SocketStream:
    """Connect to *path* and check that the daemon runs as our uid before anything is sent."""
    try:
        unix = await anyio.connect_unix(path)
    except PermissionError:
        raise DaemonUnreachable(path, f"permission denied connecting to {path}") from None
    except OSError as exc:
        if exc.errno in _NOBODY_THERE:
            raise DaemonUnreachable(path) from None
        raise DaemonUnreachable(path, f"cannot connect to {path}: {exc.strerror or exc}") from None
    # The transport-based stream: anyio's UNIXSocketStream logs InvalidStateError when a cancel
    # lands as data arrives (see sockets.accept), and it reads with two syscalls more.
    raw: socket.socket = unix.extra(anyio.abc.SocketAttribute.raw_socket)
    sock = socket.socket(fileno=raw.detach())
    try:
        stream = await anyio.abc.SocketStream.from_socket(sock)
        _pid, uid = peer_credentials(stream)
    except OSError as exc:  # it hung up already: a daemon on its way down
        sock.close()
        raise DaemonUnreachable(path, f"the daemon on {path} closed the connection at once") from exc
    if uid != os.geteuid():
        await stream.aclose()
        message = f"refusing {path}: it is served by uid {uid}, not by this user (uid {os.geteuid()})"
        raise _WrongOwner(path, message)
    return stream


class _Stdio:
    """The client's stdin and stdout as non-blocking fds: no threads, one syscall per chunk."""

    def __init__(self, stdin: int, stdout: int) -> None:
        self.stdin, self.stdout = stdin, stdout
        self._blocking = [(fd, os.get_blocking(fd)) for fd in {stdin, stdout}]
        for fd, _ in self._blocking:
            os.set_blocking(fd, False)
        self._lock = anyio.Lock(fast_acquire=True)  # three writers; one line must not split another
        self.gone = anyio.Event()  # the client stopped reading its stdout

    def restore(self) -> None:
        for fd, blocking in self._blocking:  # the fds may be shared with the client's terminal
            os.set_blocking(fd, blocking)

    async def read(self) -> bytes:
        """The next chunk of stdin; empty at its end (or when it fails)."""
        while True:
            try:
                return os.read(self.stdin, _READ)
            except BlockingIOError:
                await anyio.wait_readable(self.stdin)
            except OSError:
                return b""

    async def write(self, data: bytes) -> None:
        """Write all of *data*; once the client stopped reading, drop it."""
        async with self._lock:
            view = memoryview(data)
            while view and not self.gone.is_set():
                try:
                    view = view[os.write(self.stdout, view) :]
                except BlockingIOError:
                    await anyio.wait_writable(self.stdout)
                except OSError:  # EPIPE: nobody reads the answers any more
                    self.gone.set()


class _Link:
    """One connection to the daemon, and the answers connect waits for on it."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.dropped: set[Any] = set()  # ids of connect's own replayed requests
        self.initialize_id: str | None = None
        self.initialize_answer: dict[str, Any] | None = None
        self.answered = anyio.Event()

    async def send(self, lines: list[bytes | bytearray]) -> None:
        """Send *lines*, a newline after each: small ones in one write, a big one without a copy."""
        if sum(len(line) for line in lines) <= _SEND_SLICE:
            await self.stream.send(b"".join(line + b"\n" for line in lines))
            return
        for line in lines:
            view = memoryview(line)
            for start in range(0, len(view), _SEND_SLICE):
                await self.stream.send(view[start : start + _SEND_SLICE])
            await self.stream.send(b"\n")


async def run(socket_path: str, *, reconnect_timeout: float = 60.0, stdin: int = 0, stdout: int = 1) -> int:
    """Pump *stdin*/*stdout* to the gateway socket at *socket_path* until stdin ends; return 0.

    Raises:
        DaemonUnreachable: nothing listens at *socket_path*, a process of another uid does (no
            byte is sent to it), or the daemon went away and did not come back (or would not
            resume the session) within *reconnect_timeout* seconds.
    """
    stream = await _dial(socket_path)
    stdio = _Stdio(stdin, stdout)
    try:
        return await _Relay(socket_path, reconnect_timeout, stdio).serve(stream)
    finally:
        stdio.restore()


class _Relay:
    """Owns the client's session across connections. Three tasks: stdin, the owner, one pump."""

    def __init__(self, path: str, reconnect_timeout: float, stdio: _Stdio) -> None:
        self.path, self.reconnect_timeout, self.stdio = path, reconnect_timeout, stdio
        self.memory = SessionMemory()
        self.live: _Link | None = None  # where client lines go; None while away or resuming
        self.held: list[tuple[bytes | bytearray, Peek]] = []
        self.held_bytes = 0
        self.stdin_ended = False
        self.drained = anyio.Event()  # stdin ended and every answer came back
        self.gave_up: str | None = None
        self._deadline: float | None = None  # of the current reconnection
        self._ids = itertools.count(1)
        self._scope = anyio.CancelScope()

    async def serve(self, stream: anyio.abc.SocketStream) -> int:
        with self._scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_client)
                tg.start_soon(self._watch_client)
                await self._connections(_Link(stream))
        if self.gave_up is not None:
            raise DaemonUnreachable(self.path, self.gave_up)
        return 0

    def _finish(self) -> None:
        self._scope.cancel()

    async def _watch_client(self) -> None:
        await self.stdio.gone.wait()
        self._finish()

    # --- the owner: one connection after another ---

    async def _connections(self, link: _Link) -> None:
        self.live = link
        while True:
            await self._serve(link)
            if self.stdin_ended:
                self._finish()
                return
            if self.live is not None:
                await self._lost()
            next_link = None if self.gave_up is not None else await self._redial()
            if next_link is None:
                await self._answer_held(_NOT_BACK)
                self._finish()
                return
            link = next_link

    async def _serve(self, link: _Link) -> None:
        """Run the pump on *link* (resuming the session first unless it is live) until it ends."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump, link, tg.cancel_scope)
                if self.live is not link and not await self._resume(link):
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await link.stream.aclose()

    async def _lost(self) -> None:
        self.live = None
        self._deadline = anyio.current_time() + self.reconnect_timeout
        failed = self.memory.broken()
        await self.stdio.write(b"".join(error_line(failed_id, RESTARTED, _IN_FLIGHT) for failed_id in failed))
        _note(f"lost the daemon on {self.path}; reconnecting for up to {self.reconnect_timeout:g} s")

    async def _redial(self) -> _Link | None:
        """A new connection, trying with backoff until the deadline; None when giving up."""
        assert self._deadline is not None
        attempt = 0
        while True:
            attempt += 1
            try:
                return _Link(await _dial(self.path))
            except _WrongOwner as exc:
                self.gave_up = str(exc)
                return None
            except DaemonUnreachable:
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
            await link.send([json.dumps(initialize).encode()])
            with anyio.move_on_after(self._deadline - anyio.current_time()):
                await link.answered.wait()
            answer = link.initialize_answer
            if answer is None:
                return False  # the deadline passed; the next dial gives up
            if "error" in answer:
                error = answer["error"]
                reason = error.get("message") if isinstance(error, dict) else error
                self.gave_up = f"the restarted daemon on {self.path} would not resume the session: {reason}"
                return False
        if lines:
            await link.send(lines)  # type: ignore[arg-type]
        while self.held:  # the stdin task keeps holding until live is set, after the last batch
            batch, self.held, self.held_bytes = self.held, [], 0
            await self._send(link, [line for line, _ in batch])
        self.live, self._deadline = link, None
        _note(f"reconnected to the daemon on {self.path}")
        await self.stdio.write(self._changes(link))
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

    # --- the daemon's lines to the client ---

    async def _pump(self, link: _Link, scope: anyio.CancelScope) -> None:
        def keep(seen: Peek) -> bool:
            if seen.kind is not Kind.RESPONSE or seen.id not in link.dropped:
                return True
            link.dropped.discard(seen.id)
            if seen.id == link.initialize_id:
                link.initialize_answer = seen.message or {"result": None}
                link.answered.set()
            return False

        def done(seen: Peek) -> None:
            if seen.kind is Kind.RESPONSE:
                self.memory.answered(seen.id)

        downstream = Downstream(keep, done)
        while True:
            try:
                chunk = await link.stream.receive(_READ)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                break
            data = downstream.feed(chunk)
            if data:
                await self.stdio.write(data)
            if self.stdin_ended and not self._waiting():
                self.drained.set()
        await self.stdio.write(downstream.cut())
        scope.cancel()

    def _waiting(self) -> bool:
        """Whether an answer is still due (listen streams never end by themselves)."""
        return len(self.memory.in_flight) > len(self.memory.listens)

    # --- the client's lines to the daemon ---

    async def _read_client(self) -> None:
        buffer = LineBuffer(MAX_CLIENT_LINE)
        while chunk := await self.stdio.read():
            lines = buffer.feed(chunk)
            link = self.live
            if not lines:
                continue
            if link is None:
                await self._hold(lines)
            else:
                await self._send(link, lines)
        await self._client_ended()

    async def _send(self, link: _Link, lines: list[bytes | bytearray | Oversize]) -> None:
        out: list[bytes | bytearray] = []
        replies: list[bytes] = []
        for line in lines:
            if isinstance(line, Oversize):
                replies += self._too_large(line)
                continue
            self.memory.sent(line, peek(line))  # before sending: the answer may come back at once
            out.append(line)
        if out:
            # On a break the pump notices, and what was just tracked is failed there.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await link.send(out)
        if replies:
            await self.stdio.write(b"".join(replies))

    def _too_large(self, line: Oversize) -> list[bytes]:
        _note(f"a client message of {line.size} bytes is over the {MAX_CLIENT_LINE} byte limit; not sent")
        seen = peek(line.head, tail=line.tail)
        if seen.kind is not Kind.REQUEST or seen.id is None:
            return []
        message = f"request too large ({line.size} bytes, over {MAX_CLIENT_LINE}); it was not sent"
        return [error_line(seen.id, TOO_LARGE, message)]

    async def _hold(self, lines: list[bytes | bytearray | Oversize]) -> None:
        """While away: keep a few lines for the next connection; answer requests past that."""
        replies: list[bytes] = []
        for line in lines:
            if isinstance(line, Oversize):
                replies += self._too_large(line)
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
                replies.append(error_line(seen.id, RESTARTED, _HELD_OVER))
        if replies:
            await self.stdio.write(b"".join(replies))

    def _unhold(self, cancel: Peek) -> bool:
        params = (cancel.message or {}).get("params")
        target = params.get("requestId") if isinstance(params, dict) else None
        kept = [(line, p) for line, p in self.held if p.kind is not Kind.REQUEST or p.id != target]
        found = len(kept) < len(self.held)
        self.held, self.held_bytes = kept, sum(len(line) for line, _ in kept)
        return found

    async def _answer_held(self, message: str) -> None:
        held, self.held, self.held_bytes = self.held, [], 0
        ids = [seen.id for _, seen in held if seen.kind is Kind.REQUEST and seen.id is not None]
        await self.stdio.write(b"".join(error_line(request_id, RESTARTED, message) for request_id in ids))

    async def _client_ended(self) -> None:
        """stdin is at its end: wait a little for answers still due, then stop."""
        self.stdin_ended = True
        if self.live is None:
            await self._answer_held(_INPUT_ENDED)
            self._finish()
            return
        if self._waiting():
            with anyio.move_on_after(EOF_GRACE):
                await self.drained.wait()
        self._finish()
