"""Stands in for the daemon's gateway socket: a real SDK server on a unix socket.

``socket_server.py PATH``: a lowlevel ``Server`` (both protocol eras), one MCP session per
connection, newline-delimited JSON-RPC. A stale socket file at PATH is replaced, so it can be
killed and started again on the same path. Prints ``listening <pid>`` on stdout once it accepts,
and ``call <tool>`` on stderr as each tool call starts.

Tools: ``echo(text)``, ``slow(seconds)`` (sleeps, then answers ``done``), ``big(bytes)`` (one text
block of N ``x``), ``pid()``. One prompt (``greet``) and one resource, so all three lists exist.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.message import SessionMessage

MAX_LINE = 256 << 20


def _tool(name: str, description: str, properties: dict[str, Any] | None = None) -> types.Tool:
    schema = {"type": "object", "properties": properties or {}}
    return types.Tool(name=name, description=description, input_schema=schema)


TOOLS = [
    _tool("echo", "Echo text back.", {"text": {"type": "string"}}),
    _tool("slow", "Sleep, then answer 'done'.", {"seconds": {"type": "number"}}),
    _tool("big", "One text block of N 'x'.", {"bytes": {"type": "integer"}}),
    _tool("pid", "This server's pid."),
]


def _text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


async def list_tools(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    print(f"call {params.name}", file=sys.stderr, flush=True)  # tests wait for this line
    match params.name:
        case "echo":
            return _text(str(args.get("text", "")))
        case "slow":
            await anyio.sleep(float(args.get("seconds", 1)))
            return _text("done")
        case "big":
            return _text("x" * int(args["bytes"]))
        case "pid":
            return _text(str(os.getpid()))
    return types.CallToolResult(
        content=[types.TextContent(text=f"unknown tool {params.name}")], is_error=True
    )


async def list_prompts(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="greet", description="Say hello.")])


async def list_resources(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(uri="fixture://one", name="one")])


server = Server(
    "socket-fixture",
    version="0.1.0",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_prompts=list_prompts,
    on_list_resources=list_resources,
    on_subscriptions_listen=ListenHandler(InMemorySubscriptionBus()),
)
OPTIONS = server.create_initialization_options(
    NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
)


async def _session(stream: anyio.abc.SocketStream) -> None:
    """One MCP session over one connection, until the client hangs up."""
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    lines = BufferedByteReceiveStream(stream)

    async def reader() -> None:
        async with read_send:
            while True:
                try:
                    line = await lines.receive_until(b"\n", MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                    return
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except Exception as exc:
                    await read_send.send(exc)
                    continue
                await read_send.send(SessionMessage(message))

    async def writer() -> None:
        async with write_recv:
            async for item in write_recv:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await stream.send(data.encode())

    async with stream, anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        await server.run(read_recv, write_send, OPTIONS)
        tg.cancel_scope.cancel()


async def main(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by an instance that was killed
    listener = await anyio.create_unix_listener(path, mode=0o600)
    print(f"listening {os.getpid()}", flush=True)
    await listener.serve(_session)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
