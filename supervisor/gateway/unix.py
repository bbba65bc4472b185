"""Where MCP clients reach the gateway: the unix socket ``mcp.sock`` (and, in ``http``, streamable HTTP).

Each connection to ``mcp.sock`` is one MCP session in the stdio framing (one JSON-RPC message
per line), served by its own task with two pumps around the SDK server loop. Every buffer is
bounded: a message over :data:`MAX_MESSAGE` ends the connection, a client with
:data:`MAX_IN_FLIGHT` requests unanswered is not read until one is answered, and a client that
does not take a message within :data:`SEND_TIMEOUT` is disconnected. None of it touches the
other connections.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable

import anyio
import anyio.abc
import mcp_types as types
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from supervisor import sockets
from supervisor.gateway import fastpath
from supervisor.gateway.fastpath import FastCalls, RequestId
from supervisor.gateway.handoff import offer
from supervisor.gateway.handoff.backchannel import Backchannel, Tracking
from supervisor.gateway.handoff.journal import Journal
from supervisor.gateway.handoff.stream import HandedStream
from supervisor.gateway.hello import ANSWERED, HELLO_METHOD, SET_UP, SET_UP_MAX, SET_UP_METHODS
from supervisor.gateway.server import Gateway
from supervisor.gateway.session import MAX_CONNECTIONS, MAX_IN_FLIGHT, Session, Slot, bind
from supervisor.gateway.view.profiles import Chosen, View
from supervisor.logs import Throttled

__all__ = ("MAX_CONNECTIONS", "MAX_IN_FLIGHT", "MAX_MESSAGE", "SEND_TIMEOUT", "serve_unix")

log = structlog.get_logger(__name__)

MAX_MESSAGE = 64 << 20  # bytes in one client message (tool arguments may carry images)
LAST_WORD_GRACE = 5.0  # seconds we keep reading (and dropping) after our last word to a client
SEND_TIMEOUT = 30.0  # seconds a client may leave a message untaken before it is disconnected
EOF_GRACE = 2.0  # after a handed-off client's input ends: how long the answers still due may take
_FIRST_READ = 1 << 16  # the first read of a connection, which may carry a handoff's fds
_RING = 2 * (MAX_MESSAGE + _FIRST_READ)  # a handed-off client's journal: room for a whole line, moved
_LISTEN = "subscriptions/listen"


async def serve_unix(
    gateway: Gateway,
    path: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway on the unix socket *path* until cancelled, to *max_connections* clients at once.

    Raises:
        SupervisorError: another daemon is listening on *path*, or it cannot be bound.

    Resource handling: the socket file is removed on exit unless another process replaced it.
    """
    listener = await sockets.listen(path)
    identity = sockets.identity(path)
    active = 0
    refused = Throttled(log, "gateway.too_many_connections")
    log.info("gateway.listening", path=path, max_connections=max_connections)

    async def serve_one(stream: sockets.Stream) -> None:
        nonlocal active
        try:
            async with stream:
                pid, uid = sockets.peer_credentials(stream)
                if not sockets.trusted_uid(uid):
                    log.warning("gateway.peer_refused", uid=uid, pid=pid)
                    return
                first, fds = await stream.receive_with_fds(_FIRST_READ, offer.MAX_FDS)
                handoff = offer.parse(first, fds)
                if handoff is not None:
                    await _serve_handed(gateway, stream, handoff)
                elif first:
                    await _Connection(gateway, stream, first).serve()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            log.debug("gateway.client_gone")
        except Exception:  # a bug of ours: end this client, never the daemon
            log.exception("gateway.connection_crashed")
        finally:
            active -= 1

    try:
        async with listener, anyio.create_task_group() as connections:
            task_status.started()
            while True:
                stream = await sockets.next_client(listener, event="gateway.accept_failed")
                if active >= max_connections:
                    refused("cap", limit=max_connections)
                    await _refuse(stream, f"too many connections (at most {max_connections})")
                    continue
                active += 1
                connections.start_soon(serve_one, stream)
    finally:
        sockets.unlink_if_ours(path, identity)
        log.info("gateway.closed", path=path)


