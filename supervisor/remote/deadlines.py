"""How long the answer to a POST of a remote run is waited for: a request's until it is
cancelled (``notifications/cancelled`` posted for its id, when a call's budget ran out or its
client left), and at most as long as any call may go on; anything else's (our answer to the
server's own request, a notification) as long as the server needs to take it.

The run's HTTP transport (:mod:`.http`) asks :class:`Deadlines` for each POST's deadline, and
waits for the answer's headers and each of its chunks within it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TypeVar

import anyio
import httpx2

__all__ = ("AnswerTimes", "Deadline", "Deadlines", "Post", "TimeUp")

T = TypeVar("T")
MAX_READ_BODY = 64 * 1024  # a POST body read for its id or the id it cancels (a bigger one: neither)
RequestKey = tuple[str, str]  # a JSON-RPC id with its type: 1 and "1" are two ids
_REQUEST_HEAD = re.compile(
    rb'\{"jsonrpc":\s*"2\.0",\s*"id":\s*(-?\d+|"[^"\\]*")\s*,\s*"method":\s*"([^"\\]*)"'
)


@dataclass(frozen=True, slots=True)
class AnswerTimes:
    """How long the answer to a POST is waited for, headers or stream, in seconds: a request's
    until it is cancelled, and at most *request* (as long as any call may go on, progress or
    not); anything else's (our answer to the server's request, a notification: the server
    takes it at once) *other*."""

    request: float
    other: float


@dataclass(frozen=True, slots=True)
class Post:
    """What a POST of a run carries, as far as its answer's wait goes: the JSON-RPC request it
    makes (*request_id*, *method*), or the request it cancels (*cancels*). Ids are kept with
    their type, so that 1 and "1" stay apart."""

    request_id: RequestKey | None = None
    method: str | None = None
    cancels: RequestKey | None = None

    @property
    def may_take_long(self) -> bool:
        """A request whose answer may take as long as a call (not a ping, an answer of ours or
        a notification, which the server answers at once)."""
        return self.request_id is not None and self.method != "ping"

    @classmethod
    def read(cls, request: httpx2.Request) -> Post:
        """*request*'s body read for it; a body too big to read whole (a call's long arguments)
        for a request's id and method, where the SDK and raw calls write them, first."""
        try:
            body = request.content
        except httpx2.RequestNotRead:  # a streamed body: none of ours
            return cls()
        if len(body) > MAX_READ_BODY:
            head = _REQUEST_HEAD.match(body, endpos=1024)
            return cls() if head is None else cls(_key(json.loads(head[1])), head[2].decode())
        try:
            message = json.loads(body)
        except ValueError:
            return cls()
        method = message.get("method") if isinstance(message, dict) else None
        if not isinstance(method, str):
            return cls()
        if method == "notifications/cancelled":
            params = message.get("params")
            cancels = _key(params.get("requestId")) if isinstance(params, dict) else None
            return cls(method=method, cancels=cancels)
        return cls(_key(message.get("id")), method)


def _key(request_id: object) -> RequestKey | None:
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return type(request_id).__name__, str(request_id)


class TimeUp(Exception):
    """A :class:`Deadline` passed, or was cut, while it waited."""


class Deadline:
    """When the answer to one POST is given up: at *at*, or at once once cut (its request was
    cancelled). One wait at a time (its headers, then each chunk) is ended by a cut."""

    __slots__ = ("_waiting", "at", "cut_off")

    def __init__(self, at: float) -> None:
        self.at, self.cut_off = at, False
        self._waiting: anyio.CancelScope | None = None

    def cut(self) -> None:
        self.cut_off = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """*awaitable*'s value; :class:`TimeUp` if the deadline passes or is cut first."""
        if self.cut_off:
            if isinstance(awaitable, Coroutine):
                awaitable.close()  # never awaited: said so, else
            raise TimeUp
        with anyio.move_on_after(self.at - anyio.current_time()) as self._waiting:
            try:
                return await awaitable
            finally:
                self._waiting = None
        raise TimeUp


class Deadlines:
    """The deadlines of one transport's POSTs; those of requests whose answers are being read
    are kept by id (as many as answers are being read), so that a cancel cuts its request's."""

    def __init__(self, times: AnswerTimes) -> None:
        self._times = times
        self._awaited: dict[RequestKey, Deadline] = {}

    def __len__(self) -> int:
        return len(self._awaited)

    def posted(self, post: Post) -> tuple[Deadline, Callable[[], None]]:
        """The deadline of *post*'s answer, and what to call once that answer is read or given
        up. A cancel it posts cuts its request's deadline now."""
        if post.cancels is not None and (awaited := self._awaited.get(post.cancels)) is not None:
            awaited.cut()
        request_id, now = post.request_id, anyio.current_time()
        if request_id is None:  # an answer, a notification
            return Deadline(now + self._times.other), _nothing
        deadline = Deadline(now + self._times.request)
        if request_id in self._awaited:  # an id sent again (a retry): the first keeps the cancel
            return deadline, _nothing
        self._awaited[request_id] = deadline

        def forget() -> None:
            if self._awaited.get(request_id) is deadline:
                del self._awaited[request_id]

        return deadline, forget


def _nothing() -> None:
    pass
