"""Input-required results: a child's questions mid-call, for 2026-07-28 clients.

A 2026-07-28 client cannot be sent requests. When a child asks its client something
(``elicitation/create``, ``sampling/createMessage``, ``roots/list``) while serving such a
client's ``tools/call``, ``prompts/get`` or ``resources/read``, that request is answered with an
``InputRequiredResult`` carrying the child's question(s) and a ``requestState`` naming the call,
which stays *parked*: the child goes on waiting for its answer. The client's retry with
``inputResponses`` and that ``requestState`` hands the answers to the child's pending requests
and waits for the same child call again, for its result or the next input-required result.
Nothing is sent to the child twice.

- Such a call runs in a task of :class:`InputRequired` (owned by the gateway's task), so that it
  can outlive the request that started it. The request waiting for it (the first, or a retry)
  *attends* it and gets its progress; that request's cancellation cancels the call in the child.
- A ``requestState`` (:mod:`.requeststate`) is sealed under a key drawn when the daemon starts:
  unforgeable, and void after a restart. It names a call in a bounded table; the table, not the
  token, holds what it is bound to (the client connection on mcp.sock, the profile on HTTP, where
  2026-07-28 has no sessions; the method, name and arguments), and each state is good for one
  retry. The state itself carries nothing a client may not read.
- Bounds: :data:`MAX_PARKED_PER_CLIENT` calls of one client and :data:`MAX_PARKED` in all may wait
  for input. At a bound, the call left unanswered longest (its result went out, no retry came) is
  ended to make room; with none such, a child's question past them gets an error at once. A
  parked call waits for each retry within its ``call_timeout`` (a client that walked away must
  not hold the child's call, nor make every other client's question on that child ambiguous, for
  ``call_timeout_max``), within ``call_timeout_max`` in all, and on mcp.sock no longer than the
  client's connection; then the child gets ``notifications/cancelled``. A call that ended
  meanwhile leaves a short reason (:data:`MAX_RETIRED` of them) that a late retry gets as its error.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import mcp_types as types
import structlog
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from supervisor.gateway.asks.callers import result_type
from supervisor.gateway.asks.parked import Parked, Pending, serve_parked
from supervisor.gateway.asks.requeststate import HANDLE_BYTES, Seal
from supervisor.gateway.owner import TaskOwner
from supervisor.gateway.progress import LatestProgress
from supervisor.gateway.session import Session, bind, session_of
from supervisor.gateway.view.profiles import SCOPE_KEY

__all__ = (
    "MAX_PARKED",
    "MAX_PARKED_PER_CLIENT",
    "MAX_RETIRED",
    "InputRequired",
)

log = structlog.get_logger(__name__)

MAX_PARKED = 128  # calls waiting for a retry with answers, in all
MAX_PARKED_PER_CLIENT = 16  # ... from one client (an mcp.sock connection; an HTTP profile)
MAX_RETIRED = 1024  # reasons kept for the states of calls that ended, for late retries
ParamsT = TypeVar("ParamsT", bound=types.InputResponseRequestParams)
Handler = Callable[[ServerRequestContext[Any], ParamsT], Awaitable[Any]]


class InputRequired(TaskOwner):
    """The calls of 2026-07-28 clients that may wait for input, and their tasks (:meth:`run`)."""

    def __init__(self) -> None:
        self._seal = Seal()  # a key per daemon run: a restart voids every requestState
        self._calls: dict[bytes, Parked] = {}
        self._slots: dict[Hashable, set[Parked]] = {}
        self._retired: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._watched: set[int] = set()  # id() of the sessions whose close we hear of

    def __len__(self) -> int:
        """Calls waiting for input, or for their client's retry with it."""
        return sum(len(calls) for calls in self._slots.values())

    def wrap(self, handler: Handler[ParamsT]) -> Handler[ParamsT]:
        """*handler*, serving 2026-07-28 clients through parked calls; others as before."""

        async def serve(ctx: ServerRequestContext[Any], params: ParamsT) -> Any:
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                return await handler(ctx, params)
            if self._tg is None:  # starting or shutting down: a retry must not run as a new call
                if params.request_state is not None or params.input_responses:
                    _refuse("the gateway is not serving calls that wait for input now; call again without it")
                return await handler(ctx, params)
            if params.request_state is not None:
                call = self._resume(ctx, params)
            elif params.input_responses:
                raise MCPError(
                    types.INVALID_PARAMS, "inputResponses came without the requestState they answer"
                )
            else:
                call = Parked(
                    os.urandom(HANDLE_BYTES), _client(ctx), _identity(ctx), ctx.session.client_capabilities
                )
                self._calls[call.handle] = call
                self._tg.start_soon(self._run_call, call, handler, ctx, params)
            return await self._attend(call, ctx)

        return serve

    # ---- the call and who attends it -----------------------------------------------------

    async def _run_call(
        self, call: Parked, handler: Handler[Any], ctx: ServerRequestContext[Any], params: Any
    ) -> None:
        serve_parked(self, call)
        # Its per-client instance: its mcp.sock connection's; over HTTP (no sessions) none (a
        # per-client extension refuses such a call: see instances.SESSIONLESS).
        session = call.client if isinstance(call.client, Session) else Session("http", lasting=False)
        bind(session)
        outcome: tuple[Any, BaseException | None] = (
            None,
            MCPError(types.INTERNAL_ERROR, "the call was cancelled"),
        )
        try:
            with call.scope:
                try:
                    outcome = (await handler(ctx, params), None)
                except Exception as exc:  # the handler's error is the request's answer
                    outcome = (None, exc)
        finally:
            call.outcome = outcome
            call.wake()
            if not call.attended:
                self._retire(call, self._why_ended(call, outcome))
            if session is not call.client:
                session.close()

    def _why_ended(self, call: Parked, outcome: tuple[Any, BaseException | None]) -> str:
        patience, parked_at = call.patience, call.parked_at
        if patience is not None and parked_at is not None and time.monotonic() >= parked_at + patience:
            return f"got no retry within call_timeout ({patience:g}s) after its input-required result"
        return f"ended before the client's answers came ({_describe(outcome)})"

    async def _attend(self, call: Parked, ctx: ServerRequestContext[Any]) -> Any:
        call.attended, call.relay, call.parked_at = True, LatestProgress(ctx.session.report_progress), None
        call.attendant = ctx
        call.scope.deadline = math.inf  # a retry came in time
        parked = False
        try:
            while call.outcome is None:
                if call.pending:
                    await anyio.lowlevel.checkpoint()  # a child's questions sent together go out together
                    if call.outcome is None and call.pending:  # (a question may be withdrawn meanwhile)
                        parked, call.parked_at = True, time.monotonic()
                        if call.patience is not None:  # no retry by then: the call ends
                            call.scope.deadline = call.parked_at + call.patience
                        return self._input_required(call)
                    continue
                await call.changed.wait()
            result, error = call.outcome
            if isinstance(error, MCPError):
                raise MCPError(error.code, error.message, error.error.data) from None
            if error is not None:
                raise error
            return result
        finally:
            call.attended, call.relay, call.attendant = False, None, None
            if call.outcome is not None:  # delivered, or ended as this request was cancelled
                self._retire(
                    call, "finished and its result was delivered (a requestState is good for one retry)"
                )
            elif not parked:  # its request was cancelled, or its client went: so is the call
                call.scope.cancel()

    def _input_required(self, call: Parked) -> types.InputRequiredResult:
        call.round += 1
        log.info("gateway.input_required", round=call.round, requests=sorted(call.pending))
        requests = {key: pending.request for key, pending in call.pending.items()}
        state = self._seal.seal(call.handle, call.round)
        return types.InputRequiredResult(input_requests=requests, request_state=state)

    # ---- the child's questions -----------------------------------------------------------

    def room_for(self, call: Parked) -> str | None:
        """Why *call* may not wait for input (too many of its client's calls do), or None. Sync.

        At a bound, the call whose client has left it unanswered longest makes room (as the
        idlest control connection does): a client that walked away from its calls (over HTTP a
        profile's clients share one bound) never starves the clients still answering.
        """
        if call.slot:
            return None
        own = self._slots.get(call.client, set())
        if len(own) >= MAX_PARKED_PER_CLIENT and not self._make_room(own):
            return f"the calling client has {MAX_PARKED_PER_CLIENT} calls waiting for input already"
        if len(self) >= MAX_PARKED and not self._make_room(
            c for calls in self._slots.values() for c in calls
        ):
            return f"{MAX_PARKED} calls of 2026-07-28 clients wait for input already"
        return None

    def _make_room(self, calls: Iterable[Parked]) -> bool:
        waiting = [c for c in calls if not c.attended and c.parked_at is not None]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.parked_at or 0.0)
        self._retire(oldest, "was ended to make room: its client left it unanswered the longest")
        oldest.scope.cancel()
        return True

    def ask(self, call: Parked, request: types.ServerRequest) -> Pending:
        """Record the child's *request* for the client; the attending request (or the next) sends it."""
        if not call.slot:
            call.slot = True
            self._slots.setdefault(call.client, set()).add(call)
            client = call.client
            if isinstance(client, Session) and id(client) not in self._watched:
                self._watched.add(id(client))
                client.on_close(lambda: self._client_gone(client))
        call.asked += 1
        pending = Pending(f"r{call.asked}", request)  # type: ignore[arg-type]  # one of the three
        call.pending[pending.key] = pending
        call.wake()
        return pending

    def _client_gone(self, client: Session) -> None:
        self._watched.discard(id(client))
        for call in list(self._slots.get(client, ())):
            call.scope.cancel()

    # ---- retries -------------------------------------------------------------------------

    def _resume(self, ctx: ServerRequestContext[Any], params: types.InputResponseRequestParams) -> Parked:
        """The call a retry's requestState names, its answers handed to the child's requests."""
        handle, number = self._unseal(str(params.request_state))
        call = self._calls.get(handle)
        if call is None:
            reason = self._retired.get(handle, "is no longer known")
            _refuse(f"the call this requestState names {reason}; call again without it")
        if call.client != _client(ctx):
            _refuse("this requestState was issued to another client connection")
        if call.identity != _identity(ctx):
            _refuse(
                f"this requestState was issued for another request ({call.identity[0]} {call.identity[1]!r})"
            )
        if number != call.round or call.attended:
            _refuse(
                "this requestState was used already (each is good for one retry); retry with the latest one"
            )
        answers = self._validated(call, params.input_responses or {})
        for key, answer in answers.items():
            pending = call.pending.pop(key)
            pending.answer = answer
            pending.answered.set()
        return call

    def _validated(self, call: Parked, responses: types.InputResponses) -> dict[str, types.ClientResult]:
        answers: dict[str, types.ClientResult] = {}
        for key, response in responses.items():
            pending = call.pending.get(key)
            if pending is None and _issued(key, call):
                continue  # the child withdrew that question meanwhile (it stopped waiting)
            if pending is None:
                outstanding = ", ".join(sorted(call.pending)) or "none"
                _refuse(
                    f"inputResponses answers {key[:40]!r}, which is not asked (outstanding: {outstanding})"
                )
            data = response.model_dump(by_alias=True, mode="json", exclude_none=True)
            try:
                answer = result_type(pending.request).model_validate(data, by_name=False)
            except ValidationError as exc:
                method = pending.request.method
                _refuse(f"inputResponses[{key!r}] is not an answer to {method}: {exc.errors()[:1]}")
            answers[key] = answer  # type: ignore[assignment]
        return answers

    def _retire(self, call: Parked, reason: str) -> None:
        if self._calls.pop(call.handle, None) is None:
            return
        if call.slot:
            holders = self._slots.get(call.client, set())
            holders.discard(call)
            if not holders:
                self._slots.pop(call.client, None)
        for pending in call.pending.values():  # the child stops waiting: nobody will answer now
            pending.error = f"the call it served {reason}"
            pending.answered.set()
        if call.round:
            self._retired[call.handle] = reason
            while len(self._retired) > MAX_RETIRED:
                self._retired.popitem(last=False)
            log.info("gateway.parked_call_ended", reason=reason[:200])

    def _unseal(self, state: str) -> tuple[bytes, int]:
        opened = self._seal.open(state)
        if opened is None:
            _refuse(
                "this requestState was not issued by this daemon: it was altered, or the daemon restarted "
                "since (which ends every call waiting for input); call again without it"
            )
        return opened