async def _serve_handed(gateway: Gateway, stream: sockets.Stream, handoff: offer.Offer) -> None:
    """Serve a client whose stdio ``connect`` handed over, on those fds, the socket a back channel.
    A refused handoff (connect then pumps the bytes itself) is answered with an error."""
    sock = stream._raw_socket
    with contextlib.closing(handoff):  # its fds, unless taken
        refusal, chosen = handoff.problem, None
        if refusal is None and handoff.profile is not None:
            view = _choose(gateway, handoff.profile)
            if isinstance(view, str):
                refusal = view
            else:
                chosen = Chosen(view.name or "")
        if refusal is None:
            try:
                journal = Journal(_RING)
            except OSError as exc:  # out of memory or fds
                refusal = f"cannot take the session over: {exc.strerror or exc}"
        if refusal is not None:
            log.info("gateway.handoff_refused", reason=refusal)
            offer.refuse(sock, handoff.id, types.INVALID_PARAMS, refusal)
            return
        with contextlib.closing(journal):
            handed = HandedStream(*handoff.take(), journal)
            try:
                assert journal.fd is not None
                if not offer.answer(sock, handoff, journal.fd):
                    return
                journal.close_fd()
                connection = _Connection(gateway, handed, chosen=chosen, back=stream)
                await connection.serve()
                if connection.client_ended and connection.back is not None:
                    await connection.back.bye()
            finally:
                await handed.aclose()


def _choose(gateway: Gateway, name: object) -> View | str:
    """The view of profile *name*, or what to tell a client that asked for one there is not."""
    view = gateway.views.get(name) if isinstance(name, str) else None
    if view is None:
        known = ", ".join(gateway.views.names()) or "none"
        log.info("gateway.unknown_profile", profile=str(name)[:100])
        return f"unknown profile {name!r} (configured: {known})"
    return view


async def _refuse(stream: anyio.abc.SocketStream, message: str) -> None:
    error = _error(None, types.INTERNAL_ERROR, message).message.model_dump_json(by_alias=True)
    with (
        anyio.move_on_after(1),
        contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError),
    ):
        await stream.send(error.encode() + b"\n")
    await stream.aclose()


