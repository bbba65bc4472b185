"""Stdlib-only MCP stdio loop shared by the fast fixture servers.

Importing the mcp SDK costs about a second; this loop starts in tens of milliseconds, which
matters for restart-heavy tests. It speaks handshake-era MCP: one JSON object per line on
stdin/stdout, one request at a time. Diagnostics go to stderr; ``sys.stdout`` is pointed at
stderr while serving, so a stray ``print()`` cannot corrupt the protocol stream.

Large binary payloads: put a :class:`Base64` where the base64 string belongs and the line is
written in pieces, encoded a chunk at a time, without ever building the whole string.
"""

from __future__ import annotations

import binascii
import json
import sys

# Importing typing costs ~4 ms of a ~40 ms start; type checkers honour a local TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, BinaryIO

    Args = dict[str, Any]
    Content = list[dict[str, Any]]
    ToolFn = Callable[[Args], Content | dict[str, Any]]

__all__ = ("Base64", "Tool", "incoming", "log", "send", "serve", "text", "write_raw")

DEFAULT_PROTOCOL = "2025-11-25"
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
PARSE_ERROR = -32700
INVALID_REQUEST = -32600

_out: BinaryIO = sys.stdout.buffer  # the real protocol stream, captured before serve() swaps sys.stdout
_B64_CHUNK = 3 << 18  # raw bytes encoded per write: a multiple of 3, so the pieces concatenate cleanly
_B64_MARK = "\x00raw-base64\x00"  # stands in for each Base64 while the rest of the line is dumped
_B64_MARK_JSON = json.dumps(_B64_MARK).encode()[1:-1]  # how it appears inside the dumped line


class Base64:
    """Raw bytes, sent as a base64 JSON string encoded chunk by chunk as the line is written."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class Tool:
    """One tool: *fn* gets the call's arguments and returns content dicts, or raises for ``isError``.

    *fn* may instead return a whole result dict (``content`` plus e.g. ``structuredContent``).
    """

    __slots__ = ("description", "fn", "properties", "required")

    def __init__(
        self,
        fn: ToolFn,
        description: str = "",
        properties: Mapping[str, Any] | None = None,
        required: tuple[str, ...] = (),
    ) -> None:
        self.fn = fn
        self.description = description
        self.properties = dict(properties or {})
        self.required = required

    def describe(self, name: str) -> dict[str, Any]:
        """The ``tools/list`` entry for this tool."""
        schema: dict[str, Any] = {"type": "object", "properties": self.properties}
        if self.required:
            schema["required"] = list(self.required)
        return {"name": name, "description": self.description, "inputSchema": schema}


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def log(message: str) -> None:
    """Write one diagnostic line to stderr and flush it."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def write_raw(data: bytes) -> None:
    """Write bytes to the protocol stream as is and flush (fixtures use it to inject junk)."""
    _out.write(data)
    _out.flush()


def send(message: dict[str, Any]) -> None:
    """Write one message as a line (its :class:`Base64` values encoded as it goes). Not thread-safe."""
    _send(message)


def _send(message: dict[str, Any]) -> None:
    payloads: list[bytes] = []

    def mark(value: object) -> str:
        if not isinstance(value, Base64):
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        payloads.append(value.data)
        return _B64_MARK

    line = json.dumps(message, separators=(",", ":"), default=mark).encode()
    if not payloads:
        write_raw(line + b"\n")
        return
    pieces = line.split(_B64_MARK_JSON)
    if len(pieces) != len(payloads) + 1:  # the marker also occurs in some other string
        raise ValueError("cannot place base64 payloads in the line")
    _out.write(pieces[0])
    for data, piece in zip(payloads, pieces[1:], strict=True):
        view = memoryview(data)
        for start in range(0, len(view), _B64_CHUNK):
            _out.write(binascii.b2a_base64(view[start : start + _B64_CHUNK], newline=False))
        _out.write(piece)
    write_raw(b"\n")


def incoming(send: Callable[[dict[str, Any]], None]) -> Iterator[dict[str, Any]]:
    """Each JSON object on stdin until EOF (*send*: the server's own, thread-safe if it answers
    from threads); a line that is not JSON, or not an object, is answered with an error."""
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            send(_error(None, PARSE_ERROR, "Parse error"))
            continue
        if isinstance(message, dict):
            yield message
        else:
            send(_error(None, INVALID_REQUEST, "Invalid Request"))


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def _call(tools: Mapping[str, Tool], params: dict[str, Any]) -> dict[str, Any]:
    tool = tools[params["name"]]  # KeyError -> INVALID_PARAMS in _handle
    try:
        returned = tool.fn(params.get("arguments") or {})
    except Exception as exc:
        return {"content": [text(f"{type(exc).__name__}: {exc}")], "isError": True}
    if isinstance(returned, dict):
        return {"isError": False, **returned}
    return {"content": returned, "isError": False}


def _handle(
    name: str, tools: Mapping[str, Tool], before_initialize: Callable[[], None] | None, msg: dict[str, Any]
) -> dict[str, Any]:
    msg_id, method = msg["id"], msg.get("method")
    params = msg.get("params") or {}
    if method == "initialize":
        if before_initialize is not None:
            before_initialize()
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion") or DEFAULT_PROTOCOL,
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": name, "version": "0.1.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": [tool.describe(tool_name) for tool_name, tool in tools.items()]}
    elif method == "tools/call":
        if params.get("name") not in tools:
            return _error(msg_id, INVALID_PARAMS, f"Unknown tool: {params.get('name')}")
        result = _call(tools, params)
    else:
        return _error(msg_id, METHOD_NOT_FOUND, f"Method not found: {method}")
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def serve(
    name: str, tools: Mapping[str, Tool], *, before_initialize: Callable[[], None] | None = None
) -> None:
    """Answer requests on stdin until EOF, then return.

    Notifications and responses (messages without a ``method`` or an ``id``) are ignored.
    *before_initialize* runs just before the ``initialize`` response is written.
    """
    sys.stdout = sys.stderr
    try:
        for msg in incoming(_send):
            if "id" in msg and "method" in msg:
                _send(_handle(name, tools, before_initialize, msg))
    except BrokenPipeError:
        pass  # the client went away; nothing left to answer