def _refuse(message: str) -> Any:
    log.info("gateway.request_state_refused", reason=message[:200])
    raise MCPError(types.INVALID_PARAMS, f"mcp-supervisor: {message}")


def _issued(key: str, call: Parked) -> bool:
    """Whether *key* names a question of *call* put to the client in an earlier round."""
    number = key[1:]
    if not (key.startswith("r") and number.isascii() and number.isdigit() and len(number) <= 9):
        return False  # isdigit() alone takes "²", which int() refuses
    return 0 < int(number) <= call.asked


def _client(ctx: ServerRequestContext[Any]) -> Hashable:
    """What a retry must come from: the mcp.sock client, or on HTTP (no sessions) the profile."""
    session = session_of(ctx)
    if session.listener == "unix":
        return session
    scope = getattr(ctx.request, "scope", None)
    return ("http", scope.get(SCOPE_KEY) if isinstance(scope, dict) else None)


def _identity(ctx: ServerRequestContext[Any]) -> tuple[str, str, Any]:
    """The request a requestState is bound to: method, name (or URI) and arguments."""
    params = ctx.params or {}
    target = params.get("uri") if ctx.method == "resources/read" else params.get("name")
    arguments = params.get("arguments") or {}
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode()).hexdigest()
    return ctx.method, str(target), digest


def _describe(outcome: tuple[Any, BaseException | None]) -> str:
    result, error = outcome
    if error is not None:
        return str(error)[:300] or type(error).__name__
    content = getattr(result, "content", None)
    if getattr(result, "is_error", False) and content and isinstance(content[0], types.TextContent):
        return f"an error: {content[0].text[:300]}"
    return "its result came, but no retry collected it"
