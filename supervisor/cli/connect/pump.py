"""connect's byte path: the client's stdio to the current daemon connection, and back.

All of it runs in the loop's callbacks (:mod:`.loop`): each chunk is handled and written on at
once, in order, with no task switch, lock or per-read epoll re-registration. What it
remembers of the session is ``resume.SessionMemory``; when to reconnect and how to resume is
``connect``'s owner.

Back-pressure: the client not reading its stdout pauses reading the daemon and stdin (whose
requests may be answered here while the daemon is away); the daemon not reading (or a big line
still going out, in 1 MiB slices, never copied whole) pauses stdin.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from typing import Any

from supervisor.cli.connect.lines import Kind, LineBuffer, Oversize, Peek, error_line, peek
from supervisor.cli.connect.loop import Channel, Loop
from supervisor.cli.connect.resume import Downstream, SessionMemory

__all__ = (
    "IN_FLIGHT",
    "MAX_CLIENT_LINE",
    "MAX_HELD_BYTES",
    "MAX_HELD_LINES",
    "RESTARTED",
    "Link",
    "Pump",
    "note",
)

# The project's line cap everywhere (extension max_message_bytes, control replies): a client
# line is held whole until its newline, so this is also connect's worst-case memory.
MAX_CLIENT_LINE = 64 << 20
MAX_HELD_LINES = 64  # client lines held while reconnecting ...
MAX_HELD_BYTES = 4 << 20  # ... and their bytes; past either, a request is answered with an error
RESTARTED = -32000
TOO_LARGE = -32600
_SLICE = 1 << 20  # a big line goes to the daemon in slices of this, as its socket drains
_LIST_CHANGED = {
    kind: {"jsonrpc": "2.0", "method": f"notifications/{kind}/list_changed"}
    for kind in ("tools", "prompts", "resources")
}
_LISTEN_KEYS = {"tools": "toolsListChanged", "prompts": "promptsListChanged"}
_LISTEN_KEYS["resources"] = "resourcesListChanged"
_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
# The errors a client may see; a model reads them, so they say what happened and what to do.
IN_FLIGHT = "the mcp-supervisor daemon restarted during this request; it may or may not have run"
_HELD_OVER = "the mcp-supervisor daemon is restarting; the request was not sent, try again shortly"


def note(message: str) -> None:
    """One line for the user on stderr (an MCP client logs it); never on stdout."""
    print(f"mcp-supervisor: {message}", file=sys.stderr, flush=True)


class Link:
    """One connection to the daemon: its channel, its pending slices, the answers awaited."""

    def __init__(self, pump: Pump) -> None:
        self.pump = pump
        self.channel: Channel | None = None
        self.downstream = Downstream(self._keep, self._done)
        self.backlog: deque[memoryview] = deque()  # slices of a big send, written as the socket drains
        self.dropped: set[Any] = set()  # ids of connect's own replayed requests
        self.initialize_id: str | None = None
        self.initialize_answer: dict[str, Any] | None = None
        self.answered = False  # the replayed initialize was answered, or the link died
        self.spoken = False  # the daemon answered a request on this link: its session's era is set
        self.switch_id: str | None = None  # of connect's handoff on this link, while it goes on
        self.switch_answers: list[dict[str, Any]] = []
        self.closed = False

    @property
    def full(self) -> bool:
        """The socket's send buffer is over its high-water mark."""
        return self.channel is not None and self.channel.full

    def write(self, lines: list[bytes]) -> None:
        """Send *lines*, a newline after each: small ones in one write, a big one in slices."""
        assert self.channel is not None
        if not self.backlog and sum(len(line) for line in lines) <= _SLICE:
            self.channel.write(b"".join(line + b"\n" for line in lines))
            return
        for line in lines:
            view = memoryview(line)
            self.backlog.extend(view[start : start + _SLICE] for start in range(0, len(view), _SLICE))
            self.backlog.append(memoryview(b"\n"))
        self.drain()

    def drain(self) -> None:
        """Write backlog slices while the socket takes them; stdin waits until it is empty."""
        assert self.channel is not None
        while self.backlog and not self.channel.closing and self.channel.buffered < _SLICE:
            self.channel.write(self.backlog.popleft())
        self.pump.flow()

    def abort(self) -> None:
        if self.channel is not None:
            self.channel.abort()

    def data_received(self, data: bytes) -> None:
        self.pump.from_daemon(self, data)

    def connection_lost(self, exc: OSError | None) -> None:
        self.pump.daemon_lost(self)

    def pressure(self, full: bool) -> None:
        if full:
            self.pump.flow()
        else:
            self.drain()

    def _keep(self, seen: Peek) -> bool:
        if seen.kind is Kind.RESPONSE and seen.id is not None and seen.id == self.switch_id:
            self.switch_answers.append(seen.message or {})
            return False
        self.spoken = self.spoken or seen.kind is Kind.RESPONSE
        if seen.kind is not Kind.RESPONSE or seen.id not in self.dropped:
            return True
        self.dropped.discard(seen.id)
        if seen.id == self.initialize_id:
            self.initialize_answer = seen.message or {"result": None}
            self.answered = True
        return False

    def _done(self, seen: Peek) -> None:
        if seen.kind is Kind.RESPONSE:
            self.pump.memory.answered(seen.id)


