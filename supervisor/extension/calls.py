"""An extension's calls: a client's request forwarded to the running child, with its bookkeeping.

The methods of :class:`~supervisor.extension.supervised.Extension` that borrow the watcher's
connection: they wait for the extension to run (or start it, on demand), hold a call's budget
(``call_timeout`` renewed by progress, ``call_timeout_max`` in all), enroll the call so that the
child's questions reach its client (:mod:`.asking`), and turn what goes wrong into
:class:`~supervisor.errors.CallFailed` or :class:`~supervisor.errors.ExtensionUnavailable`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types as types
import structlog
from mcp import MCPError
from mcp.shared.dispatcher import ProgressFnT

from supervisor.errors import CallFailed, ExtensionUnavailable, LoginNeeded, first_line
from supervisor.extension.asking import Budget, Caller
from supervisor.extension.inline import Answered, InlineCall
from supervisor.extension.state import State
from supervisor.extension.upstream import Upstream

__all__ = ("Calls",)

log = structlog.get_logger(__name__)

ResultT = TypeVar("ResultT")


class Calls:
    """Forwarding, as part of an Extension (its state: ``_connection``, ``_snapshot``, ``_asking``, ...)."""

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> types.CallToolResult:
        """Forward one call; wait for running (if on the way) and answer within ``call_timeout``.

        ``call_timeout`` is an inactivity budget: each progress notification from the child
        renews it, up to ``call_timeout_max`` in all. *progress* receives them. What the child
        asks its client meanwhile goes to *caller* (see :mod:`supervisor.extension.asking`).

        Error handling: :class:`ExtensionUnavailable` when not running in time (``retryable``
        while starting or in backoff), :class:`CallFailed` when the call itself fails.
        """

        async def call(connection: Upstream, progress: ProgressFnT) -> types.CallToolResult:
            return await connection.call_tool(tool, arguments, progress=progress)

        return await self._call(tool, call, progress, lambda result: not result.is_error, caller)

    async def call_tool_raw(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> dict[str, Any]:
        """:meth:`call_tool` for the gateway's fast path: the child's result as plain JSON.

        Media in it went to the spool as usual; nothing else was checked beyond its shape
        (see :mod:`supervisor.child.rawcalls`). Errors as :meth:`call_tool`.
        """

        async def call(connection: Upstream, progress: ProgressFnT) -> dict[str, Any]:
            return await connection.call_tool_raw(tool, arguments, progress=progress)

        return await self._call(
            tool, call, progress, lambda result: result.get("isError") is not True, caller
        )

    def call_tool_inline(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        answered: Answered,
        *,
        caller: Caller | None = None,
    ) -> InlineCall | None:
        """:meth:`call_tool_raw` served by the event loop's callbacks instead of a task: the
        request is sent now, and *answered* called once, sync, with the child's result or the
        :class:`CallFailed` that :meth:`call_tool_raw` would raise. Its progress renews the
        budget (``call_timeout``); nobody is told of it. Cancel it with :meth:`InlineCall.cancel`
        (the child is told; *answered* is not called).

        None, with nothing sent, where only :meth:`call_tool_raw` can serve the call: the
        extension does not run now (it may be waited for), the tool is not one it listed, the
        child's stdin is busy, or the call cannot be encoded (the awaited path says why).
        """
        connection = self._running_connection()
        if connection is None or connection.raw is None or tool not in self._listing.tool_names:
            return None
        return InlineCall.send(self, connection, tool, arguments, answered, caller)

    async def _call(
        self,
        tool: str,
        send: Callable[[Upstream, ProgressFnT], Awaitable[ResultT]],
        progress: ProgressFnT | None,
        succeeded: Callable[[ResultT], bool],
        caller: Caller | None,
    ) -> ResultT:
        """One tool call with its bookkeeping: counts, errors, the metrics hook."""
        started, ok = time.monotonic(), False
        self.calls += 1
        try:

            async def call(connection: Upstream, progress: ProgressFnT) -> ResultT:
                if tool not in self._listing.tool_names:
                    unknown = f"extension {self.name!r} has no tool {tool!r}"
                    raise CallFailed(unknown, code=types.INVALID_PARAMS)
                return await send(connection, progress)

            result = await self._forward(f"tool {tool!r}", call, progress, caller)
            ok = succeeded(result)
            return result
        finally:
            self._counted(tool, started, ok)

    def _inline_began(self) -> None:
        self.calls += 1
        self._in_flight += 1
        if self._demand is not None:
            self._demand.touch()

    def _inline_ended(self, tool: str, started: float, ok: bool) -> None:
        self._in_flight -= 1
        if self._demand is not None:
            self._demand.touch()
        self._counted(tool, started, ok)

    def _counted(self, tool: str, started: float, ok: bool) -> None:
        """A tool call ended (*ok*: with a result that is no error): the counts and the metrics hook."""
        if not ok:
            self.errors += 1
        if self._on_call is not None:
            label = tool if tool in self._listing.tool_names else "(unknown)"
            self._on_call(label, time.monotonic() - started, ok)

    async def request(
        self,
        request: types.ClientRequest,
        result_type: type[ResultT],
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> ResultT:
        """Forward any other client request (prompts/get, resources/read, ...) like a call."""

        async def send(connection: Upstream, progress: ProgressFnT) -> ResultT:
            return await connection.request(request, result_type, progress=progress)

        return await self._forward(repr(request.method), send, progress, caller)

    async def request_raw(
        self,
        method: str,
        params: dict[str, Any],
        *,
        run: str | None = None,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
        blocking: bool = False,
        touch: bool = True,
    ) -> tuple[dict[str, Any], str]:
        """Forward any request as plain JSON (see :meth:`Upstream.request_raw`);
        returns the child's result and the id of the run that answered (:attr:`run_id`).

        With *run* (a :attr:`run_id`), only that run of the child may answer: another one
        fails with :class:`CallFailed` (``INVALID_PARAMS``) saying the extension restarted.
        *blocking*: the request waits for work done elsewhere (``tasks/result``), so only
        ``call_timeout_max`` bounds it. *touch* False: it does not renew ``idle_stop``'s period.
        """

        async def send(connection: Upstream, progress: ProgressFnT) -> tuple[dict[str, Any], str]:
            if run is not None and connection.run != run:
                message = f"extension {self.name!r} restarted since; the request was for its earlier run"
                raise CallFailed(message, code=types.INVALID_PARAMS)
            return await connection.request_raw(method, params, progress=progress), connection.run

        return await self._forward(repr(method), send, progress, caller, blocking=blocking, touch=touch)

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What the running child declared at ``initialize`` (None while it does not run)."""
        return self._connection.capabilities if self._connection is not None else None

    async def roots_changed(self, client: object) -> None:
        """A client's roots changed: tell the child if its roots came from that client."""
        await self._asking.roots_changed(client)

    async def _forward(
        self,
        what: str,
        send: Callable[[Upstream, ProgressFnT], Awaitable[ResultT]],
        progress: ProgressFnT | None,
        caller: Caller | None,
        *,
        blocking: bool = False,
        touch: bool = True,
    ) -> ResultT:
        timeout, cap = self.config.call_timeout, self.config.call_timeout_max
        started = time.monotonic()
        connection: Upstream | None = None
        demand = self._demand if touch else None  # a tasks/list poll must not keep it alive
        if demand is not None:
            demand.touch()
        with anyio.CancelScope() as scope:
            budget = Budget(scope, timeout, cap)
            if blocking:
                budget.hold()  # never released: nothing renews it (the task's progress goes elsewhere)

            async def renew(value: float, total: float | None, message: str | None) -> None:
                budget.renew()
                self._answered_at = time.monotonic()
                if progress is not None:
                    await progress(value, total, message)

            connection = await self._wait_connection(caller)
            self._in_flight += 1
            try:
                with self._asking.call(connection, caller, budget):
                    result = await send(connection, renew)
                self._answered_at = time.monotonic()
                return result
            except MCPError as exc:
                self._answered_at = time.monotonic()
                raise self._call_failed(what, exc, connection) from None
            except CallFailed:
                raise
            except Exception as exc:  # a malformed result: ValidationError, output schema RuntimeError
                raise self._invalid_result(what, exc) from None
            finally:
                self._in_flight -= 1
                if demand is not None:
                    demand.touch()
        if connection is None:
            state = self._snapshot.state
            raise ExtensionUnavailable(
                self.name, state.value, retryable=True, detail=f"not running after {timeout:g}s"
            )
        raise self._call_timed_out(what, started)

    def _invalid_result(self, what: str, exc: Exception) -> CallFailed:
        log.warning("extension.bad_result", request=what, error=first_line(exc, typed=False))
        return CallFailed(f"extension {self.name!r} returned an invalid result for {what}")

    def _call_timed_out(self, what: str, started: float) -> CallFailed:
        cap = self.config.call_timeout_max
        if time.monotonic() - started >= cap:
            detail = f"did not finish within call_timeout_max ({cap:g}s)"
        else:
            detail = f"did not answer within {self.config.call_timeout:g}s"  # nor report progress
        return CallFailed(f"{what} of {self.name!r} {detail}", code=types.REQUEST_TIMEOUT)

    def _running_connection(self) -> Upstream | None:
        """The connection a call may use at once, if the extension runs and is not being stopped."""
        if self._snapshot.state is State.RUNNING and not self._stop_requested:
            return self._connection
        return None

    async def _wait_connection(self, caller: Caller | None = None) -> Upstream:
        """The running connection, once there is one; a call to an extension that is not on its
        way fails at once, naming what brings it back (for a client that opens URLs, the login)."""
        try:
            return await self._await_running()
        except ExtensionUnavailable as exc:
            asks = exc.state == State.NEEDS_LOGIN.value and caller is not None and caller.opens_urls()
            if asks and self._login is not None and (url := await self._login()) is not None:
                raise LoginNeeded(self.name, url, f"{self.name}-{secrets.token_hex(8)}") from None
            raise

    async def _await_running(self) -> Upstream:
        started = False
        while True:
            changed = self._changed
            state = self._snapshot.state
            if (connection := self._running_connection()) is not None:
                return connection
            if self.dormant and state is not State.STOPPING and not started and self._demand is not None:
                started = True  # one try per call; fifty callers share one spawn (start() is idempotent)
                await self._demand.start(self)
                continue
            on_the_way = state.is_transient or state is State.RUNNING  # RUNNING: just crashed, or stopping
            on_the_way = on_the_way or (self.dormant and state is State.STOPPING)  # idle stop, then a start
            restarting = (self._restarting or self._launching) and state in (State.STOPPING, State.STOPPED)
            if not (on_the_way or restarting):
                raise ExtensionUnavailable(
                    self.name,
                    state.value,
                    retryable=False,
                    detail=self._snapshot.last_error,
                    advice=state.remedy(self.name),
                )
            await changed.wait()

    def _call_failed(self, what: str, exc: MCPError, connection: Upstream) -> CallFailed:
        # Only a connection that ended (or that a stop cut) is ours to report: -32000 is also the
        # code many servers give their own errors ("database is locked"), from a live child.
        ours = connection.ended.is_set() or self._cut[0] is connection
        if exc.code == types.CONNECTION_CLOSED and ours:
            failure = connection.failure
            ended = f"failed ({failure})" if failure else "exited"
            ended = self._cut[1] if self._cut[0] is connection else ended
            message = f"extension {self.name!r} {ended} during the call to {what}; it may or may not have run"
            return CallFailed(message, code=exc.code)
        return CallFailed(f"{self.name}: {exc.message}", code=exc.code, data=exc.error.data, from_child=True)
