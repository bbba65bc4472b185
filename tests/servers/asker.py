"""Fixture: a real SDK server whose tools ask their client things mid-call.

Tools: ``elicit(message)`` (asks for ``{"answer": string}``), ``sample(prompt)`` (asks for a
completion), ``roots()`` (lists the client's roots), each answering with what came back, or
``error <code>: <message>`` (a tool error) when the request failed; ``later(delay)`` answers at
once and elicits *delay* seconds later, outside any call; ``wait(seconds)``; ``slow(delay,
message)`` elicits after *delay* seconds; ``stall(message)`` elicits, then says nothing more until
cancelled. Each outcome is also written to stderr as ``asker: <tool>
-> <outcome>``, and ``asker: roots changed`` when the client says its roots changed. With
``ASKER_IGNORE_CANCEL=1`` it ignores ``notifications/cancelled`` (MCP allows that): a cancelled
call goes on, asks, and is answered (``asker: cancel ignored`` on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import plain_asker  # its twin on the standard library: one list of what both offer
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

warnings.filterwarnings("ignore")  # sampling and roots are deprecated in 2026-07-28; still used here
SCHEMA = plain_asker.SCHEMA
TASKS: list[anyio.abc.TaskGroup] = []


TOOLS = [types.Tool.model_validate(tool) for tool in plain_asker.TOOLS]
PROMPTS = [types.Prompt.model_validate(prompt) for prompt in plain_asker.PROMPTS]


def say(line: str) -> None:
    print(f"asker: {line}", file=sys.stderr, flush=True)


async def list_tools(ctx: ServerRequestContext, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def list_prompts(ctx: ServerRequestContext, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


async def get_prompt(
    ctx: ServerRequestContext, params: types.GetPromptRequestParams
) -> types.GetPromptResult:
    text = await _ask(ctx, "elicit", dict(params.arguments or {}))
    say(f"confirm -> {text}")
    message = types.PromptMessage(role="user", content=types.TextContent(text=text))
    return types.GetPromptResult(messages=[message])


async def _both(ctx: ServerRequestContext, args: dict[str, Any]) -> str:
    outcomes: dict[str, str] = {}

    async def one(name: str) -> None:
        outcomes[name] = await _ask(ctx, name, args)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "elicit")
        tg.start_soon(one, "sample")
    return f"{outcomes['elicit']} | {outcomes['sample']}"


async def _work(ctx: ServerRequestContext, args: dict[str, Any]) -> str:
    answer = await _ask(ctx, "elicit", args)
    steps = int(args.get("steps", 3))
    for step in range(1, steps + 1):
        await anyio.sleep(0.05)
        await ctx.session.report_progress(step, steps, f"step {step}")
    return f"{answer}; worked {steps}"


async def _ask(ctx: ServerRequestContext, name: str, args: dict[str, Any], related: bool = True) -> str:
    if name == "both":
        return await _both(ctx, args)
    if name == "work":
        return await _work(ctx, args)
    request_id = ctx.request_id if related else None
    if name == "elicit":
        elicited = await ctx.session.elicit_form(str(args.get("message", "?")), SCHEMA, request_id)
        return f"{elicited.action} {json.dumps(elicited.content, sort_keys=True)}"
    if name == "sample":
        message = types.SamplingMessage(role="user", content=types.TextContent(text=str(args.get("prompt"))))
        sampled = await ctx.session.create_message([message], max_tokens=10, related_request_id=request_id)
        content = sampled.content
        return f"{sampled.model} {content.text if isinstance(content, types.TextContent) else content}"
    roots = await ctx.session.list_roots()
    return json.dumps([str(root.uri) for root in roots.roots])


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    name = params.name
    if name == "wait":
        await anyio.sleep(float(args.get("seconds", 1)))
        return types.CallToolResult(content=[types.TextContent(text="waited")])
    if name == "later":
        TASKS[0].start_soon(_later, ctx, float(args.get("delay", 0.2)))
        return types.CallToolResult(content=[types.TextContent(text="later")])
    if name == "slow":
        await anyio.sleep(float(args.get("delay", 1)))
        name = "elicit"
    if name == "stall":
        say(f"stall -> {await _ask(ctx, 'elicit', args)}, then silence")
        await anyio.sleep(3600)
    try:
        text, error = await _ask(ctx, name, args), False
    except MCPError as exc:
        text, error = f"error {exc.code}: {exc.message}", True
    except anyio.get_cancelled_exc_class():
        say(f"{params.name} -> cancelled")
        raise
    say(f"{params.name} -> {text}")
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=error)


async def _later(ctx: ServerRequestContext, delay: float) -> None:
    await anyio.sleep(delay)
    try:
        outcome = await _ask(ctx, "elicit", {"message": "later"}, related=False)
    except MCPError as exc:
        outcome = f"error {exc.code}: {exc.message}"
    say(f"later -> {outcome}")


async def roots_changed(ctx: ServerRequestContext, params: Any) -> None:
    say("roots changed")


async def main() -> None:
    server = Server(
        "asker",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_roots_list_changed=roots_changed,
    )
    async with anyio.create_task_group() as tg, stdio_server() as (read, write):
        TASKS.append(tg)
        if os.environ.get("ASKER_IGNORE_CANCEL"):
            read = _without_cancels(read, tg)
        await server.run(read, write, server.create_initialization_options())
        tg.cancel_scope.cancel()


def _without_cancels(read: Any, tg: anyio.abc.TaskGroup) -> Any:
    """*read* without the client's notifications/cancelled: the server never hears of them."""
    send, receive = anyio.create_memory_object_stream[Any](16)

    async def pump() -> None:
        async with send, read:
            async for item in read:
                message = getattr(item, "message", None)
                if getattr(message, "method", None) == "notifications/cancelled":
                    say("cancel ignored")
                    continue
                await send.send(item)

    tg.start_soon(pump)
    return receive


if __name__ == "__main__":
    anyio.run(main)
