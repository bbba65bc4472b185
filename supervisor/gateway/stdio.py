"""One client in the stdio framing (one JSON-RPC message per line): on ``mcp.sock``, or handed off.

A connection is served by its own task with two pumps around the SDK server loop; plain tool
calls take the fast path (:mod:`.fastpath`). Every buffer is bounded: a message over
:data:`MAX_MESSAGE` ends the connection, a client with :data:`MAX_IN_FLIGHT` requests
unanswered is not read until one is answered, and a client that does not take a message
within :data:`SEND_TIMEOUT` is disconnected. None of it touches the other connections.

Handed off (``connect`` passed the client's stdin and stdout, :mod:`.handoff`), the stream is
the client's own pipes, and what connect needs to carry the client on if the daemon dies goes
into the journal (bytes read, requests in flight) and over the socket, the back channel (the
lines that set the session up, and the bye once the client ended).
"""

from __future__ import annotations

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
from supervisor.gateway.handoff.handed import MAX_ID, Handed
from supervisor.gateway.handoff.stream import HandedStream
from supervisor.gateway.hello import HANDOFF_METHOD, HELLO_METHOD
from supervisor.gateway.replies import LAST, OURS, error_reply, invalid_reply
from supervisor.gateway.server import Gateway
from supervisor.gateway.session import MAX_IN_FLIGHT, Session, Slot, bind
from supervisor.gateway.view.profiles import Chosen

__all__ = (
    "MAX_IN_FLIGHT",
    "MAX_MESSAGE",
    "RING",
    "SEND_TIMEOUT",
    "SWITCH_WAIT",
    "StdioConnection",
)

log = structlog.get_logger(__name__)

MAX_MESSAGE = 64 << 20  # bytes in one client message (tool arguments may carry images)
LAST_WORD_GRACE = 5.0  # seconds we keep reading (and dropping) after our last word to a client
SEND_TIMEOUT = 30.0  # seconds a client may leave a message untaken before it is disconnected
RING = 2 * (MAX_MESSAGE + (1 << 16))  # a handed-off client's journal: room for a whole line, moved
SWITCH_WAIT = 10.0  # seconds for each step of connect's handoff on a live session
_LONG_ID = f"a request id over {MAX_ID} characters is not taken by this session"
_NOT_NOW = "cannot take the session over now: the request is not the last input, or it is handed over already"


