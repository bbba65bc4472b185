"""Realistic fixture: a remote MCP server, the SDK's own, over HTTP on a loopback port.

``remote.py MODE [PORT [CERT KEY]]``: ``http`` (streamable HTTP, answers as event streams),
``json`` (streamable HTTP, answers as JSON), ``sse`` (the older HTTP+SSE transport: ``/sse`` and
``/messages/``). PORT 0 or none: a free one. With CERT and KEY (PEM files): HTTPS. Prints its
URL on stdout once it listens. Tools
as ``echo.py``'s (``echo``, ``sleep``, ``toggle_tool``, ``big_text``, ``pid``, ...), plus
``headers`` (the request's headers that start with ``x-``), ``sessions`` (how many sessions it
holds), ``forget`` (ends every session, so the next request of one is answered 404),
``answer_next(status)`` (the next POST is answered with that HTTP status, before the MCP app),
and the faults of a server that misbehaves mid-answer, each for the next POST: ``stall_next``
(an event stream that starts, then never sends another byte), ``flood_next(kind)`` (an event
stream without end: ``events``, log notifications as fast as it can; ``body``, one event whose
data never ends; ``gzip``, a JSON answer in gzip whose blanks never end; ``garbled``, one said to be gzip that
is not); and
``ping_flood(count)``: COUNT pings at once while every answer the client posts is stalled, as
a server that asks and never reads the answers. ``request_id`` (the call's JSON-RPC id),
``ask(prompt)`` (sampling, sent on the call's own stream) and ``cancelled`` (the ids of the
``sleep`` calls a cancel ended) show what a call's path did; ``work(seconds)`` reports progress
every 0.25 s for that long; ``together(count, seconds)`` waits for COUNT calls of it at once.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import warnings
import zlib
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
import uvicorn
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.sse import SseServerTransport
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

sys.path.insert(0, str(Path(__file__).parent))
import echo  # beside this file

EXTRA = (
    echo._tool("headers", "The request's x- headers, as JSON."),
    echo._tool("sessions", "How many sessions the server holds."),
    echo._tool("forget", "End every session: the next request of one is answered 404."),
    echo._tool("answer_next", "Answer the next POST with this HTTP status.", {"status": {"type": "integer"}}),
    echo._tool("redirect_next", "Answer the next POST with 307 to this URL.", {"url": {"type": "string"}}),
    echo._tool("stall_next", "Start the next POST's event stream, then send nothing more."),
    echo._tool("flood_next", "Answer the next POST with an endless stream.", {"kind": {"type": "string"}}),
    echo._tool(
        "ping_flood", "COUNT pings at once; the client's answers stalled.", {"count": {"type": "integer"}}
    ),
    echo._tool("image", "A PNG-typed image of N random bytes.", {"bytes": {"type": "integer"}}),
    echo._tool(
        "log", "Send a log message (info, logger 'remote') with this text.", {"text": {"type": "string"}}
    ),
    echo._tool("request_id", "The JSON-RPC id this call came with."),
    echo._tool(
        "ask", "Ask the client to sample this prompt (on the call's stream).", {"prompt": {"type": "string"}}
    ),
    echo._tool("cancelled", "The ids of the calls cancelled so far (sleep's), as JSON."),
    echo._tool(
        "work", "Report progress every 0.25 s for SECONDS, then answer.", {"seconds": {"type": "number"}}
    ),
    echo._tool(
        "together",
        "Wait until COUNT calls of it run at once (or SECONDS pass); say how many did.",
        {"count": {"type": "integer"}, "seconds": {"type": "number"}},
    ),
)
TOGETHER = {"now": 0, "most": 0}  # calls of `together` running, and the most at once
CANCELLED: list[str] = []  # ids of calls whose handler a cancel ended
FAULT: dict[str, Any] = {}  # "status" / "location": what the next POST is answered with
HEADERS: dict[str, str] = {}  # of the request being served (streamable HTTP)


async def list_tools(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    listed = await echo.list_tools(ctx, params)
    return types.ListToolsResult(tools=[*listed.tools, *EXTRA])


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    match params.name:
        case "request_id":
            return echo._text(str(ctx.request_id))
        case "ask":
            prompt = str((params.arguments or {})["prompt"])
            message = types.SamplingMessage(role="user", content=types.TextContent(text=prompt))
            sampled = await ctx.session.create_message(
                [message], max_tokens=10, related_request_id=ctx.request_id
            )
            content = sampled.content
            return echo._text(content.text if isinstance(content, types.TextContent) else "?")
        case "cancelled":
            return echo._text(json.dumps(CANCELLED))
        case "together":
            arguments = params.arguments or {}
            TOGETHER["now"] += 1
            TOGETHER["most"] = max(TOGETHER["most"], TOGETHER["now"])
            try:
                with anyio.move_on_after(float(arguments["seconds"])):
                    while TOGETHER["most"] < int(arguments["count"]):  # noqa: ASYNC110 - a fixture's poll
                        await anyio.sleep(0.05)
            finally:
                TOGETHER["now"] -= 1
            return echo._text(str(TOGETHER["most"]))
        case "work":
            steps = max(1, round(float((params.arguments or {})["seconds"]) / 0.25))
            for step in range(1, steps + 1):
                await anyio.sleep(0.25)
                await ctx.session.report_progress(step, steps)
            return echo._text("worked")
        case "sleep":
            try:
                return await echo.call_tool(ctx, params)
            except anyio.get_cancelled_exc_class():
                CANCELLED.append(str(ctx.request_id))
                raise
        case "headers":
            request = ctx.request
            seen = dict(request.headers) if request is not None else {}
            return echo._text(json.dumps({k: v for k, v in seen.items() if k.startswith("x-")}))
        case "sessions":
            manager = SERVER._session_manager
            return echo._text(str(len(manager._server_instances) if manager else -1))
        case "image":
            data = base64.b64encode(os.urandom(int((params.arguments or {})["bytes"]))).decode()
            return types.CallToolResult(content=[types.ImageContent(data=data, mime_type="image/png")])
        case "log":
            with warnings.catch_warnings():  # the logging capability is deprecated in 2026-07-28
                warnings.simplefilter("ignore")
                await ctx.session.send_log_message("info", (params.arguments or {})["text"], logger="remote")
            return echo._text("logged")
        case "redirect_next":
            FAULT["status"], FAULT["location"] = 307, str((params.arguments or {})["url"])
            return echo._text("armed")
        case "answer_next":
            FAULT["status"] = int((params.arguments or {})["status"])
            return echo._text("armed")
        case "stall_next":
            FAULT["stream"] = "stall"
            return echo._text("armed")
        case "ping_flood":
            FAULT["stall_answers"] = True
            answered = 0

            async def ping() -> None:
                nonlocal answered
                with anyio.move_on_after(1):
                    await ctx.session.send_ping()
                    answered += 1

            async with anyio.create_task_group() as pings:
                for _ in range(int((params.arguments or {})["count"])):
                    pings.start_soon(ping)
            FAULT.pop("stall_answers", None)
            return echo._text(f"answered {answered}")
        case "flood_next":
            FAULT["stream"] = str((params.arguments or {})["kind"])
            return echo._text("armed")
        case "forget":  # as a server restarted behind the same address: every session unknown
            SERVER._session_manager._server_instances.clear()
            return echo._text("forgotten")
    return await echo.call_tool(ctx, params)


class _Server(Server):
    def create_initialization_options(self, *args: Any, **kwargs: Any) -> Any:  # listChanged: true
        return super().create_initialization_options(NotificationOptions(tools_changed=True))


SERVER = _Server(  # its _session_manager: set by streamable_http_app()
    "remote", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool
)
APP = Starlette()


def _sse_app() -> Starlette:
    transport = SseServerTransport("/messages/")

    async def stream(request: Request) -> Response:
        async with transport.connect_sse(request.scope, request.receive, request._send) as (read, write):
            await SERVER.run(read, write, SERVER.create_initialization_options())
        return Response()

    return Starlette(
        routes=[
            Route("/sse", stream, methods=["GET"]),
            Mount("/messages/", app=transport.handle_post_message),
        ]
    )


class _Faults:
    """The MCP app, unless a fault is armed: then the next POST gets that status and no more."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and "stall_answers" in FAULT:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if b'"result"' in body and b'"method"' not in body:  # the client's answer: never taken
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
            replayed = iter([{"type": "http.request", "body": body, "more_body": False}])
            original = receive
            receive = lambda: _next_or(replayed, original)  # noqa: E731
        if scope["type"] == "http" and scope["method"] == "POST" and "stream" in FAULT:
            await _misbehave(FAULT.pop("stream"), receive, send)
            return
        if scope["type"] == "http" and scope["method"] == "POST" and "status" in FAULT:
            status, headers = FAULT.pop("status"), [(b"content-type", b"text/plain")]
            if "location" in FAULT:
                headers.append((b"location", FAULT.pop("location").encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": b"injected"})
            return
        await self.app(scope, receive, send)


async def _next_or(replayed: Any, receive: Any) -> Any:
    return next(replayed, None) or await receive()


async def _misbehave(kind: str, receive: Any, send: Any) -> None:
    """An event stream that stalls or never ends, until the client goes."""
    while (await receive()).get("more_body"):  # the request, read whole
        pass
    if kind == "gzip":
        await _gzip_bomb(send)
        return
    if kind == "garbled":  # said to be gzip, and not
        headers = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"not gzip at all"})
        return
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    log = {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": "info", "data": "x" * 200},
    }
    chunk = {
        "stall": b": the answer starts\n\n",
        "events": b"event: message\ndata: " + json.dumps(log).encode() + b"\n\n",
        "body": b"event: message\ndata: " + b"x" * 65536,
    }[kind]
    try:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        while kind != "stall":
            await anyio.lowlevel.checkpoint()  # as fast as it can, yet serving its other sessions
            await send(
                {
                    "type": "http.response.body",
                    "body": chunk if kind == "events" else b"y" * 65536,
                    "more_body": True,
                }
            )
        await anyio.sleep_forever()
    except OSError:  # the client went
        return


async def _gzip_bomb(send: Any) -> None:
    """A JSON answer in gzip that never ends: each 1 KiB sent decodes to 1 MiB of blanks."""
    headers = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    blanks = b" " * (1 << 20)
    chunk = packer.compress(b"{") + packer.flush(zlib.Z_SYNC_FLUSH)
    try:
        while True:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await anyio.lowlevel.checkpoint()
            chunk = packer.compress(blanks) + packer.flush(zlib.Z_SYNC_FLUSH)
    except OSError:  # the client went
        return


async def main(mode: str, port: int, tls: tuple[str, str] | None) -> None:
    global APP
    if mode == "sse":
        APP, path = _sse_app(), "/sse"
    else:
        APP = SERVER.streamable_http_app(json_response=mode == "json")
        path = "/mcp"
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    config = uvicorn.Config(
        _Faults(APP),
        log_level="warning",
        lifespan="on",
        **({"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}),
    )
    server = uvicorn.Server(config)
    server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
    scheme = "https" if tls else "http"
    print(f"{scheme}://127.0.0.1:{listener.getsockname()[1]}{path}", flush=True)
    await server.serve(sockets=[listener])


if __name__ == "__main__":
    tls = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else None
    anyio.run(main, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0, tls)
