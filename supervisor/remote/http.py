"""The HTTP client one remote run talks through: verified, bounded, and never a redirect away.

Every byte a remote server sends is bounded before anything parses it: a JSON answer by
``max_message_bytes`` in all, an event stream by ``max_message_bytes`` per event (the bytes
since its last blank line), so a hostile or broken server costs at most that much memory. A
compressed answer is decoded first, so the bound counts what it decodes to.
HTTPS is verified against the system's trust store; the MCP transports themselves follow a
redirect only within the endpoint's origin, so the configured headers never leave it.

The answer to a POST (a request's, or our answer to the server's own request) is bounded in
time as well (:mod:`.deadlines`). Once a request is cancelled (``notifications/cancelled``
posted for its id: a call's budget ran out, or its client left), its answer is given up at
once, headers or stream; and any is given up past the longest it may be waited for. A
server that stalls an answer, or streams one without end, would otherwise hold a connection
and a task, and in the second case a core, until the run ends. (A given-up answer of ours
ends the run: the SDK's transport stops there.)

With a run's *diversions*, a JSON answer or event stream passes through their scanner as it
comes: a long ``data``/``blob`` string goes to a file instead of memory, and is spooled or put
back once the message is parsed (:mod:`supervisor.upstream.diverted`).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import anyio
import httpx2
from httpx2._decoders import SUPPORTED_DECODERS, MultiDecoder  # httpx's own, bounded per step
from httpx2._utils import get_environment_proxies  # httpx's own reading of *_PROXY and NO_PROXY
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from supervisor.remote.deadlines import AnswerTimes, Deadline, Deadlines, Post, TimeUp
from supervisor.upstream.diverted import Diversions
from supervisor.upstream.scan import Scanner

__all__ = ("MAX_CONNECTIONS", "AnswerTooLong", "ResponseTooLarge", "Watch", "client", "transport")

MAX_CONNECTIONS = 64  # per run: each call in flight may hold one (its answer's event stream)
# Besides them, for what the server answers at once (pings, our answers to its questions,
# cancels, notifications): no number of long calls makes a ping wait for a connection.
MAX_PROMPT_CONNECTIONS = 16
CONNECT_TIMEOUT = 10.0  # a TCP and TLS handshake; the call's own budget bounds the rest


class Watch(Protocol):
    """What a run hears of its HTTP traffic, before the transports act on it (sync, quick)."""

    def answered(self, request: httpx2.Request, status: int) -> None: ...

    def failed(self, error: httpx2.TransportError) -> None: ...


class ResponseTooLarge(httpx2.StreamError, httpx2.SSEError):
    """A server's answer (or one event of its stream) went over the run's byte limit: an error
    of the stream, so the transports fail only the request it answered (an HTTP+SSE connection's
    one stream: all of them)."""


class AnswerTooLong(httpx2.StreamError, httpx2.SSEError):
    """The answer to a request went on past its deadline (stalled, or streaming without end):
    an error of that request's stream only, as :class:`ResponseTooLarge`."""


def client(
    headers: Mapping[str, str],
    *,
    max_message_bytes: int,
    watch: Watch | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
    answer_times: AnswerTimes | None = None,
    diversions: Diversions | None = None,
) -> httpx2.AsyncClient:
    """A client for one run: *headers* on every request, answers bounded by *max_message_bytes*
    (and a POST's in time by *answer_times*);
    *watch* sees each response before anyone reads it, and each failure of the network; *auth*
    (an OAuth login, :mod:`supervisor.remote.auth`) signs each request.

    Reads have no deadline of their own: a call's budget (``call_timeout``) and the liveness
    pings bound every wait, and an event stream may rightly stay quiet for minutes. The
    environment's proxies (``HTTPS_PROXY``, ``NO_PROXY``, ...) are honoured; its ``.netrc`` is
    not read: a daemon's credentials come from its config.
    """

    verify = ssl.create_default_context()

    def bounded(proxy: str | None = None) -> httpx2.AsyncBaseTransport:
        def pool(connections: int, kept: int) -> httpx2.AsyncHTTPTransport:
            limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=kept)
            return httpx2.AsyncHTTPTransport(verify=verify, limits=limits, proxy=proxy)

        pools = (pool(MAX_CONNECTIONS, 8), pool(MAX_PROMPT_CONNECTIONS, 2))
        return _Bounded(pools, max_message_bytes, watch, answer_times, diversions)

    proxies = get_environment_proxies()
    return httpx2.AsyncClient(
        headers=dict(headers),
        auth=auth,
        timeout=timeout or httpx2.Timeout(CONNECT_TIMEOUT, read=None, pool=None),
        transport=bounded(),
        mounts={pattern: None if proxy is None else bounded(proxy) for pattern, proxy in proxies.items()},
        trust_env=False,
        follow_redirects=False,
    )


