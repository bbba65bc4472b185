"""Fixture: a real SDK server offering every kind of thing the gateway forwards.

Tools: ``echo(text)``, ``progress(steps, interval=0)`` (reports 1..steps, then answers), ``wait(seconds)``
(sleeps; writes "rich: cancelled" to stderr when cancelled), ``log(level, message, count=1)`` (that
many log notifications, then "logged"), ``touch(uri)`` (sends resources/updated if subscribed),
``image(bytes)`` (one PNG-typed image of that many bytes), ``link()`` (a resource link and an embedded
resource), ``crash()``, ``request()`` (the JSON-RPC id it was called with).
Prompts: ``greet(name)``. Resources: ``note://a``, ``note://b`` (each subscription is written to
stderr as "rich: subscribed URI", each unsubscription as "rich: unsubscribed URI"; a subscribe to
``note://hang...`` is never answered); template ``note://{id}``;
completion for the ``greet`` prompt's ``name`` argument. ``RICH_TOOL_PREFIX`` renames the tools
(for collision tests).
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.stdio import stdio_server

PREFIX = os.environ.get("RICH_TOOL_PREFIX", "")
NOTES = {"a": "note A", "b": "note B"}
SUBSCRIBED: set[str] = set()


def _tool(name: str, properties: dict[str, Any] | None = None, **extra: Any) -> types.Tool:
    schema = {"type": "object", "properties": properties or {}}
    return types.Tool(name=PREFIX + name, description=f"The {name} tool.", input_schema=schema, **extra)


TOOLS = [
    _tool(
        "echo",
        {"text": {"type": "string"}},
        title="Echo",
        output_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    _tool("progress", {"steps": {"type": "integer"}, "interval": {"type": "number"}}),
    _tool("wait", {"seconds": {"type": "number"}}),
    _tool("log", {"level": {"type": "string"}, "message": {"type": "string"}, "count": {"type": "integer"}}),
    _tool("touch", {"uri": {"type": "string"}}),
    _tool("image", {"bytes": {"type": "integer"}}),
    _tool("link"),
    _tool("crash"),
    _tool("request"),
]


def _text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


async def list_tools(ctx: ServerRequestContext, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    name = params.name.removeprefix(PREFIX)
    if name == "echo":
        return types.CallToolResult(
            content=[types.TextContent(text=str(args["text"]))],
            structured_content={"text": str(args["text"])},
        )
    if name == "progress":
        steps, interval = int(args.get("steps", 3)), float(args.get("interval", 0))
        for step in range(1, steps + 1):
            await anyio.sleep(interval)
            await ctx.session.report_progress(step, steps, f"step {step}")
        return _text(f"did {steps} steps")
    if name == "wait":
        try:
            await anyio.sleep(float(args["seconds"]))
        except anyio.get_cancelled_exc_class():
            sys.stderr.write("rich: cancelled\n")
            sys.stderr.flush()
            raise
        return _text("waited")
    if name == "log":
        for _ in range(int(args.get("count", 1))):
            await ctx.session.send_log_message(
                args.get("level", "info"), args.get("message", ""), logger="fixture"
            )
        return _text("logged")
    if name == "touch":
        if str(args["uri"]) in SUBSCRIBED:  # like a real server: updates only for subscriptions
            await ctx.session.send_resource_updated(str(args["uri"]))
        return _text("touched")
    if name == "image":
        data = b"\x89PNG\r\n\x1a\n" + b"\0" * max(0, int(args["bytes"]) - 8)
        image = types.ImageContent(data=base64.b64encode(data).decode(), mime_type="image/png")
        return types.CallToolResult(content=[types.TextContent(text="an image"), image])
    if name == "link":
        link = types.ResourceLink(uri="note://a", name="note-a", mime_type="text/plain")
        embedded = types.EmbeddedResource(resource=types.TextResourceContents(uri="note://b", text="note B"))
        return types.CallToolResult(content=[link, embedded])
    if name == "crash":
        os._exit(3)
    if name == "request":  # how the request reached us: its id tells the gateway's path apart
        return _text(json.dumps({"id": ctx.request_id}))
    return types.CallToolResult(
        content=[types.TextContent(text=f"unknown tool {params.name}")], is_error=True
    )


async def list_prompts(ctx: ServerRequestContext, params: Any) -> types.ListPromptsResult:
    argument = types.PromptArgument(name="name", description="Who to greet.", required=True)
    return types.ListPromptsResult(
        prompts=[types.Prompt(name="greet", description="Greet someone.", arguments=[argument])]
    )


async def get_prompt(
    ctx: ServerRequestContext, params: types.GetPromptRequestParams
) -> types.GetPromptResult:
    if params.name != "greet":
        raise ValueError(f"no prompt {params.name}")
    who = (params.arguments or {}).get("name", "world")
    message = types.PromptMessage(role="user", content=types.TextContent(text=f"Hello, {who}!"))
    return types.GetPromptResult(description="A greeting.", messages=[message])


async def list_resources(ctx: ServerRequestContext, params: Any) -> types.ListResourcesResult:
    resources = [
        types.Resource(uri=f"note://{key}", name=f"note-{key}", mime_type="text/plain") for key in NOTES
    ]
    return types.ListResourcesResult(resources=resources)


async def list_templates(ctx: ServerRequestContext, params: Any) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(uri_template="note://{id}", name="note")
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(
    ctx: ServerRequestContext, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    key = str(params.uri).removeprefix("note://")
    text = NOTES.get(key, f"note {key} (made up)")
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=str(params.uri), text=text)])


async def subscribe(ctx: ServerRequestContext, params: types.SubscribeRequestParams) -> types.EmptyResult:
    if str(params.uri).startswith("note://hang"):
        await anyio.sleep_forever()  # a child that never answers this subscribe
    SUBSCRIBED.add(str(params.uri))
    sys.stderr.write(f"rich: subscribed {params.uri}\n")
    sys.stderr.flush()
    return types.EmptyResult()


async def unsubscribe(ctx: ServerRequestContext, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIBED.discard(str(params.uri))
    sys.stderr.write(f"rich: unsubscribed {params.uri}\n")
    sys.stderr.flush()
    return types.EmptyResult()


async def complete(ctx: ServerRequestContext, params: types.CompleteRequestParams) -> types.CompleteResult:
    prefix = params.argument.value
    names = [n for n in ("alice", "albert", "bob") if n.startswith(prefix)]
    return types.CompleteResult(completion=types.Completion(values=names, total=len(names)))


server = Server(
    "rich",
    version="0.1.0",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_completion=complete,
)


async def main() -> None:
    sys.stderr.write("rich: ready\n")
    sys.stderr.flush()
    options = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(options))


if __name__ == "__main__":
    anyio.run(main)
