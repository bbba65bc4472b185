"""Tool calls to a remote server as plain JSON, beside its SDK session (its
:class:`~supervisor.upstream.raw.Raw`).

Over streamable HTTP a call is one POST, answered by a JSON body or by an event stream that
ends with the answer. Through the SDK each call costs a task group and a task in its transport,
every message validated into models and dumped again, and streams between them: more than the
rest of a call passing through the daemon. :class:`RemoteCalls` posts the request's bytes on the
run's own HTTP client (its bounds, its signer, its diversions, its connections) with the
session's headers, in one task of the run, and hands the answer back as parsed JSON.

From a stream it takes the answer and the progress of its own token; anything else there (the
server's questions, its log messages) goes on to the session, as the transport would pass it.
A failure reads as the SDK's transport reads it: an answer over the byte limit or past its
time fails that call alone, a broken connection ends the run. What it leaves to the SDK: a
server whose streams carry event ids (a broken one is resumed there with ``Last-Event-ID``),
so once it sees one, it sends nothing more; HTTP+SSE; a run before its handshake.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pydantic_core
import structlog
from anyio.abc import TaskGroup

from supervisor.errors import first_line
from supervisor.remote.http import AnswerTooLong, ResponseTooLarge
from supervisor.remote.traffic import STREAM_CUT, failure
from supervisor.upstream.raw import PREFIX, Waiter, cancel_notification, encode, request_line

__all__ = ("MAX_IN_FLIGHT", "RemoteCalls")

log = structlog.get_logger(__name__)

MAX_IN_FLIGHT = 64  # raw calls of one run at once (a POST each); past it the SDK's path serves
CANCEL_LIMIT = 5.0  # seconds to deliver a cancel notification of an abandoned call

Passed = Callable[[dict[str, Any]], Awaitable[None]]  # another message of a stream, to the session
Spooled = Callable[[dict[str, Any], int], Awaitable[None]]  # an answer and its size: media to the spool


class RemoteCalls:
    """The raw calls in flight on one run's streamable-HTTP session.

    *client* and *url* are the run's (:func:`supervisor.remote.http.transport`); *headers* the
    session's (its id and protocol version); POSTs run in *tasks*, cancelled when the session
    ends. *passed* takes every other message a call's stream carries; *spooled* the answer
    before its caller sees it; *failed* ends the run (a broken connection), with why; *sent*
    (the spool's) sees each request before it goes.
    """

    def __init__(
        self,
        client: httpx2.AsyncClient,
        url: str,
        headers: dict[str, str],
        tasks: TaskGroup,
        *,
        passed: Passed,
        spooled: Spooled,
        failed: Callable[[str], None],
        sent: Callable[[str, str, Any], None] | None = None,
    ) -> None:
        self._client, self._url, self._tasks = client, url, tasks
        self._headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        self._headers.update(headers)
        self._passed, self._spooled, self._failed, self._sent = passed, spooled, failed, sent
        self._ids = itertools.count(1)
        self._waiting: dict[str, Waiter] = {}
        self._posts: dict[str, anyio.CancelScope] = {}
        self._cancels = 0  # cancel notifications on their way
        self._closed = False
        self.resumable = False  # a stream carried an event id: the SDK's transport serves from now on

    def __len__(self) -> int:
        return len(self._waiting)

    def send_now(self, method: str, params: dict[str, Any], notify: Callable[[Waiter], None]) -> str | None:
        if self._closed or self.resumable or len(self._posts) >= MAX_IN_FLIGHT:
            return None
        request_id = f"{PREFIX}{next(self._ids)}"
        body = request_line(request_id, method, params, self._sent)
        scope = anyio.CancelScope()
        try:
            self._tasks.start_soon(self._post, request_id, body, scope)
        except RuntimeError:  # the session is leaving (its tasks are done): the run ends next
            return None
        self._waiting[request_id], self._posts[request_id] = Waiter(notify), scope
        return request_id

    def forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)

    def abandon(self, request_id: str) -> None:
        waiter = self._waiting.pop(request_id, None)
        post = self._posts.pop(request_id, None)
        if post is not None:
            post.cancel()  # its stream closed; the notification below is what the spec reads as cancel
        if waiter is None or waiter.answer is not None or waiter.closed or self._closed:
            return
        if self._cancels < MAX_IN_FLIGHT:  # past that, a flood of cancels: the closed stream must do
            with contextlib.suppress(RuntimeError):  # the session is leaving: nothing to cancel in
                self._tasks.start_soon(self._cancel, request_id)
                self._cancels += 1

    def close(self) -> None:
        """The run ended: every call in flight fails with ``CONNECTION_CLOSED`` (its owner told)."""
        self._closed = True
        for waiter in list(self._waiting.values()):
            waiter.closed = True
            waiter.wake()

    async def _post(self, request_id: str, body: bytes, scope: anyio.CancelScope) -> None:
        error: tuple[int, str] | None = None
        try:
            with scope:
                async with self._client.stream(
                    "POST", self._url, content=body, headers=self._headers
                ) as response:
                    error = await self._read(request_id, response)
        except (ResponseTooLarge, AnswerTooLong) as exc:  # this call's answer alone
            error = (types.CONNECTION_CLOSED, first_line(exc, typed=False))
        except httpx2.TransportError as exc:  # the server is gone: the run ends, every call with it
            self._failed(failure(exc))
        except httpx2.HTTPError as exc:  # a body in a coding it does not decode: this answer alone
            error = (types.CONNECTION_CLOSED, f"its answer is unreadable: {first_line(exc, typed=False)}")
        except Exception as exc:
            if not self._closed:  # else the run ended meanwhile (a login it wants): its calls told
                log.exception("extension.raw_call_crashed")  # a bug of ours must not end the run's tasks
                error = (types.INTERNAL_ERROR, f"the call failed in the gateway: {first_line(exc)}")
        finally:
            if self._posts.get(request_id) is scope:
                del self._posts[request_id]
        if error is not None:
            self._answer(request_id, {"error": {"code": error[0], "message": error[1]}})

    async def _read(self, request_id: str, response: httpx2.Response) -> tuple[int, str] | None:
        """Read *response* to the end of its answer (given to the waiter); an error for the
        call when there is no answer in it."""
        status = response.status_code
        content_type = response.headers.get("content-type", "").lower()
        if status == 202 or 300 <= status < 400:
            what = "202 Accepted" if status == 202 else f"a redirect ({status}), not followed"
            return types.INVALID_REQUEST, f"the server answered a request with {what}"
        if content_type.startswith("application/json"):
            error = await self._read_body(request_id, response)
            if error is None or status < 400:
                return error
        if status >= 400:
            if status == 404:  # the session is gone (the run ends as this is read) or the method
                return types.INVALID_REQUEST, "Session terminated"
            return types.INTERNAL_ERROR, f"the server answered HTTP {status}"
        if not content_type.startswith("text/event-stream"):
            return types.INVALID_REQUEST, f"the server answered in {content_type or 'no content type'}"
        return await self._read_events(request_id, response)

    async def _read_body(self, request_id: str, response: httpx2.Response) -> tuple[int, str] | None:
        """A JSON answer: given to the waiter, or an error for the call."""
        body = await response.aread()
        answer = _parsed(body)
        if _answers(answer, request_id):
            await self._spooled(answer, len(body))
            self._answer(request_id, answer)
            return None
        if isinstance(answer, dict) and answer.get("id") is None and isinstance(answer.get("error"), dict):
            self._answer(request_id, answer)  # an error for a request whose id it did not read
            return None
        return types.PARSE_ERROR, "the server's answer is not JSON-RPC for the request"

    async def _read_events(self, request_id: str, response: httpx2.Response) -> tuple[int, str] | None:
        """An event stream up to the answer; the rest of what it carries to the session."""
        async for event in httpx2.EventSource(response, max_event_size=None):  # bounded by the client
            if event.id:
                self.resumable = True
            if event.event != "message" or not event.data:
                continue
            message = _parsed(event.data)
            if not isinstance(message, dict):
                log.warning("extension.bad_message", error="an event that is not a JSON object")
            elif _answers(message, request_id):
                await self._spooled(message, len(event.data))
                self._answer(request_id, message)
                return None
            elif not self._progress(request_id, message):
                await self._passed(message)
        if self.resumable:
            self._failed(STREAM_CUT)  # as the SDK's transport would end it, had it given up resuming
        return types.CONNECTION_CLOSED, STREAM_CUT

    def _progress(self, request_id: str, message: dict[str, Any]) -> bool:
        """Whether *message* is progress of this call (told to its waiter)."""
        if message.get("method") != "notifications/progress" or "id" in message:
            return False
        params = message.get("params")
        if not isinstance(params, dict) or params.get("progressToken") != request_id:
            return False
        if (waiter := self._waiting.get(request_id)) is not None:
            waiter.report(params)
        return True

    def _answer(self, request_id: str, answer: dict[str, Any]) -> None:
        waiter = self._waiting.get(request_id)
        if waiter is not None and waiter.answer is None and not waiter.closed:
            waiter.answer = answer
            waiter.wake()

    async def _cancel(self, request_id: str) -> None:
        try:
            with anyio.move_on_after(CANCEL_LIMIT), contextlib.suppress(httpx2.HTTPError):
                body = encode(cancel_notification(request_id))
                async with self._client.stream("POST", self._url, content=body, headers=self._headers):
                    pass
        finally:
            self._cancels -= 1


def _answers(message: Any, request_id: str) -> bool:
    """Whether *message* is the answer to *request_id*."""
    return isinstance(message, dict) and message.get("id") == request_id and "method" not in message


def _parsed(text: bytes | str) -> Any:
    """Plain JSON, as the session's parser reads it; None for what is not."""
    try:
        return pydantic_core.from_json(text)
    except ValueError:
        return None