class StdioConnection:
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
        self.handed: Handed | None = None
        self._handed_stream: HandedStream | None = None  # handed over on a live session: closed here
        self.client_ended = False  # its input ended, or its output went: connect may exit
        if back is not None:
            assert isinstance(stream, HandedStream)
            end = lambda: self._scope.cancel()  # noqa: E731 - the scope is replaced in serve()
            self.handed = Handed(stream, back, self._in_flight, end, SEND_TIMEOUT)
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
                if self.handed is not None:
                    tg.start_soon(self.handed.back.run)
        finally:
            try:
                self._fast.close()  # its children are told to stop what it no longer waits for
            finally:
                self.session.close()  # what is this client's goes with it: questions, instances, tasks...
                if self._handed_stream is not None:  # handed over on the way: ours to close
                    try:
                        self._handed_stream.journal.close()
                    finally:
                        await self._handed_stream.aclose()

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

    def _transmit_soon(self, data: bytes, sent_out: Callable[[bool], None]) -> None:
        """:meth:`_transmit` from a callback: at once when the socket takes the line, else in a
        task; then *sent_out*, told whether the line went out whole (not when the connection
        ends first). Until then the request's slot stays held, so a client that reads slowly
        stops being read, as on the awaited path."""
        if self._scope.cancel_called or self._tasks is None:
            sent_out(False)  # the connection is ending
            return
        if self._sending.value:
            try:
                sent = self.stream.send_now(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._gone()
                sent_out(False)
                return
            if sent == len(data):
                sent_out(True)
                return
            if sent:  # the rest before any other line
                self._sending.acquire_nowait()
                self._tasks.start_soon(self._finish_line, data, sent, sent_out)
                return
        self._tasks.start_soon(self._transmit_then, data, sent_out)

    async def _transmit_then(self, data: bytes, sent_out: Callable[[bool], None]) -> None:
        went = False
        try:
            went = await self._transmit(data)
        finally:
            sent_out(went)

    async def _finish_line(self, data: bytes, sent: int, sent_out: Callable[[bool], None]) -> None:
        went = False
        try:
            went = await self._send_rest(data, sent)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._gone()
        finally:
            self._sending.release()
            sent_out(went)

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
        if call is None or route is None or (self.handed is not None and self.handed.refuses(call.id)):
            return False
        slot = self._in_flight.hold(call.id, by_id=False)

        def done(answered: bool) -> None:
            self._in_flight.settle(call.id, slot, answered=answered)

        self._fast.start(tg, call, *route, done)
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
        taken = self.handed.journal.consume if self.handed is not None else _nothing
        async with sink, errors:
            while True:
                try:
                    line = await reader.receive_until(b"\n", MAX_MESSAGE)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
                    await self._input_ended()
                    break
                except anyio.DelimiterNotFound:
                    log.warning("gateway.message_too_large", limit=MAX_MESSAGE)
                    too_large = error_reply(None, types.INVALID_REQUEST, f"message over {MAX_MESSAGE} bytes")
                    await errors.send(SessionMessage(too_large.message, metadata=LAST))
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
                    await errors.send(invalid_reply(line))
                    continue
                if self._first:  # `connect --profile`: a hello before the client's first byte
                    self._first = False
                    if isinstance(message, types.JSONRPCRequest) and message.method == HELLO_METHOD:
                        if await self._hello(message, errors):
                            continue
                        await self._discard_input()
                        break
                if _is_switch(message):
                    if self.handed is None and not reader.buffer:
                        listens = (message.params or {}).get("listens")
                        if (switched := await self._switch(message.id, reader, listens)) is not None:
                            reader, taken = switched  # the client's own pipes from now on
                    else:  # not now; -32601 would tell connect it never can (an older daemon)
                        taken(size)
                        await errors.send(error_reply(message.id, offer.REFUSED, _NOT_NOW))
                    continue
                if self.handed is not None:
                    if isinstance(message, types.JSONRPCRequest) and self.handed.refuses(message.id):
                        taken(size)
                        await errors.send(error_reply(message.id, types.INVALID_REQUEST, _LONG_ID))
                        continue
                    self.handed.set_up(message, line)
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
                        if self.handed is not None:
                            self.handed.cancelled(request_id)

                    metadata = ServerMessageMetadata(
                        on_request_unanswered=unanswered, request_context=self._chosen
                    )
                taken(size)
                await sink.send(SessionMessage(message, metadata=metadata))
        tg.cancel_scope.cancel()  # the client is gone: cancel its requests, in the children too

    async def _switch(
        self, request_id: RequestId, reader: BufferedByteReceiveStream, listens: object
    ) -> tuple[BufferedByteReceiveStream, Callable[[int], None]] | None:
        """connect hands the client's stdio over on this live session: from now on it is served on
        those pipes, the socket its back channel; None when it is not (connect pumps on)."""
        socket_stream = self.stream
        assert isinstance(socket_stream, sockets.Stream)
        async with self._sending:  # none of our lines goes out meanwhile
            took = await offer.take_over(socket_stream, request_id, RING, SWITCH_WAIT)
            if took is None:
                self._scope.cancel()  # connect carries the client on from the (empty) journal
                return None
            if isinstance(took, bytes):
                reader.feed_data(took)  # the client's: connect gave up and pumps on
                return None
            stdin, stdout, journal = took
            self._handed_stream = handed = HandedStream(stdin, stdout, journal)  # owns them now
            self.stream = handed
            self.handed = Handed(handed, socket_stream, self._in_flight, self._scope.cancel, SEND_TIMEOUT)
            self.handed.listening(listens, self._in_flight)
            assert self._tasks is not None
            self._tasks.start_soon(self.handed.back.run)
        log.info("gateway.handed_over")
        return BufferedByteReceiveStream(handed), journal.consume

    async def _input_ended(self) -> None:
        """The client's input ended. Handed off, the answers still due go out first."""
        if self.handed is not None:
            self.client_ended = True
            await self.handed.input_ended()

    async def _hello(
        self, message: types.JSONRPCRequest, replies: MemoryObjectSendStream[SessionMessage]
    ) -> bool:
        """Choose this connection's profile; False (and a last error) if there is no such profile."""
        name = (message.params or {}).get("name")
        view = self.gateway.views.choose(name)
        if isinstance(view, str):
            error = error_reply(message.id, types.INVALID_PARAMS, view)
            await replies.send(SessionMessage(error.message, metadata=LAST))
            return False
        self._chosen = Chosen(view.name or "")
        result = types.JSONRPCResponse(
            jsonrpc="2.0", id=message.id, result={"profile": name, "mode": view.mode}
        )
        await replies.send(SessionMessage(result, metadata=OURS))
        return True

    async def _discard_input(self) -> None:
        """Read and drop what the client still sends, for a while, so that closing the socket with
        unread input does not reset the connection before the client has read our last word.
        Handed off, the input is left for connect, which carries on from the journal."""
        if self.handed is not None:
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
                answered = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
                if answered and self.handed is not None and item.metadata is not OURS:
                    self.handed.answered(message.id)
                if not await self._transmit(data):
                    return
                if item.metadata is LAST:  # the connection's last word: the client sees it, then EOF
                    await self.stream.send_eof()
                    continue
                if answered and item.metadata is not OURS and message.id is not None:
                    self._in_flight.settle(message.id)
                    if message.id in self._listings:  # the client listed tools: fast calls from now
                        self._listings.discard(message.id)
                        self._fast_ready |= isinstance(message, types.JSONRPCResponse)


def _is_switch(message: types.JSONRPCMessage) -> bool:
    return isinstance(message, types.JSONRPCRequest) and message.method == HANDOFF_METHOD


def _nothing(_: int) -> None:
    pass
