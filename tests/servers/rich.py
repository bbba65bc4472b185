"""Fixture: a server offering every kind of thing the gateway forwards, on the standard library.

Tools: ``echo(text)``, ``progress(steps, interval=0)`` (reports 1..steps, then answers), ``wait(seconds)``
(sleeps; writes "rich: cancelled" to stderr when cancelled), ``log(level, message, count=1)`` (that
many log notifications, then "logged"), ``touch(uri)`` (sends resources/updated if subscribed),
``image(bytes)`` (one PNG-typed image of that many bytes), ``link()`` (a resource link and an embedded
resource), ``crash(code=3)``, ``request()`` (the JSON-RPC id it was called with), ``stderr(lines)``
(writes "rich: stderr line 1".. to stderr); and ``echo.py``'s others, so gateway tests need not
import the SDK: ``sleep(seconds)`` (answers "slept"), ``fail()`` (raises "boom"), ``big_text(bytes)``,
``pid()``, ``toggle_tool()`` (adds or removes ``extra`` and sends tools/list_changed).
Prompts: ``greet(name)``. Resources: ``note://a``, ``note://b`` (each subscription is written to
stderr as "rich: subscribed URI", each unsubscription as "rich: unsubscribed URI"; a subscribe to
``note://hang...`` is never answered); template ``note://{id}``;
completion for the ``greet`` prompt's ``name`` argument. ``RICH_TOOL_PREFIX`` renames the tools
(for collision tests).

It answers as the MCP SDK's lowlevel server does (handshake era: an exception in a handler is
error code 0 with its message; a cancelled request is answered "Request cancelled"), without
importing it: 2 s of CPU at each of the suite's ~170 starts of this fixture. Each request is
served in a thread of its own, so a ``wait`` or a hanging subscribe holds nothing else up; the
SDK's own servers are tested by ``echo.py``, ``asker.py`` (whose twin is ``plain_asker.py``),
``tasks.py`` and the interop group.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading

import _raw

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PREFIX = os.environ.get("RICH_TOOL_PREFIX", "")
NOTES = {"a": "note A", "b": "note B"}
SUBSCRIBED: set[str] = set()
PROTOCOLS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
CAPABILITIES = {
    "prompts": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
    "tools": {"listChanged": True},
    "completions": {},
}

_cancelled: dict[Any, threading.Event] = {}  # request id -> set when the client cancels it
_lock = threading.Lock()  # one whole line at a time on stdout; the table above


class Cancelled(Exception):
    pass


class NoSuchMethod(Exception):
    pass


def send(message: dict[str, Any]) -> None:
    with _lock:
        _raw.send(message)


def notify(method: str, params: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "method": method, "params": params})


def _tool(name: str, properties: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties or {}}
    return {"name": PREFIX + name, "description": f"The {name} tool.", "inputSchema": schema, **extra}


RESOURCES = [{"uri": f"note://{key}", "name": f"note-{key}", "mimeType": "text/plain"} for key in NOTES]
TEMPLATES = [{"uriTemplate": "note://{id}", "name": "note"}]
TOOLS = [
    _tool(
        "echo",
        {"text": {"type": "string"}},
        title="Echo",
        outputSchema={"type": "object", "properties": {"text": {"type": "string"}}},
        annotations={"readOnlyHint": True},
    ),
    _tool("progress", {"steps": {"type": "integer"}, "interval": {"type": "number"}}),
    _tool("wait", {"seconds": {"type": "number"}}),
    _tool("log", {"level": {"type": "string"}, "message": {"type": "string"}, "count": {"type": "integer"}}),
    _tool("touch", {"uri": {"type": "string"}}),
    _tool("image", {"bytes": {"type": "integer"}}),
    _tool("link"),
    _tool("crash", {"code": {"type": "integer"}}),
    _tool("request"),
    _tool("stderr", {"lines": {"type": "integer"}}),
    _tool("sleep", {"seconds": {"type": "number"}}),
    _tool("fail"),
    _tool("big_text", {"bytes": {"type": "integer"}}),
    _tool("pid"),
    _tool("toggle_tool"),
]
EXTRA = _tool("extra")
_extra_on = threading.Event()


def tools() -> list[dict[str, Any]]:
    return [*TOOLS, EXTRA] if _extra_on.is_set() else TOOLS


def _text(value: str) -> dict[str, Any]:
    return {"content": [_raw.text(value)], "isError": False}


def _sleep(seconds: float, cancel: threading.Event) -> None:
    if cancel.wait(seconds):
        raise Cancelled


def call_tool(params: dict[str, Any], request_id: Any, cancel: threading.Event) -> dict[str, Any]:
    args = params.get("arguments") or {}
    name = str(params.get("name", "")).removeprefix(PREFIX)
    if name == "echo":
        text = str(args["text"])
        return {"content": [_raw.text(text)], "structuredContent": {"text": text}, "isError": False}
    if name == "stderr":
        lines = int(args["lines"])
        sys.stderr.write("".join(f"rich: stderr line {n}\n" for n in range(1, lines + 1)))
        sys.stderr.flush()
        return _text(f"wrote {lines}")
    if name == "progress":
        steps, interval = int(args.get("steps", 3)), float(args.get("interval", 0))
        token = (params.get("_meta") or {}).get("progressToken")
        for step in range(1, steps + 1):
            _sleep(interval, cancel)
            if token is not None:
                said = {"progressToken": token, "progress": step, "total": steps, "message": f"step {step}"}
                notify("notifications/progress", said)
        return _text(f"did {steps} steps")
    if name == "sleep":
        _sleep(float(args["seconds"]), cancel)
        return _text("slept")
    if name == "wait":
        try:
            _sleep(float(args["seconds"]), cancel)
        except Cancelled:
            _raw.log("rich: cancelled")
            raise
        return _text("waited")
    if name == "log":
        for _ in range(int(args.get("count", 1))):
            level, data = args.get("level", "info"), args.get("message", "")
            notify("notifications/message", {"level": level, "logger": "fixture", "data": data})
        return _text("logged")
    if name == "touch":
        if str(args["uri"]) in SUBSCRIBED:  # like a real server: updates only for subscriptions
            notify("notifications/resources/updated", {"uri": str(args["uri"])})
        return _text("touched")
    if name == "image":
        data = b"\x89PNG\r\n\x1a\n" + b"\0" * max(0, int(args["bytes"]) - 8)
        image = {"type": "image", "data": _raw.Base64(data), "mimeType": "image/png"}
        return {"content": [_raw.text("an image"), image], "isError": False}
    if name == "link":
        link = {"type": "resource_link", "uri": "note://a", "name": "note-a", "mimeType": "text/plain"}
        embedded = {"type": "resource", "resource": {"uri": "note://b", "text": "note B"}}
        return {"content": [link, embedded], "isError": False}
    if name == "crash":
        os._exit(int(args.get("code", 3)))
    if name == "fail":
        raise RuntimeError("boom")
    if name == "big_text":
        return _text("x" * int(args["bytes"]))
    if name == "pid":
        return _text(str(os.getpid()))
    if name == "toggle_tool":
        if _extra_on.is_set():
            _extra_on.clear()
        else:
            _extra_on.set()
        notify("notifications/tools/list_changed", {})
        return _text(f"extra={_extra_on.is_set()}")
    if name == "extra" and _extra_on.is_set():
        return _text("extra")
    if name == "request":  # how the request reached us: its id tells the gateway's path apart
        return _text(json.dumps({"id": request_id}))
    return {"content": [_raw.text(f"unknown tool {params.get('name')}")], "isError": True}


def get_prompt(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("name") != "greet":
        raise ValueError(f"no prompt {params.get('name')}")
    who = (params.get("arguments") or {}).get("name", "world")
    message = {"role": "user", "content": _raw.text(f"Hello, {who}!")}
    return {"description": "A greeting.", "messages": [message]}


def read_resource(params: dict[str, Any]) -> dict[str, Any]:
    uri = str(params["uri"])
    key = uri.removeprefix("note://")
    return {"contents": [{"uri": uri, "text": NOTES.get(key, f"note {key} (made up)")}]}


def subscribe(params: dict[str, Any], cancel: threading.Event) -> dict[str, Any]:
    uri = str(params["uri"])
    if uri.startswith("note://hang"):
        cancel.wait()  # a child that never answers this subscribe
        raise Cancelled
    SUBSCRIBED.add(uri)
    _raw.log(f"rich: subscribed {uri}")
    return {}


def unsubscribe(params: dict[str, Any]) -> dict[str, Any]:
    SUBSCRIBED.discard(str(params["uri"]))
    _raw.log(f"rich: unsubscribed {params['uri']}")
    return {}


def complete(params: dict[str, Any]) -> dict[str, Any]:
    prefix = str((params.get("argument") or {}).get("value", ""))
    names = [n for n in ("alice", "albert", "bob") if n.startswith(prefix)]
    return {"completion": {"values": names, "total": len(names)}}


def initialize(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    return {
        "protocolVersion": asked if asked in PROTOCOLS else PROTOCOLS[0],
        "capabilities": CAPABILITIES,
        "serverInfo": {"name": "rich", "version": "0.1.0"},
    }


def answer(method: str, params: dict[str, Any], request_id: Any, cancel: threading.Event) -> dict[str, Any]:
    """The result of one request; raises as a handler of the SDK's server would."""
    handlers = {
        "initialize": lambda: initialize(params),
        "ping": lambda: {},
        "tools/list": lambda: {"tools": tools()},
        "tools/call": lambda: call_tool(params, request_id, cancel),
        "prompts/list": lambda: {
            "prompts": [
                {
                    "name": "greet",
                    "description": "Greet someone.",
                    "arguments": [{"name": "name", "description": "Who to greet.", "required": True}],
                }
            ]
        },
        "prompts/get": lambda: get_prompt(params),
        "resources/list": lambda: {"resources": RESOURCES},
        "resources/templates/list": lambda: {"resourceTemplates": TEMPLATES},
        "resources/read": lambda: read_resource(params),
        "resources/subscribe": lambda: subscribe(params, cancel),
        "resources/unsubscribe": lambda: unsubscribe(params),
        "completion/complete": lambda: complete(params),
    }
    if method not in handlers:
        raise NoSuchMethod(method)
    return handlers[method]()


