"""The one runner of plain tool calls, behind every front-end that takes them.

Three front-ends take a plain ``tools/call`` beside the SDK's path: a line on ``mcp.sock``
(:mod:`..stdio`), a POST in its ASGI task (:mod:`..http.fastcalls`) and a POST in its
connection's callbacks (:mod:`..http.quick`). Each decides only what its transport decides
(that the line or body is a plain call, that its client may take one); the rest is here, once:

- :meth:`Runner.take`: whether the call is the runner's at all: its client's session is open, its
  request id is not in flight already, a progress token has a channel, and the tool routes in
  the client's view. None leaves it to the SDK's path, which says what is wrong with it.
- :meth:`Runner.start` and :meth:`Runner.run`: how it is served. In the event loop's callbacks
  when its extension takes it at once and no progress is asked
  (:meth:`~supervisor.extension.calls.Calls.call_tool_inline`); else awaited, in a task of the
  front-end's or in the front-end's own task
  (:meth:`~supervisor.extension.calls.Calls.call_tool_raw`).
- one table of the calls running, by (client, request id), so that one
  ``notifications/cancelled`` or a client going cancels them (:meth:`Runner.cancel`,
  :meth:`Runner.close`, :meth:`Running.cancel`);
- one answer: :func:`.answers.answer_line`, and a bug of ours fails the call it hit only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from supervisor.errors import CallFailed, ExtensionUnavailable
from supervisor.gateway.asks.callers import FastCaller
from supervisor.gateway.fast.answers import Outcome, Shape, answer_line, internal_error
from supervisor.gateway.fast.parse import FastCall, RequestId
from supervisor.gateway.progress import LatestProgress
from supervisor.upstream.raw import encode

if TYPE_CHECKING:
    from supervisor.extension.asking import Caller
    from supervisor.extension.inline import InlineCall
    from supervisor.extension.served import Served
    from supervisor.gateway.router import Router
    from supervisor.gateway.session import Session
    from supervisor.gateway.view.profiles import Chosen

__all__ = ("Deliver", "Runner", "Running", "Send", "Taken", "Watch")

log = structlog.get_logger(__name__)

Send = Callable[[bytes], Awaitable[bool]]  # a line for the client, whole; whether it went
Deliver = Callable[[bytes | None], None]  # the answer line, or None: none is due (cancelled)
Watch = Callable[[Callable[[], None] | None], None]  # calls its argument when the client goes


@dataclass(frozen=True, slots=True)
class Taken:
    """A plain call the runner serves: what serving it needs."""

    call: FastCall
    ext: Served
    tool: str  # the extension's name for it
    session: Session  # its client's
    caller: Caller  # who the extension's questions go to
    shape: Shape | None = None  # a 2026-07-28 client's result, as its version has it
    progress: Send | None = None  # where its progress goes (it asked for progress)

    def shaped(self, shape: Shape) -> Taken:
        return dataclasses.replace(self, shape=shape)


class Running:
    """One plain call being served, in callbacks or in a task, until it ends once: answered,
    or cancelled (then no answer is due)."""

    __slots__ = ("_deliver", "_inline", "_runner", "_scope", "ended", "taken")

    def __init__(self, runner: Runner, taken: Taken, deliver: Deliver) -> None:
        self._runner, self.taken, self._deliver = runner, taken, deliver
        self._inline: InlineCall | None = None
        self._scope: anyio.CancelScope | None = None
        self.ended = False

    def cancel(self) -> None:
        """Its client cancelled it, or went: the extension is told, and no answer is due."""
        if self.ended:
            return
        if self._scope is not None:
            self._scope.cancel()  # its task ends it
            return
        if self._inline is not None:
            self._inline.cancel()
        self._end(None)

    def _answered(self, outcome: Outcome) -> None:
        if not self.ended:
            self._end(self._runner.answer(self.taken, outcome))

    def _end(self, answer: bytes | None) -> None:
        self.ended = True
        self._runner._leave(self)
        self._deliver(answer)


class Runner:
    """The plain calls of every client of the gateway (see the module's docstring).

    The table holds a call while it runs: at most one per request a front-end admitted (each
    bounds its clients' requests in flight).
    """

    def __init__(self, router: Router, spool_prefix: str) -> None:
        self._router = router
        self.spool_prefix = spool_prefix
        self._running: dict[tuple[Session, RequestId], Running] = {}

    def __len__(self) -> int:
        return len(self._running)

    def take(
        self,
        call: FastCall,
        session: Session,
        chosen: Chosen | None = None,
        *,
        caller: Caller | None = None,
        progress: Send | None = None,
    ) -> Taken | None:
        """*call* of *session*'s client, routed in its view (*chosen*: the profile it asked
        for), if the runner serves it; None leaves it to the SDK's path. Its extension's
        questions go to *caller* (by default the session's connection), its progress to
        *progress*: a call that asks for progress where there is no channel is left too."""
        if session.closed or (session, call.id) in self._running:
            return None  # a duplicate id in flight: the SDK's path answers it as it does
        if call.progress_token is not None and progress is None:
            return None
        route = self._router.route_tool(call.name, chosen, session)
        if route is None:
            return None  # hidden, unknown, a meta-tool, an instance refused: the SDK's path says why
        ext, tool = route
        return Taken(call, ext, tool, session, caller or FastCaller(session), None, progress)

    def start(
        self, taken: Taken, deliver: Deliver, tasks: anyio.abc.TaskGroup | None = None
    ) -> Running | None:
        """Serve *taken*, then *deliver* its answer (maybe before this returns), or None if it
        is cancelled first. In callbacks when its extension takes it at once, else in a task of
        *tasks*; None, with nothing sent, when neither can (no *tasks*). When the task group
        is cancelled, its calls end with it and nothing is delivered."""
        running = Running(self, taken, deliver)
        if taken.progress is None:
            try:
                running._inline = taken.ext.call_tool_inline(
                    taken.tool, taken.call.arguments, running._answered, caller=taken.caller
                )
            except Exception:  # a bug of ours: it may have reached the child, so it is answered here
                log.exception("gateway.fast_call_crashed", extension=taken.ext.name, tool=taken.tool)
                running._end(internal_error(taken.call.id))
                return running
            if running._inline is not None:
                if not running.ended:  # else answered at once: nothing to hold
                    self._running[taken.session, taken.call.id] = running
                return running
        if tasks is None:
            return None
        running._scope = anyio.CancelScope()
        self._running[taken.session, taken.call.id] = running
        tasks.start_soon(self._serve, running)
        return running

    async def run(self, taken: Taken, watch: Watch | None = None) -> bytes | None:
        """Serve *taken* in this task: its answer, or None when it was cancelled (by
        :meth:`cancel`, or by its client going, which *watch* reports)."""
        running = Running(self, taken, _nobody)
        running._scope = anyio.CancelScope()
        self._running[taken.session, taken.call.id] = running
        if watch is not None:
            watch(running.cancel)
        try:
            return await self._awaited(running)
        finally:
            if watch is not None:
                watch(None)

    def cancel(self, session: Session, request_id: RequestId) -> None:
        """*session*'s client cancelled its request *request_id*, if the runner serves it."""
        running = self._running.get((session, request_id))
        if running is not None:
            running.cancel()

    def close(self, session: Session) -> None:
        """*session*'s client is gone: each of its calls served in callbacks is cancelled (those
        in tasks end with their task group)."""
        for running in [running for (client, _), running in self._running.items() if client is session]:
            running.cancel()

    def answer(self, taken: Taken, outcome: Outcome) -> bytes:
        """The answer line to *taken* that ended with *outcome*."""
        try:
            return answer_line(taken.call.id, taken.ext.name, outcome, self.spool_prefix, taken.shape)
        except Exception:  # a bug of ours: this call fails, the connection goes on
            log.exception("gateway.fast_call_crashed", extension=taken.ext.name, tool=taken.tool)
            return internal_error(taken.call.id)

    async def _serve(self, running: Running) -> None:
        answer = await self._awaited(running)
        running._deliver(answer)

    async def _awaited(self, running: Running) -> bytes | None:
        taken = running.taken
        assert running._scope is not None
        outcome: Outcome | None = None
        try:
            with running._scope:
                relay = _progress(taken.call.progress_token, taken.progress)
                try:
                    outcome = await taken.ext.call_tool_raw(
                        taken.tool, taken.call.arguments, progress=relay, caller=taken.caller
                    )
                except (ExtensionUnavailable, CallFailed) as exc:
                    outcome = exc
                except Exception:  # a bug of ours: this call fails, the connection goes on
                    log.exception("gateway.fast_call_crashed", extension=taken.ext.name, tool=taken.tool)
                    return internal_error(taken.call.id)
        finally:
            running.ended = True
            self._leave(running)
        return None if outcome is None else self.answer(taken, outcome)

    def _leave(self, running: Running) -> None:
        key = (running.taken.session, running.taken.call.id)
        if self._running.get(key) is running:
            del self._running[key]


def _progress(token: RequestId | None, send: Send | None) -> LatestProgress | None:
    """Progress to the client under its own token, as the SDK's path relays it."""
    if token is None or send is None:
        return None

    async def notify(progress: float, total: float | None, message: str | None) -> None:
        given = {"progressToken": token, "progress": progress, "total": total, "message": message}
        params: dict[str, Any] = {key: value for key, value in given.items() if value is not None}
        await send(encode({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}))

    return LatestProgress(notify)


def _nobody(answer: bytes | None) -> None:
    pass  # an awaited call's answer is returned
