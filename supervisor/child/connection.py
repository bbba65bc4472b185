"""A child's stdio as an MCP client session.

:func:`connect` spawns the child, pumps its pipes and yields a :class:`Connection` holding a
handshake-era ``ClientSession``. It replaces the SDK's ``stdio_client``, which leaks
grandchildren, misses a crash while a grandchild holds stdout, and splits lines in quadratic
time. The connection ends when the child exits, its stdout breaks, or a message exceeds the
size cap; the context's exit kills the whole process tree, shielded from cancellation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp import ClientSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.message import SessionMessage

from supervisor.child.pipes import (
    EXIT_FLUSH_GRACE,
    LineSplitter,
    StdoutPump,
    pump_stderr,
    pump_stdin,
    watch_exit,
)
from supervisor.child.rawcalls import RawCalls
from supervisor.child.wire import Outbox
from supervisor.errors import first_line
from supervisor.process import children as process
from supervisor.process.children import ChildProcess
from supervisor.upstream.session import (
    LIST_CHANGED,
    Asked,
    ListChanged,
    Notified,
    SessionUpstream,
    asking_callbacks,
)
from supervisor.upstream.spool import ExtensionSpool
from supervisor.upstream.wire import InboundRequests

__all__ = ("EXIT_FLUSH_GRACE", "Connection", "LineSplitter", "connect")

log = structlog.get_logger(__name__)

MAX_INBOUND_REQUESTS = 32  # requests from the child being answered at once; more are dropped
STDIN_TIMEOUT = 30.0  # default: a child that reads nothing of a pending message this long is stuck


class Connection(SessionUpstream):
    """One live child: its process, its MCP session and why the connection ended.

    Other tasks may send requests concurrently; only the task that entered :func:`connect`
    ends the connection.
    """

    def __init__(self, child: ChildProcess) -> None:
        super().__init__()
        self.child = child
        self.raw: RawCalls | None = None  # plain-JSON tool calls beside the session (the fast path)

    @property
    def run(self) -> str:
        """This run's id: what tells it from the extension's earlier and later runs (and, not
        being a pid, what any upstream has). The tail of the child's marker."""
        return self.child.marker.rsplit(":", 1)[-1]

    async def call_tool_raw(
        self, name: str, arguments: dict[str, Any] | None, *, progress: ProgressFnT
    ) -> dict[str, Any]:
        """Forward one call as plain JSON and return the child's result object, unvalidated
        beyond its shape (see :mod:`supervisor.child.rawcalls`); cancelling sends the child a cancel.

        Error handling: as :meth:`call_tool`; ``ValueError`` for an answer that is no tool result.
        """
        assert self.raw is not None, "used outside connect()"
        return await self.raw.call_tool(name, arguments, progress)

    async def request_raw(
        self, method: str, params: dict[str, Any], *, progress: ProgressFnT
    ) -> dict[str, Any]:
        """Forward any request as plain JSON and return the child's result object, unvalidated
        (for what the SDK's session would refuse: a task-augmented call answers a task, not a
        tool result). Errors as :meth:`call_tool_raw`."""
        assert self.raw is not None, "used outside connect()"
        return await self.raw.request(method, params, progress)


