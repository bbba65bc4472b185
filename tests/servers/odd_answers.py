"""Fixture: a stdlib MCP server whose answers are legal-looking but odd, for the gateway's fast path.

Tools:
  echo(text)     -> text
  nan()          -> structuredContent holding NaN (what Python's json.dumps writes by default)
  bignan()       -> the same, in a line over the tests' max_inline_bytes (the spool's parse)
  bigint()       -> one progress notification whose value has 400 digits, then "ok"
  bigprogress()  -> one progress notification with a 2 MiB message, then no answer until cancelled
  surrogate()    -> an answer that is not valid UTF-8 JSON (a lone surrogate escape)
  boolcode()     -> a JSON-RPC error whose code is `true`
  busy()         -> the server's own JSON-RPC error -32000 (as many servers use it), still running
  route(region)  -> its arguments as text; ``region`` is annotated ``x-mcp-header: Region``
                    (a 2026-07-28 client mirrors it in an ``Mcp-Param-Region`` header)
  claims()       -> a result claiming to be input-required (``resultType``, ``inputRequests``)
  video()        -> a content item of a type no protocol version knows (an invalid result)
  nullerror()    -> ``isError: null`` (an invalid result)
Cancellations are written to stderr as "odd: cancelled ID".
"""

from __future__ import annotations

import json
import sys

out = sys.stdout.buffer
TOOLS = [
    "echo",
    "nan",
    "bignan",
    "bigint",
    "bigprogress",
    "surrogate",
    "boolcode",
    "busy",
    "route",
    "claims",
    "video",
    "nullerror",
]
SCHEMAS = {
    "route": {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}
}


def write(line: str) -> None:
    out.write(line.encode() + b"\n")
    out.flush()


def answer(request_id: object, result: dict) -> None:
    write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))


def text(value: str) -> dict:
    return {"content": [{"type": "text", "text": value}]}


for raw in sys.stdin:
    message = json.loads(raw)
    method, request_id = message.get("method"), message.get("id")
    params = message.get("params") or {}
    if method == "initialize":
        info = {"name": "odd", "version": "0"}
        version = params.get("protocolVersion", "2025-11-25")
        answer(request_id, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info})
    elif method == "tools/list":
        tools = [{"name": name, "inputSchema": SCHEMAS.get(name, {"type": "object"})} for name in TOOLS]
        answer(request_id, {"tools": tools})
    elif method == "notifications/cancelled":
        print(f"odd: cancelled {params.get('requestId')}", file=sys.stderr, flush=True)
    elif method == "tools/call":
        name, token = params["name"], (params.get("_meta") or {}).get("progressToken")
        if name == "echo":
            answer(request_id, text(str((params.get("arguments") or {}).get("text"))))
        elif name in ("nan", "bignan"):
            padding = "x" * (10_000 if name == "bignan" else 3)
            answer(request_id, {**text(padding), "structuredContent": {"v": float("nan")}})
        elif name == "bigint":
            progress = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token},
            }
            write(json.dumps(progress)[:-2] + ', "progress": 1' + "0" * 400 + "}}")
            answer(request_id, text("ok"))
        elif name == "bigprogress":
            note = {"progressToken": token, "progress": 1, "message": "x" * (2 << 20)}
            write(json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": note}))
        elif name == "surrogate":
            answer(request_id, text("\ud800"))  # json.dumps escapes it: \ud800, which strict parsers refuse
        elif name == "boolcode":
            write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": True, "message": "odd"}}))
        elif name == "route":
            answer(request_id, text(json.dumps(params.get("arguments"))))
        elif name == "claims":
            claimed = {"a": {"method": "roots/list"}}
            answer(request_id, {"content": [], "resultType": "input_required", "inputRequests": claimed})
        elif name == "video":
            answer(request_id, {"content": [{"type": "video", "data": "AAAA"}]})
        elif name == "nullerror":
            answer(request_id, {**text("n"), "isError": None})
        elif name == "busy":
            error = {"code": -32000, "message": "database is locked, retry in 5s"}
            write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))
    elif request_id is not None and method is not None:
        answer(request_id, {})
