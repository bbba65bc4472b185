"""A remote run's transport and session, held by one task: :func:`connect`.

:func:`connect` yields a :class:`RemoteConnection` with its transport open (no MCP traffic yet:
call ``handshake``). One task, the holder, enters and exits the transport and the session (anyio
scopes are exited by the task that entered them); the run's other tasks only send requests.
``type: auto`` speaks streamable HTTP and, when the server refuses its ``initialize`` the way a
server of the older transport does (404, 405, 400), opens HTTP+SSE instead, within the handshake.

The run ends (:attr:`RemoteConnection.ended`) when the transport fails (a refused connection, a
broken event stream, an answer over the byte limit), when the server says the session is gone
(404 on a request of an established session: the next run initializes again), or by a guard;
every request in flight then fails with ``CONNECTION_CLOSED``, as a child's do when it exits.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp.shared.message import SessionMessage

from supervisor.errors import first_line
from supervisor.remote import http
from supervisor.remote.deadlines import AnswerTimes
from supervisor.remote.rawcalls import RemoteCalls
from supervisor.remote.traffic import Sending, Watch, cut_off, failure, tool_result
from supervisor.remote.upstream import RemoteConnection
from supervisor.upstream.session import (
    LIST_CHANGED,
    Asked,
    ListChanged,
    Notified,
    asking_callbacks,
)
from supervisor.upstream.spool import ExtensionSpool
from supervisor.upstream.wire import InboundRequests

__all__ = ("AuthFor", "connect")

log = structlog.get_logger(__name__)

AuthFor = Callable[[Callable[[str], None]], httpx2.Auth | None]  # a run's signer, given its login_required
MAX_INBOUND_REQUESTS = 32  # the server's requests being answered at once; more are dropped
MAX_LOG_LINE = 4096  # characters of one log message kept for `logs`
OPEN_LIMIT = 30.0  # seconds for a transport to open (HTTP+SSE: its GET answered with the endpoint)


@asynccontextmanager
async def connect(
    url: str,
    *,
    kind: str,
    headers: Mapping[str, str],
    max_message_bytes: int,
    stop_timeout: float,
    on_list_changed: ListChanged,
    on_notification: Notified,
    on_asked: Asked | None = None,
    spool: ExtensionSpool | None = None,
    on_log: Callable[[str], None] | None = None,
    auth: AuthFor | None = None,
    answer_times: AnswerTimes | None = None,
) -> AsyncIterator[RemoteConnection]:
    """Open a run's transport to *url* (*kind*: ``auto``, ``http`` or ``sse``) and yield its
    :class:`RemoteConnection`.

    Resource handling: the task that enters this context must exit it. Exiting ends the session
    (streamable HTTP: a DELETE, within *stop_timeout*), shielded from cancellation. A transport
    that cannot open (a refused connection, an SSE stream the server refuses) ends the
    connection at once with the reason: the handshake then fails with it.

    Oversized media in the server's tool results goes to *spool* before the session sees them,
    kept on disk from the first bytes of its answer (:mod:`supervisor.upstream.diverted`).

    Bounds: every answer and event within *max_message_bytes*, and the answer to each request
    in the time *answer_times* gives it (:mod:`supervisor.remote.deadlines`);
    *on_list_changed* and *on_notification* must return at once. With *on_asked*, the server is
    told at ``initialize`` that its client offers sampling, elicitation and roots. *on_log*
    gets each log message it sends as one line (``logs NAME`` shows them, as a child's stderr).
    *auth*, given the run's :meth:`RemoteConnection.login_required`, makes what signs its
    requests (an OAuth login: :func:`supervisor.remote.auth.run_auth`).
    """
    connection = RemoteConnection(url, "sse" if kind == "sse" else "http")
    signer = auth(connection.login_required) if auth is not None else None
    holder = _Holder(
        connection,
        kind,
        headers,
        max_message_bytes,
        on_list_changed,
        on_notification,
        on_asked,
        spool,
        stop_timeout,
        on_log,
        signer,
        answer_times,
    )
    async with anyio.create_task_group() as tasks:
        await tasks.start(holder.hold)
        try:
            yield connection
        finally:
            holder.closing.set()
            if holder.opening is not None:  # a transport still opening: abandoned
                holder.opening.cancel()
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(stop_timeout):
                    await holder.done.wait()
                tasks.cancel_scope.cancel()


class _Holder:
    """The task that owns the transport and the session (see the module)."""

    def __init__(
        self,
        connection: RemoteConnection,
        kind: str,
        headers: Mapping[str, str],
        max_message_bytes: int,
        on_list_changed: ListChanged,
        on_notification: Notified,
        on_asked: Asked | None,
        spool: ExtensionSpool | None,
        stop_timeout: float,
        on_log: Callable[[str], None] | None,
        auth: httpx2.Auth | None,
        answer_times: AnswerTimes | None = None,
    ) -> None:
        self.answer_times = answer_times
        self.on_log = on_log
        self.auth = auth
        self.connection = connection
        self.spool = spool
        self.media = spool.diversions() if spool is not None else None  # its long strings, on disk
        self.kinds = ["http", "sse"] if kind == "auto" else [kind]
        self.headers = headers
        self.max_message_bytes = max_message_bytes
        self.on_list_changed = on_list_changed
        self.on_notification = on_notification
        self.asking = asking_callbacks(connection, on_asked) if on_asked is not None else {}
        self.watch = Watch(connection.end)
        self.inbound = InboundRequests(MAX_INBOUND_REQUESTS)
        self.stop_timeout = stop_timeout
        self.opening: anyio.CancelScope | None = None  # the transport's, while it opens
        self.closing = anyio.Event()  # the run is over: leave the session and the transport
        self.switch = anyio.Event()  # the handshake asks for the next transport
        self.opened = anyio.Event()  # a session is open (again)
        self.done = anyio.Event()

    async def _fall_back(self) -> None:
        """Close this transport and open the next; returns once it is open, or the run ended."""
        self.opened = anyio.Event()
        self.switch.set()
        await _first(self.opened, self.connection.ended)

    async def hold(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        connection, started = self.connection, False
        try:
            for position, kind in enumerate(self.kinds):
                self.switch = anyio.Event()
                last = position == len(self.kinds) - 1
                try:
                    async with self._session(kind) as session:
                        connection.session, connection.transport = session, kind
                        connection._fallback = None if last else self._fall_back
                        if not started:
                            started = True
                            task_status.started()
                        self.opened.set()
                        await _first(self.closing, self.switch)
                except Exception as exc:  # the transport did not open: that ends the run
                    connection.end(self.watch.last_failure or failure(exc))
                if self.closing.is_set() or connection.ended.is_set() or not self.switch.is_set():
                    return
        finally:
            connection.end(connection.failure)  # however it left: requests in flight fail now
            if self.media is not None:
                self.media.close()
            self.done.set()
            if not started:
                task_status.started()

    @asynccontextmanager
    async def _session(self, kind: str) -> AsyncIterator[ClientSession]:
        """A session over the transport of *kind*. The transport runs in a task of its own, so
        that its failure ends the run (requests in flight failing as cut by it) before anything
        reaches the session: the session's tasks are not inside the transport's scopes."""
        ours_send, ours_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.connection._closers = [ours_send.close]
        leaving = anyio.Event()
        async with anyio.create_task_group() as carrier:
            write = await carrier.start(self._carry, kind, ours_send, leaving)
            try:
                async with ClientSession(
                    ours_recv,
                    Sending(write, self.spool, self.inbound),
                    message_handler=self._on_message,
                    logging_callback=self._on_log,
                    **self.asking,
                ) as session:
                    yield session
            finally:
                leaving.set()  # the transport ends its session (streamable HTTP: a DELETE)

    async def _carry(
        self,
        kind: str,
        ours: MemoryObjectSendStream[SessionMessage | Exception],
        leaving: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the transport, hand its write stream on, and forward what it reads to the
        session's stream until *leaving*; a failure of it ends the run, with the reason.

        Shielded: a stop cancels the run's tasks, and the transport's end (streamable HTTP's
        DELETE of the session) must still go out; it gets ``stop_timeout``. Opening gets
        :data:`OPEN_LIMIT`, and is abandoned at once if the run closes meanwhile."""
        self.opening = kept = anyio.CancelScope(shield=True, deadline=anyio.current_time() + OPEN_LIMIT)
        started = False
        try:
            with kept:
                async with self._transport(kind) as (read, write, posting):
                    started, kept.deadline, self.opening = True, math.inf, None
                    task_status.started(write)
                    async with anyio.create_task_group() as forwarding:  # raw calls' POSTs too
                        forwarding.start_soon(self._forward, read, ours)
                        if posting is not None:
                            self.connection._raw_calls = lambda: self._raw_calls(posting, forwarding, ours)
                        await leaving.wait()
                        self.connection._raw_calls = None
                        forwarding.cancel_scope.cancel()
                    kept.deadline = anyio.current_time() + self.stop_timeout  # for the DELETE
            if not started:
                raise TimeoutError(f"the transport did not open within {OPEN_LIMIT:g}s")
        except Exception as exc:  # the transport failed: that ends the run, first
            if not (self.closing.is_set() or self.switch.is_set()):
                self.connection.end(self.watch.last_failure or failure(exc))
            if not started:
                raise

    def _transport(self, kind: str) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        return http.transport(
            kind,
            self.connection.url,
            self.headers,
            watch=self.watch,
            auth=self.auth,
            max_message_bytes=self.max_message_bytes,
            answer_times=self.answer_times,
            diversions=self.media,
        )

    async def _forward(
        self,
        read: MemoryObjectReceiveStream[SessionMessage | Exception],
        ours: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """The transport's messages to the session: list_changed taken here, late answers
        watched, a lost session or a broken stream ending the run."""
        connection, last_error = self.connection, None
        try:
            async for message in read:
                if isinstance(message, Exception):
                    last_error = first_line(message, typed=False)
                    log.warning("extension.bad_message", error=last_error)
                    continue
                await self._pass(message, ours)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        if not (self.closing.is_set() or self.switch.is_set()):  # it ended under us (SSE: the server left)
            connection.end(last_error or self.watch.last_failure or "the server closed the connection")

    async def _pass(
        self, message: SessionMessage, ours: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        """One message of the server's on to the session: list_changed taken here, late answers
        watched, media spooled. Error handling: anyio's, when the session's stream is closed."""
        if not self.inbound.admit(message):  # more of its requests than we answer at once
            return
        inner, connection = message.message, self.connection
        connection.watched.see(message)
        if isinstance(inner, types.JSONRPCNotification) and (kind := LIST_CHANGED.get(inner.method)):
            self.on_list_changed(kind)
            return
        if self.media is not None and isinstance(inner, types.JSONRPCResponse) and tool_result(inner):
            answer = {"id": inner.id, "result": inner.result}  # rewritten in place
            await anyio.to_thread.run_sync(self.media.spool, answer)
        elif self.media:  # a long string of another message kept on disk: its text back
            await anyio.to_thread.run_sync(self.media.put_back, inner)
        if isinstance(inner, types.JSONRPCError) and cut_off(inner.error):
            # First: the call it answers fails as cut by the run's end.
            connection.end(self.watch.last_failure or "the server broke off an answer's stream")
        await ours.send(message)

    def _raw_calls(
        self,
        client: httpx2.AsyncClient,
        tasks: anyio.abc.TaskGroup,
        ours: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> RemoteCalls:
        """The raw calls of the session now open over *client* (its handshake done), posting in *tasks*."""
        connection = self.connection
        headers = {} if self.watch.session_id is None else {"mcp-session-id": self.watch.session_id}
        if connection.protocol is not None:
            headers["mcp-protocol-version"] = connection.protocol

        async def passed(message: dict[str, Any]) -> None:
            try:
                parsed = types.jsonrpc_message_adapter.validate_python(message, by_name=False)
            except ValueError as exc:
                log.warning("extension.bad_message", error=first_line(exc, typed=False))
                return
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await self._pass(SessionMessage(parsed), ours)

        async def spooled(answer: dict[str, Any], size: int) -> None:
            media, spool = self.media, self.spool
            if media is not None and (media or (spool is not None and spool.needs_look(size))):
                await anyio.to_thread.run_sync(media.spool, answer)  # else too short to hold media

        def failed(why: str) -> None:
            connection.end(self.watch.last_failure or why)

        sent = self.spool.sent if self.spool is not None else None
        return RemoteCalls(
            client, connection.url, headers, tasks, passed=passed, spooled=spooled, failed=failed, sent=sent
        )

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        if self.on_log is not None:
            data = params.data if isinstance(params.data, str) else json.dumps(params.data, default=str)
            self.on_log(
                f"{params.level}{f' {params.logger}' if params.logger else ''}: {data}"[:MAX_LOG_LINE]
            )

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification | types.ResourceUpdatedNotification):
            self.on_notification(message)


async def _first(*events: anyio.Event) -> None:
    """Return once any of *events* is set."""
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as waiting:
            for event in events:
                waiting.start_soon(_set_then_cancel, event, scope)


async def _set_then_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