def serve_one(message: dict[str, Any], cancel: threading.Event) -> None:
    request_id, method = message["id"], str(message["method"])
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    try:
        reply["result"] = answer(method, message.get("params") or {}, request_id, cancel)
    except Cancelled:
        reply["error"] = {"code": 0, "message": "Request cancelled"}
    except NoSuchMethod:
        reply["error"] = {"code": _raw.METHOD_NOT_FOUND, "message": "Method not found"}
    except Exception as exc:  # as the SDK's server: code 0, the message
        reply["error"] = {"code": 0, "message": str(exc)}
    finally:
        with _lock:
            _cancelled.pop(request_id, None)
    send(reply)


def main() -> None:
    _raw.log("rich: ready")
    sys.stdout = sys.stderr  # a stray print() must not corrupt the protocol stream
    for message in _raw.incoming(send):
        if "method" not in message:
            continue  # a response to nothing we asked
        if message["method"] == "notifications/cancelled":
            with _lock:
                cancel = _cancelled.get((message.get("params") or {}).get("requestId"))
            if cancel is not None:
                cancel.set()
            continue
        if "id" not in message:
            continue  # initialized, roots/list_changed: nothing to do
        cancel = threading.Event()
        with _lock:
            _cancelled[message["id"]] = cancel
        threading.Thread(target=serve_one, args=(message, cancel), daemon=True).start()


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):  # the client went away; nothing left to answer
        main()