@asynccontextmanager
async def transport(
    kind: str,
    url: str,
    headers: Mapping[str, str],
    *,
    watch: Watch | None,
    auth: httpx2.Auth | None,
    max_message_bytes: int,
    answer_times: AnswerTimes | None,
    diversions: Diversions | None = None,
) -> AsyncIterator[tuple[Any, Any, httpx2.AsyncClient | None]]:
    """The SDK's transport of *kind* (``http``: streamable HTTP, ``sse``: HTTP+SSE) to *url* over
    a :func:`client` of these bounds: its read and write streams, and (streamable HTTP) the
    client it posts with, which a run's raw calls share (:mod:`supervisor.remote.rawcalls`)."""
    bounds: dict[str, Any] = {
        "watch": watch,
        "auth": auth,
        "max_message_bytes": max_message_bytes,
        "answer_times": answer_times,
        "diversions": diversions,
    }
    async with client(headers, **bounds) as http:
        opened: AbstractAsyncContextManager[Any]
        if kind == "sse":
            opened = sse_client(
                url, httpx_client_factory=lambda **_: client(headers, **bounds), sse_read_timeout=86_400
            )
        else:
            opened = streamable_http_client(url, http_client=http, max_sse_event_size=max_message_bytes)
        async with opened as (read, write):
            yield read, write, None if kind == "sse" else http


class _Bounded(httpx2.AsyncBaseTransport):
    """A transport whose response bodies stop at the byte limit (see the module)."""

    def __init__(
        self,
        pools: tuple[httpx2.AsyncBaseTransport, httpx2.AsyncBaseTransport],
        limit: int,
        watch: Watch | None,
        answer_times: AnswerTimes | None,
        diversions: Diversions | None = None,
    ) -> None:
        self._pools, self._limit, self._watch = pools, limit, watch
        self._deadlines = Deadlines(answer_times) if answer_times is not None else None
        self._diversions = diversions

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """*request* on the pool of calls (a GET stream, a request that may take long), or on
        the one for what the server answers at once; its answer bounded."""
        calls, prompt = self._pools
        if request.method == "GET":  # the session's stream, which may rightly last
            return await self._answered(calls, request, None)
        if request.method != "POST":  # the session's DELETE
            return await self._answered(prompt, request, None)
        post = Post.read(request)
        pool = calls if post.may_take_long else prompt
        if self._deadlines is None:
            return await self._answered(pool, request, None)
        deadline, forget = self._deadlines.posted(post)
        try:
            response = await self._answered(pool, request, deadline)
        except BaseException:
            forget()
            raise
        assert isinstance(response.stream, _Limited | _Diverting)
        response.stream.on_close = forget
        return response

    async def _answered(
        self, pool: httpx2.AsyncBaseTransport, request: httpx2.Request, deadline: Deadline | None
    ) -> httpx2.Response:
        """*request*'s response through *pool*, its body bounded (and, with a *deadline*, in time)."""
        try:
            if deadline is None:
                response = await pool.handle_async_request(request)
            else:
                response = await deadline.wait(pool.handle_async_request(request))
        except httpx2.TransportError as exc:
            if self._watch is not None:
                self._watch.failed(exc)
            raise
        except TimeUp:  # not even its headers: a server that takes and never answers
            raise AnswerTooLong("the server did not answer within the time the request had") from None
        if self._watch is not None:
            self._watch.answered(request, response.status_code)
        content_type = response.headers.get("content-type", "").lower()
        events = content_type.startswith("text/event-stream")
        stream = _decoded(response)
        limited = _Limited(stream, self._limit, per_event=events, watch=self._watch, deadline=deadline)
        json = content_type.startswith("application/json")
        plain = "content-encoding" not in response.headers  # else in a coding we do not decode
        if self._diversions is not None and plain and (events or json):
            response.stream = _Diverting(limited, self._diversions.scanner())
        else:
            response.stream = limited
        return response

    async def aclose(self) -> None:
        calls, prompt = self._pools
        try:
            await calls.aclose()
        finally:
            await prompt.aclose()