class _Connection:
    """One client on mcp.sock: a reader, a writer and the SDK's server loop, in one task group.

    Plain tool calls take the fast path (:mod:`.fastpath`) once the client is past its
    handshake and has listed tools through the SDK's path (which also enrolls it for
    list_changed): from then on they are answered from the reader's task group directly.
    """

    def __init__(
        self,
        gateway: Gateway,
        stream: sockets.Stream | HandedStream,
        pending: bytes = b"",
        *,
        chosen: Chosen | None = None,
        back: sockets.Stream | None = None,
    ) -> None:
        self.gateway, self.stream = gateway, stream
        self.session = Session("unix")  # this client's: closed when the connection ends
        self._in_flight = self.session.in_flight
        self._pending = pending  # read before the connection was made
        # Handed off (*stream* the client's own stdio, *back* the socket to connect): what
        # connect needs to carry on if we die goes into the journal and over *back*.
        self.back: Backchannel | None = None
        self._journal: Journal | None = None
        self._set_up: dict[RequestId, str] = {}  # requests whose answer connect must hear of: method
        self.client_ended = False  # its input ended, or its output went: connect may exit
        if back is not None:
            assert isinstance(stream, HandedStream)
            self._journal = stream.journal
            self.back = Backchannel(back, lambda: self._scope.cancel(), SEND_TIMEOUT)
            self._in_flight.tracker = Tracking(stream.journal, self.back)
        self._handshake = False  # the client opened with initialize (the handshake era)
        self._listings: set[RequestId] = set()  # its tools/list requests not yet answered
        self._fast_ready = False
        self._fast = FastCalls(
            gateway.router, gateway.spool_prefix, self._transmit, self.session, self._transmit_soon
        )
        # Whoever is mid-line holds it: the writer task, a fast call's task, or (from a callback,
        # which no task owns, hence a semaphore and not a lock) the task finishing its line.
        self._sending = anyio.Semaphore(1, fast_acquire=True)
        self._scope = anyio.CancelScope()  # the connection's: cancelled when the client is gone
        self._tasks: anyio.abc.TaskGroup | None = None
        self._chosen = chosen  # the profile this connection asked for, if any
        self._first = back is None  # a hello may come first, unless the handoff chose already

    async def serve(self) -> None:
        server = self.gateway.server
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
        try:
            async with anyio.create_task_group() as tg:
                self._scope, self._tasks = tg.cancel_scope, tg

                async def run_server() -> None:
                    bind(self.session)  # the SDK's tasks for this connection serve this client
                    await server.run(read_recv, write_send, server.create_initialization_options())
                    tg.cancel_scope.cancel()

                tg.start_soon(self._read, read_send, write_send.clone(), tg)
                tg.start_soon(self._write, write_recv)
                tg.start_soon(run_server)
                if self.back is not None:
                    tg.start_soon(self.back.run)
        finally:
            try:
                self._fast.close()  # its children are told to stop what it no longer waits for
            finally:
                self.session.close()  # what is this client's goes with it: questions, instances, tasks...

    async def _transmit(self, data: bytes) -> bool:
        """Send *data* whole; False, with the connection ended, if the client is gone or not reading."""
        sent = 0
        try:
            if self._sending.value:  # nobody is mid-line: usually all of it goes at once, no lock
                sent = self.stream.send_now(data)
                if sent == len(data):
                    return True
                if sent:  # the rest before any other line: the lock is free and nothing ran since
                    self._sending.acquire_nowait()
                    try:
                        return await self._send_rest(data, sent)
                    finally:
                        self._sending.release()
            async with self._sending:
                return await self._send_rest(data, sent)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._gone()
            return False

    def _gone(self) -> None:
        """The client is gone (its output): end the connection."""
        self.client_ended = True
        self._scope.cancel()

    def _transmit_soon(self, data: bytes, sent_out: Callable[[], None]) -> None:
        """:meth:`_transmit` from a callback: at once when the socket takes the line, else in a
        task; then *sent_out* (also when the connection ends first). Until then the request's
        slot stays held, so a client that reads slowly stops being read, as on the awaited path."""
        if self._scope.cancel_called or self._tasks is None:
            sent_out()  # the connection is ending
            return
        if self._sending.value:
            try:
                sent = self.stream.send_now(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._gone()
                sent_out()
                return
            if sent == len(data):
                sent_out()
                return
            if sent:  # the rest before any other line
                self._sending.acquire_nowait()
                self._tasks.start_soon(self._finish_line, data, sent, sent_out)
                return
        self._tasks.start_soon(self._transmit_then, data, sent_out)

    async def _transmit_then(self, data: bytes, sent_out: Callable[[], None]) -> None:
        try:
            await self._transmit(data)
        finally:
            sent_out()

    async def _finish_line(self, data: bytes, sent: int, sent_out: Callable[[], None]) -> None:
        try:
            await self._send_rest(data, sent)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._gone()
        finally:
            self._sending.release()
            sent_out()

    async def _send_rest(self, data: bytes, sent: int) -> bool:
        """What :meth:`_transmit` could not send at once, the lock held."""
        # Whole or not at all: a cancelled caller must not leave half a line on the socket.
        with anyio.CancelScope(shield=True), anyio.move_on_after(SEND_TIMEOUT) as timer:
            await self.stream.send(memoryview(data)[sent:])
        if timer.cancelled_caught:
            log.warning("gateway.client_not_reading", timeout=SEND_TIMEOUT)
            self._scope.cancel()
            return False
        return True

    def _fast_call(self, line: bytes, tg: anyio.abc.TaskGroup) -> bool:
        """Start serving *line* on the fast path, if it is a call the fast path takes."""
        call = fastpath.parse(line)
        route = self._fast.route(call, self._chosen) if call is not None else None
        if call is None or route is None:
            return False
        slot = self._in_flight.hold(call.id)
        self._fast.start(tg, call, *route, functools.partial(self._in_flight.settle, call.id, slot))
        return True

    def _watching_listings(self) -> bool:
        """Whether a tools/list answer would open the fast path (a cancelled one never comes)."""
        return self._handshake and not self._fast_ready and len(self._listings) < MAX_IN_FLIGHT

    async def _read(
        self,
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        errors: MemoryObjectSendStream[SessionMessage],
        tg: anyio.abc.TaskGroup,
    ) -> None:
        """Client lines to the server loop; its end (EOF, an oversized message) ends the connection."""
        reader = BufferedByteReceiveStream(self.stream)
        if self._pending:
            reader.feed_data(self._pending)
            self._pending = b""
        taken = self._journal.consume if self._journal is not None else _nothing
        async with sink, errors:
            while True:
                try:
                    line = await reader.receive_until(b"\n", MAX_MESSAGE)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
                    await self._input_ended()
                    break
                except anyio.DelimiterNotFound:
                    log.warning("gateway.message_too_large", limit=MAX_MESSAGE)
                    too_large = _error(None, types.INVALID_REQUEST, f"message over {MAX_MESSAGE} bytes")
                    await errors.send(SessionMessage(too_large.message, metadata=_LAST))
                    await self._discard_input()
                    break
                size = len(line) + 1  # the line leaves the journal's ring once it is ours
                if not line.strip():
                    taken(size)
                    continue
                if self._fast_ready:
                    if (cancelled := fastpath.cancelled_id(line)) is not None:
                        self._fast.cancel(cancelled)  # and on to the SDK, for its own requests
                    elif fastpath.MARK in line:
                        await self._in_flight.take()
                        if self._fast_call(line, tg):
                            taken(size)
                            continue
                        self._in_flight.give_back()
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError:
                    taken(size)
                    await errors.send(_invalid(line))
                    continue
                if self._first:  # `connect --profile`: a hello before the client's first byte
                    self._first = False
                    if isinstance(message, types.JSONRPCRequest) and message.method == HELLO_METHOD:
                        if await self._hello(message, errors):
                            continue
                        await self._discard_input()
                        break
                if self.back is not None:
                    self._tell_set_up(message, line)
                metadata = None
                if isinstance(message, types.JSONRPCRequest):
                    if message.method == "initialize":
                        self._handshake = True
                    elif message.method == "tools/list" and self._watching_listings():
                        self._listings.add(message.id)
                    await self._in_flight.take()
                    slot = self._in_flight.hold(message.id)

                    async def unanswered(request_id: RequestId = message.id, slot: Slot = slot) -> None:
                        self._in_flight.settle(request_id, slot)  # cancelled by the client: no answer comes

                    metadata = ServerMessageMetadata(
                        on_request_unanswered=unanswered, request_context=self._chosen
                    )
                taken(size)
                await sink.send(SessionMessage(message, metadata=metadata))
        tg.cancel_scope.cancel()  # the client is gone: cancel its requests, in the children too

    async def _input_ended(self) -> None:
        """The client's input ended. Handed off, the answers still due go out first (within a
        grace), as connect lets them out when it pumps."""
        if self.back is None:
            return
        self.client_ended = True
        listens = {request_id for request_id, method in self._set_up.items() if method == _LISTEN}
        with anyio.move_on_after(EOF_GRACE):
            await self._in_flight.answered(besides=listens)

    def _tell_set_up(self, message: types.JSONRPCMessage, line: bytes) -> None:
        """Tell connect of a client line that sets the session up, before it is served."""
        assert self.back is not None
        method = getattr(message, "method", None)
        if method not in SET_UP_METHODS or len(line) > SET_UP_MAX:
            return
        if method == "notifications/cancelled":
            params = getattr(message, "params", None) or {}
            if params.get("requestId") not in self._set_up:
                return  # connect only cares for the requests it replays
        self.back.post(SET_UP, line)
        if isinstance(message, types.JSONRPCRequest):
            self._set_up[message.id] = method

    async def _hello(
        self, message: types.JSONRPCRequest, replies: MemoryObjectSendStream[SessionMessage]
    ) -> bool:
        """Choose this connection's profile; False (and a last error) if there is no such profile."""
        name = (message.params or {}).get("name")
        view = _choose(self.gateway, name)
        if isinstance(view, str):
            error = _error(message.id, types.INVALID_PARAMS, view)
            await replies.send(SessionMessage(error.message, metadata=_LAST))
            return False
        self._chosen = Chosen(view.name or "")
        result = types.JSONRPCResponse(
            jsonrpc="2.0", id=message.id, result={"profile": name, "mode": view.mode}
        )
        await replies.send(SessionMessage(result, metadata=_OURS))
        return True

    async def _discard_input(self) -> None:
        """Read and drop what the client still sends, for a while, so that closing the socket with
        unread input does not reset the connection before the client has read our last word.
        Handed off, the input is left for connect, which carries on from the journal."""
        if self.back is not None:
            return
        with anyio.move_on_after(LAST_WORD_GRACE):
            try:
                while await self.stream.receive(1 << 16):
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    async def _write(self, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
        async with source:
            async for item in source:
                message = item.message
                data = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                if not await self._transmit(data):
                    return
                if item.metadata is _LAST:  # the connection's last word: the client sees it, then EOF
                    await self.stream.send_eof()
                    continue
                answered = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
                if answered and item.metadata is not _OURS and message.id is not None:
                    self._in_flight.settle(message.id)
                    if self.back is not None and self._set_up.pop(message.id, None) is not None:
                        self.back.post(ANSWERED, json.dumps(message.id).encode())
                    if message.id in self._listings:  # the client listed tools: fast calls from now
                        self._listings.discard(message.id)
                        self._fast_ready |= isinstance(message, types.JSONRPCResponse)


_LAST = ServerMessageMetadata()  # an error after which the connection ends
_OURS = ServerMessageMetadata()  # marks the errors this module writes: they answer no request of the SDK's


def _error(request_id: str | int | None, code: int, message: str) -> SessionMessage:
    error = types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message)
    )
    return SessionMessage(error, metadata=_OURS)


def _nothing(_: int) -> None:
    pass


def _invalid(line: bytes) -> SessionMessage:
    """-32700 for a line that is not JSON, -32600 (with its id, if any) for one that is not JSON-RPC."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return _error(None, types.PARSE_ERROR, "Parse error: the line is not JSON")
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    return _error(request_id, types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message")
