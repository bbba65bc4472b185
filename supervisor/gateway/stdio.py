"""One client in the stdio framing (one JSON-RPC message per line): on ``mcp.sock``, or handed off.

A connection is served by its own task with two pumps around the SDK server loop; plain tool
calls take the fast path (:mod:`.fast`). Every buffer is bounded: a message over
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
from supervisor.gateway.fast import parse
from supervisor.gateway.fast.parse import RequestId
from supervisor.gateway.handoff import offer
from supervisor.gateway.handoff.handed import MAX_ID, Handed
from supervisor.gateway.handoff.stream import HandedStream
from supervisor.gateway.hello import HANDOFF_METHOD, HELLO_METHOD
from supervisor.gateway.outbound import Outbound
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

    Plain tool calls take the fast path (:mod:`.fast`) once the client is past its
    handshake and has listed tools through the SDK's path (which also enrolls it for
    list_changed): from then on the gateway's runner serves them, in callbacks or in the
    connection's task group.
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
        self._scope = anyio.CancelScope()  # the connection's: cancelled when the client is gone
        self._tasks: anyio.abc.TaskGroup | None = None
        ending = lambda: self._scope.cancel_called  # noqa: E731 - the scope is replaced in serve()
        self._out = Outbound(stream, SEND_TIMEOUT, gone=self._gone, stuck=self._stuck, ending=ending)
        self._closing = False  # the connection ends: calls cancelled now were not the client's doing
        self._chosen = chosen  # the profile this connection asked for, if any
        self._first = back is None  # a hello may come first, unless the handoff chose already
        self._reader = BufferedByteReceiveStream(stream)  # replaced by _read, and by a handoff
        self._taken: Callable[[int], None] = _nothing  # bytes of the journal's ring now ours

    async def serve(self) -> None:
        server = self.gateway.server
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
        try:
            async with anyio.create_task_group() as tg:
                self._scope, self._tasks = tg.cancel_scope, tg
                self._out.tasks = tg

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
                self._closing = True
                self.gateway.calls.close(self.session)  # the children stop what it no longer waits for
            finally:
                self.session.close()  # what is this client's goes with it: questions, instances, tasks...
                if self._handed_stream is not None:  # handed over on the way: ours to close
                    try:
                        self._handed_stream.journal.close()
                    finally:
                        await self._handed_stream.aclose()

    def _gone(self) -> None:
        """The client is gone (its output): end the connection."""
        self.client_ended = True
        self._scope.cancel()

    def _stuck(self) -> None:
        """The client leaves a line untaken past SEND_TIMEOUT: end the connection."""
        log.warning("gateway.client_not_reading", timeout=SEND_TIMEOUT)
        self._scope.cancel()

    def _fast_call(self, line: bytes, tg: anyio.abc.TaskGroup) -> bool:
        """Start serving *line* on the fast path, if it is a call the fast path takes."""
        call = parse.parse(line)
        if call is None or (self.handed is not None and self.handed.refuses(call.id)):
            return False
        progress = self._out.transmit if call.progress_token is not None else None
        taken = self.gateway.calls.take(call, self.session, self._chosen, progress=progress)
        if taken is None:
            return False
        slot = self._in_flight.hold(call.id, by_id=False)

        def settle(answered: bool) -> None:  # whether the client has its answer, or gave it up
            self._in_flight.settle(call.id, slot, answered=answered)

        def deliver(answer: bytes | None) -> None:
            if answer is None:  # cancelled: by the client, or by the connection ending
                settle(not self._closing)
            else:
                self._out.transmit_soon(answer, settle)

        self.gateway.calls.start(taken, deliver, tg)
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
        self._reader = BufferedByteReceiveStream(self.stream)
        if self._pending:
            self._reader.feed_data(self._pending)
            self._pending = b""
        self._taken = self.handed.journal.consume if self.handed is not None else _nothing
        async with sink, errors:
            while (line := await self._next_line(errors)) is not None:
                if not await self._take(line, sink, errors, tg):
                    break
        tg.cancel_scope.cancel()  # the client is gone: cancel its requests, in the children too

    async def _next_line(self, errors: MemoryObjectSendStream[SessionMessage]) -> bytes | None:
        """The client's next line that is not blank; None once its input ended or overflowed."""
        while True:
            try:
                line = await self._reader.receive_until(b"\n", MAX_MESSAGE)
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
                await self._input_ended()
                return None
            except anyio.DelimiterNotFound:
                log.warning("gateway.message_too_large", limit=MAX_MESSAGE)
                too_large = error_reply(None, types.INVALID_REQUEST, f"message over {MAX_MESSAGE} bytes")
                await errors.send(SessionMessage(too_large.message, metadata=LAST))
                await self._discard_input()
                return None
            if line.strip():
                return line
            self._taken(len(line) + 1)

    async def _take(
        self,
        line: bytes,
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        errors: MemoryObjectSendStream[SessionMessage],
        tg: anyio.abc.TaskGroup,
    ) -> bool:
        """Serve one line: the fast path, our own words (a hello, a handoff), or the SDK's loop.
        False when the connection ends with it."""
        size = len(line) + 1  # the line leaves the journal's ring once it is ours
        if self._fast_ready and await self._took_fast(line, tg):
            self._taken(size)
            return True
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            self._taken(size)
            await errors.send(invalid_reply(line))
            return True
        if self._first:  # `connect --profile`: a hello before the client's first byte
            self._first = False
            if isinstance(message, types.JSONRPCRequest) and message.method == HELLO_METHOD:
                if await self._hello(message, errors):
                    return True
                await self._discard_input()
                return False
        if _is_switch(message):
            await self._switch_or_refuse(message, size, errors)
            return True
        if self.handed is not None:
            if isinstance(message, types.JSONRPCRequest) and self.handed.refuses(message.id):
                self._taken(size)
                await errors.send(error_reply(message.id, types.INVALID_REQUEST, _LONG_ID))
                return True
            self.handed.set_up(message, line)
        metadata = await self._request_metadata(message)
        self._taken(size)
        await sink.send(SessionMessage(message, metadata=metadata))
        return True

    async def _took_fast(self, line: bytes, tg: anyio.abc.TaskGroup) -> bool:
        """Whether the fast path serves *line* (a cancellation it sees goes on to the SDK too)."""
        if (cancelled := parse.cancelled_id(line)) is not None:
            self.gateway.calls.cancel(self.session, cancelled)  # and on to the SDK, for its own requests
        elif parse.MARK in line:
            await self._in_flight.take()
            if self._fast_call(line, tg):
                return True
            self._in_flight.give_back()
        return False

    async def _switch_or_refuse(
        self, message: types.JSONRPCMessage, size: int, errors: MemoryObjectSendStream[SessionMessage]
    ) -> None:
        """connect asks to hand the client's stdio over: taken when it is the last input and the
        session is not handed over already; refused otherwise (-32601 would tell connect it
        never can, as an older daemon)."""
        assert isinstance(message, types.JSONRPCRequest)
        if self.handed is None and not self._reader.buffer:
            listens = (message.params or {}).get("listens")
            if (switched := await self._switch(message.id, self._reader, listens)) is not None:
                self._reader, self._taken = switched  # the client's own pipes from now on
            return
        self._taken(size)
        await errors.send(error_reply(message.id, offer.REFUSED, _NOT_NOW))

    async def _request_metadata(self, message: types.JSONRPCMessage) -> ServerMessageMetadata | None:
        """A request's slot among the client's requests in flight (waiting for one to be free),
        and what the SDK tells when it ends unanswered; None for anything else."""
        if not isinstance(message, types.JSONRPCRequest):
            return None
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

        return ServerMessageMetadata(on_request_unanswered=unanswered, request_context=self._chosen)

    async def _switch(
        self, request_id: RequestId, reader: BufferedByteReceiveStream, listens: object
    ) -> tuple[BufferedByteReceiveStream, Callable[[int], None]] | None:
        """connect hands the client's stdio over on this live session: from now on it is served on
        those pipes, the socket its back channel; None when it is not (connect pumps on)."""
        socket_stream = self.stream
        assert isinstance(socket_stream, sockets.Stream)
        async with self._out.lock:  # none of our lines goes out meanwhile
            took = await offer.take_over(socket_stream, request_id, RING, SWITCH_WAIT)
            if took is None:
                self._scope.cancel()  # connect carries the client on from the (empty) journal
                return None
            if isinstance(took, bytes):
                reader.feed_data(took)  # the client's: connect gave up and pumps on
                return None
            stdin, stdout, journal = took
            self._handed_stream = handed = HandedStream(stdin, stdout, journal)  # owns them now
            self.stream = self._out.stream = handed
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
                if not await self._out.transmit(data):
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
