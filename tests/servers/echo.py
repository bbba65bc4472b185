"""Realistic fixture: a real SDK server (lowlevel ``Server`` over ``stdio_server()``).

Slow to start (imports the mcp SDK, about 1 s); use ``quick.py`` where only speed matters.
Tools: ``echo(text)``, ``sleep(seconds)``, ``crash(code=3)``, ``fail()`` (raises),
``toggle_tool()`` (adds/removes ``extra`` and sends ``tools/list_changed``),
``big_text(bytes)``, ``stderr(lines)``, ``pid()``. Writes "echo: ready" to stderr at startup.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.stdio import stdio_server


def _tool(
    name: str, description: str, properties: dict[str, Any] | None = None, *required: str
) -> types.Tool:
    schema: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:
        schema["required"] = list(required)
    return types.Tool(name=name, description=description, input_schema=schema)


BASE_TOOLS = (
    _tool("echo", "Echo text back.", {"text": {"type": "string"}}, "text"),
    _tool("sleep", "Sleep, then answer 'slept'.", {"seconds": {"type": "number"}}, "seconds"),
    _tool("crash", "Exit at once with a code.", {"code": {"type": "integer"}}),
    _tool("fail", "Raise RuntimeError('boom')."),
    _tool("toggle_tool", "Add or remove the 'extra' tool and send tools/list_changed."),
    _tool("big_text", "One text block of N 'x' characters.", {"bytes": {"type": "integer"}}, "bytes"),
    _tool("stderr", "Write N numbered lines to stderr.", {"lines": {"type": "integer"}}, "lines"),
    _tool("pid", "This server's pid."),
)
EXTRA_TOOL = _tool("extra", "Present only while toggled on.")


class _State:
    extra_enabled = False


def _text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


def _log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


async def list_tools(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """The base tools, plus ``extra`` while it is toggled on."""
    tools = [*BASE_TOOLS, EXTRA_TOOL] if _State.extra_enabled else list(BASE_TOOLS)
    return types.ListToolsResult(tools=tools)


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    """Dispatch one tool call by name."""
    args = params.arguments or {}
    match params.name:
        case "echo":
            return _text(str(args["text"]))
        case "sleep":
            await anyio.sleep(float(args["seconds"]))
            return _text("slept")
        case "crash":
            _log("echo: crashing")
            os._exit(int(args.get("code", 3)))
        case "fail":
            raise RuntimeError("boom")
        case "toggle_tool":
            _State.extra_enabled = not _State.extra_enabled
            await ctx.session.send_tool_list_changed()
            return _text(f"extra={_State.extra_enabled}")
        case "big_text":
            return _text("x" * int(args["bytes"]))
        case "stderr":
            for i in range(int(args["lines"])):
                sys.stderr.write(f"echo: stderr line {i + 1}\n")
            sys.stderr.flush()
            return _text(f"wrote {int(args['lines'])} lines")
        case "pid":
            return _text(str(os.getpid()))
        case "extra" if _State.extra_enabled:
            return _text("extra")
    return types.CallToolResult(
        content=[types.TextContent(text=f"unknown tool {params.name}")], is_error=True
    )


server = Server("echo", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    """Serve on stdio until stdin closes."""
    _log("echo: ready")
    async with stdio_server() as (read, write):
        await server.run(
            read, write, server.create_initialization_options(NotificationOptions(tools_changed=True))
        )


if __name__ == "__main__":
    anyio.run(main)