class Pump:
    """The client's side of the session across connections; every method is synchronous.

    ``live`` is the link client lines go to; None while the daemon is away or being resumed,
    when lines are held (a few) instead.
    """

    def __init__(self) -> None:
        self.memory = SessionMemory()
        self.lines = LineBuffer(MAX_CLIENT_LINE)
        self.live: Link | None = None
        self.links: set[Link] = set()
        self.held: list[tuple[bytes | bytearray, Peek]] = []
        self.held_bytes = 0
        self.stdin_ended = self.gone = False
        self.ending = False  # stdin ended or stdout went away
        self.drained = False  # ... and no answer is due any more
        self.stdin: Channel | None = None
        self.stdout: Channel | None = None
        self.stdin_paused = False
        self._daemon_paused = False

    def attach(self, loop: Loop, stdin: int, stdout: int) -> None:
        """Serve the client on the fds *stdin* and *stdout* (the channels own and close them)."""
        self.attach_input(loop, stdin)
        self.stdout = Channel(
            loop, stdout, on_lost=self._stdout_lost, on_pressure=self.pause_daemon, watch_hangup=True
        )

    def attach_input(self, loop: Loop, stdin: int) -> None:
        """Read the client's input from the fd *stdin* (the channel owns and closes it)."""
        self.stdin = Channel(loop, stdin, on_data=self.from_client, on_lost=lambda _: self.client_ended())
        self.stdin_paused = False

    def detach(self, *, output: bool) -> None:
        """Stop reading the client's input (and, with *output*, stop writing its output: what is
        unwritten is dropped), closing the channels' fds; the client's own fds stay open."""
        channels = [self.stdin, self.stdout] if output else [self.stdin]
        for channel in channels:
            if channel is not None:
                channel.on_lost = None
                channel.abort()
        self.stdin = None
        if output:
            self.stdout = None

    @property
    def quiet(self) -> bool:
        """Nothing of the client's is on its way: no request unanswered (but listens), no line
        held or partly read, no output unwritten."""
        out = self.stdout
        return (
            not self.waiting()
            and not self.held
            and self.lines.empty
            and not self.ending
            and (out is None or out.buffered == 0)
        )

    def link(self, loop: Loop, fd: int, link: Link) -> None:
        """Adopt *link*, now connected over the socket *fd* (its channel owns and closes it)."""
        link.channel = Channel(
            loop,
            fd,
            on_data=link.data_received,
            on_lost=link.connection_lost,
            on_pressure=link.pressure,
            high=_SLICE,
            low=_SLICE // 4,
        )
        self.links.add(link)
        if self._daemon_paused:
            link.channel.pause_reading()

    def write(self, data: bytes) -> None:
        """Write *data* to the client's stdout, in order with everything else."""
        if data and not self.gone:
            assert self.stdout is not None
            self.stdout.write(data)

    def _stdout_lost(self, exc: OSError | None) -> None:
        if exc is not None:  # EPIPE, or the read end closed: nobody reads the answers any more
            self.client_gone()

    # --- the daemon's side ---

    def from_daemon(self, link: Link, data: bytes) -> None:
        self.write(link.downstream.feed(data))
        if self.stdin_ended and not self.waiting():
            self.drained = True

    def daemon_lost(self, link: Link) -> None:
        self.write(link.downstream.cut())
        link.backlog.clear()
        self.links.discard(link)
        link.answered = link.closed = True
        if self.ending:
            self.drained = True  # nothing more can come
        elif self.live is link:
            self.lost()  # now, so that no client line goes to the dead link meanwhile

    def lost(self) -> None:
        """The live link is gone: fail the requests in flight, hold what comes next."""
        self.live = None
        failed = self.memory.broken()
        self.write(b"".join(error_line(failed_id, RESTARTED, IN_FLIGHT) for failed_id in failed))
        self.flow()

    def changes(self, link: Link) -> bytes:
        """list_changed for what the new daemon serves (both eras), so the client re-lists."""
        lines: list[dict[str, Any]] = []
        if self.memory.remembered.initialize is not None:
            result = (link.initialize_answer or {}).get("result")
            capabilities = result.get("capabilities") if isinstance(result, dict) else None
            kinds = [k for k in _LIST_CHANGED if not isinstance(capabilities, dict) or k in capabilities]
            lines += [_LIST_CHANGED[kind] for kind in kinds]
        for request_id, line in self.memory.listens.items():  # 2026-07-28: events on the listen stream
            params = json.loads(line).get("params")
            wanted = params.get("notifications") if isinstance(params, dict) else None
            wanted = wanted if isinstance(wanted, dict) else {}
            meta = {"_meta": {_SUBSCRIPTION_ID: request_id}}
            kinds = [kind for kind, key in _LISTEN_KEYS.items() if wanted.get(key)]
            lines += [{**_LIST_CHANGED[kind], "params": meta} for kind in kinds]
        return b"".join(json.dumps(line).encode() + b"\n" for line in lines)

    # --- the client's side ---

    def from_client(self, data: bytes) -> None:
        lines = self.lines.feed(data)
        if not lines:
            return
        if self.live is None:
            self._hold(lines)
        else:
            self.send(self.live, lines)

    def client_ended(self) -> None:
        self.stdin_ended = self.ending = True

    def client_gone(self) -> None:
        self.gone = self.ending = True

    def waiting(self) -> bool:
        """Whether an answer is still due (listen streams never end by themselves)."""
        return len(self.memory.in_flight) > len(self.memory.listens)

    def send(self, link: Link, lines: list[bytes | bytearray | Oversize]) -> None:
        """Send client *lines* on *link*, noting each first: its answer may come back at once."""
        out: list[bytes] = []
        for line in lines:
            if isinstance(line, Oversize):
                self.write(self._too_large(line))
                continue
            self.memory.sent(line, peek(line))
            out.append(line)  # type: ignore[arg-type]  # bytes-like is enough
        if out and not link.closed:  # else it is failed with the rest at the break
            link.write(out)

    def send_held(self, link: Link) -> None:
        held, self.held, self.held_bytes = self.held, [], 0
        self.send(link, [line for line, _ in held])

    def answer_held(self, message: str) -> None:
        held, self.held, self.held_bytes = self.held, [], 0
        ids = [seen.id for _, seen in held if seen.kind is Kind.REQUEST and seen.id is not None]
        self.write(b"".join(error_line(request_id, RESTARTED, message) for request_id in ids))

    def _too_large(self, line: Oversize) -> bytes:
        note(f"a client message of {line.size} bytes is over the {MAX_CLIENT_LINE} byte limit; not sent")
        seen = peek(line.head, tail=line.tail)
        if seen.kind is not Kind.REQUEST or seen.id is None:
            return b""
        message = f"request too large ({line.size} bytes, over {MAX_CLIENT_LINE}); it was not sent"
        return error_line(seen.id, TOO_LARGE, message)

    def _hold(self, lines: list[bytes | bytearray | Oversize]) -> None:
        """While away: keep a few lines for the next connection; answer requests past that."""
        for line in lines:
            if isinstance(line, Oversize):
                self.write(self._too_large(line))
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
                self.write(error_line(seen.id, RESTARTED, _HELD_OVER))

    def _unhold(self, cancel: Peek) -> bool:
        params = (cancel.message or {}).get("params")
        target = params.get("requestId") if isinstance(params, dict) else None
        kept = [(line, p) for line, p in self.held if p.kind is not Kind.REQUEST or p.id != target]
        found = len(kept) < len(self.held)
        self.held, self.held_bytes = kept, sum(len(line) for line, _ in kept)
        return found

    # --- back-pressure ---

    def flow(self) -> None:
        """stdin waits while the client leaves its answers unread, or the live link's socket is full
        or a big send is still going out."""
        live = self.live
        self.pause_stdin(self._daemon_paused or (live is not None and (live.full or bool(live.backlog))))

    def pause_stdin(self, paused: bool) -> None:
        if paused == self.stdin_paused:
            return
        self.stdin_paused = paused
        if self.stdin is not None:
            (self.stdin.pause_reading if paused else self.stdin.resume_reading)()

    @property
    def daemon_paused(self) -> bool:
        """Whether the daemon's links are not read (the client is not reading its stdout)."""
        return self._daemon_paused

    def pause_daemon(self, paused: bool) -> None:
        """The client is not reading its stdout: read neither the daemon nor the client until it
        does (what the client sends meanwhile may be answered here, by an error line)."""
        self._daemon_paused = paused
        for link in self.links:
            if link.channel is not None:
                (link.channel.pause_reading if paused else link.channel.resume_reading)()
        self.flow()