@asynccontextmanager
async def connect(
    child: ChildProcess,
    *,
    stop_timeout: float,
    max_message_bytes: int,
    on_stderr: Callable[[str], None],
    on_list_changed: ListChanged,
    on_notification: Notified,
    on_asked: Asked | None = None,
    hurry: anyio.Event | None = None,
    spool: ExtensionSpool | None = None,
    stdin_timeout: float = STDIN_TIMEOUT,
) -> AsyncIterator[Connection]:
    """Take over the spawned *child* and yield its :class:`Connection` (no MCP traffic yet:
    call ``handshake``).

    Resource handling: the task that enters this context must exit it; from the call on, the
    child is the connection's, whatever happens, and ends with it. Exiting closes the
    session, then closes stdin, waits *stop_timeout* (none if the handshake did not complete),
    and kills the process tree, shielded
    from cancellation; *hurry* cuts the graces short. The pipes are drained until the tree is
    gone, so a child blocked on a full pipe still shuts down gracefully.

    Oversized media in the child's results goes to *spool* before anything parses it into
    models (see :mod:`supervisor.upstream.spool`).

    Bounds: at most ``MAX_INBOUND_REQUESTS`` requests from the child are answered at once
    (more are dropped with a warning); a message to the child that it does not read within
    *stdin_timeout* ends the connection. *on_list_changed* and *on_notification* must return
    at once: they run once per notification. With *on_asked*, the child is told at ``initialize``
    that its client offers sampling, elicitation and roots, and its requests for them go there.

    Error handling: a message that cannot be encoded fails its sender only (see
    :class:`~supervisor.child.wire.Outbox`).
    """
    connection = Connection(child)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[bytes](0)
    inbound = InboundRequests(MAX_INBOUND_REQUESTS)
    drains: list[anyio.CancelScope] = []

    raw = connection.raw = RawCalls(write_send, child.stdin, spool.sent if spool is not None else None)

    def end(failure: str | None) -> None:
        connection.end(failure)  # first: a raw call failed by callback asks whether it ended
        read_send.close()  # pending requests fail with CONNECTION_CLOSED instead of hanging
        raw.close()

    bad_messages = 0

    def aside(message: SessionMessage | Exception) -> bool:
        """Take a malformed line or a list_changed here, in the stdout pump: see StdoutPump."""
        nonlocal bad_messages
        if isinstance(message, Exception):
            bad_messages += 1
            if bad_messages <= 10 or bad_messages % 1000 == 0:  # a junk flood must not flood our log
                log.warning("extension.bad_message", error=first_line(message), count=bad_messages)
            return True
        inner = message.message
        if isinstance(inner, types.JSONRPCNotification) and (kind := LIST_CHANGED.get(inner.method)):
            on_list_changed(kind)
            return True
        return False

    stdout = StdoutPump(
        child, read_send, max_message_bytes, end, spool, inbound, raw, connection.watched, aside
    )

    def drain(pumps: anyio.abc.TaskGroup, pump: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run *pump* in a scope that outlives a stop(): cancelled below, after the kill. The
        scope is listed before its task runs, so no teardown can miss it."""
        scope = anyio.CancelScope(shield=True)
        drains.append(scope)

        async def run() -> None:
            with scope:
                await pump(*args)

        pumps.start_soon(run, name=f"drain {getattr(pump, '__qualname__', pump)}")

    async def on_message(message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification | types.ResourceUpdatedNotification):
            on_notification(message)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        log.info("extension.log", level=params.level, logger=params.logger)

    asking = asking_callbacks(connection, on_asked) if on_asked is not None else {}
    try:
        async with anyio.create_task_group() as pumps:
            drain(pumps, stdout.run)
            drain(pumps, pump_stderr, child, on_stderr)
            pumps.start_soon(pump_stdin, child, write_recv, end, stdin_timeout)
            pumps.start_soon(watch_exit, child, stdout, end)
            outbox = Outbox(write_send, inbound, spool.sent if spool is not None else None)
            try:
                async with ClientSession(
                    read_recv, outbox, message_handler=on_message, logging_callback=on_log, **asking
                ) as session:
                    connection.session = session
                    yield connection
            finally:
                write_send.close()
                raw.close()  # however the connection ended: raw calls fail now, as the session's do
                # A start cut short has nothing to save, and a child still loading its code
                # notices stdin's EOF only once loaded: SIGTERM it at once, freeing the CPU.
                grace = stop_timeout if connection.ready else 0.0
                try:
                    await process.terminate_tree(child, grace=grace, hurry=hurry)
                finally:  # whatever happened there: a pipe a survivor holds must not hold us too
                    for scope in drains:
                        scope.cancel()
                    pumps.cancel_scope.cancel()
    finally:
        if not child.terminated:  # failed before the pumps ran: nothing graceful left to do
            await process.terminate_tree(child, grace=0)