def _decoded(response: httpx2.Response) -> httpx2.AsyncByteStream:
    """*response*'s body, decoded here if it is compressed (gzip, deflate), so that the bounds
    count what it decodes to: a small gzip can hold gigabytes. The decoders are httpx's own,
    which yield at most 1 MiB at a time; httpx then decodes nothing more."""
    stream = response.stream
    assert isinstance(stream, httpx2.AsyncByteStream)
    named = response.headers.get_list("content-encoding", split_commas=True)
    codings = [coding for coding in (name.strip().lower() for name in named) if coding != "identity"]
    if not codings:
        response.headers.pop("content-encoding", None)
        return stream
    if not all(coding in SUPPORTED_DECODERS for coding in codings):
        return stream  # httpx passes it on as it is, unread by us
    del response.headers["content-encoding"]
    return _Decoding(stream, MultiDecoder(codings))


class _Decoding(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, decoder: MultiDecoder) -> None:
        self._inner, self._decoder = inner, decoder

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            for decoded in self._decoder.decode(chunk):
                yield decoded
        for decoded in self._decoder.flush():
            if decoded:
                yield decoded

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Diverting(httpx2.AsyncByteStream):
    """A stream through a scanner: long strings to their files, the rest on as it comes."""

    def __init__(self, inner: _Limited, scanner: Scanner) -> None:
        self._inner, self._scanner = inner, scanner

    @property
    def on_close(self) -> Callable[[], None] | None:
        return self._inner.on_close

    @on_close.setter
    def on_close(self, hook: Callable[[], None] | None) -> None:
        self._inner.on_close = hook

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                if passed := self._scanner.feed(chunk):
                    yield passed
        finally:
            self._scanner.close()  # a string broken off is ended (its file goes with the run)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Limited(httpx2.AsyncByteStream):
    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limit: int,
        *,
        per_event: bool,
        watch: Watch | None,
        deadline: Deadline | None = None,
    ) -> None:
        self._inner, self._limit, self._per_event, self._watch = inner, limit, per_event, watch
        self._deadline = deadline
        self.on_close: Callable[[], None] | None = None  # the answer is read, or given up

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks():
                yield chunk
        except httpx2.TransportError as exc:
            if self._watch is not None:
                self._watch.failed(exc)  # the server went away mid-answer, or sent too much
            raise
        finally:
            self._closed()

    def _closed(self) -> None:
        hook, self.on_close = self.on_close, None
        if hook is not None:
            hook()

    async def _chunks(self) -> AsyncIterator[bytes]:
        pending = 0  # bytes of the current event (per_event), or of the whole body
        tail = b""  # the last bytes of the previous chunk: a blank line may straddle two
        async for chunk in self._in_time():
            if self._per_event:
                seen = tail + chunk
                end = max(seen.rfind(b"\n\n"), seen.rfind(b"\r\n\r\n"), seen.rfind(b"\r\r"))
                pending = len(seen) - end if end >= 0 else pending + len(chunk)
                tail = seen[-3:]
            else:
                pending += len(chunk)
            if pending > self._limit:
                what = "one event of its stream" if self._per_event else "its answer"
                raise ResponseTooLarge(f"the server sent over {self._limit} bytes in {what}")
            yield chunk

    async def _in_time(self) -> AsyncIterator[bytes]:
        """The inner stream's chunks, until the deadline (if any): past it, or once the request
        is cancelled, :class:`AnswerTooLong`."""
        deadline = self._deadline
        if deadline is None:
            async for chunk in self._inner:
                yield chunk
            return
        chunks = aiter(self._inner)
        while True:
            try:
                chunk = await deadline.wait(anext(chunks))
            except StopAsyncIteration:
                return
            except TimeUp:
                chunk = None
            if chunk is None or deadline.cut_off or anyio.current_time() >= deadline.at:
                why = "its request was cancelled" if deadline.cut_off else "it went on past the time it had"
                raise AnswerTooLong(f"the server's answer was given up: {why}")
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._closed()
