"""A server that stops answering, or grows: for the liveness and memory_max tests.

quick.py's tools (``sleep()`` without seconds blocks the one-request-at-a-time loop for an
hour: its calls and pings go unanswered) plus ``alloc(mb)``: allocate and touch that many
MiB, keep them, answer ``allocated``; ``ask(message)``: send the client an elicitation and
block (answering no ping) until its answer comes, then answer with its action. Env
``HANG_AFTER=S``: after S seconds the loop stops reading requests (it sleeps; the process
lives), writing ``hang: frozen`` to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time

import _raw
import quick

_kept: list[bytearray] = []


def alloc(args: _raw.Args) -> _raw.Content:
    """Allocate *mb* MiB, touching every page so it is resident, and keep it."""
    _kept.append(bytearray(b"x" * (int(args["mb"]) << 20)))
    return [_raw.text("allocated")]


def ask(args: _raw.Args) -> _raw.Content:
    """Elicit from the client and wait for the answer, serially: pings meanwhile stay unanswered."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    params = {"message": str(args.get("message", "?")), "requestedSchema": schema}
    _raw._send({"jsonrpc": "2.0", "id": "ask-1", "method": "elicitation/create", "params": params})
    for line in sys.stdin.buffer:
        reply = json.loads(line)
        if reply.get("id") == "ask-1" and "method" not in reply:
            return [_raw.text(str((reply.get("result") or {}).get("action", reply.get("error"))))]
    return [_raw.text("eof")]


class _FreezingLines:
    """stdin's lines until *at* (monotonic), then a sleep: a loop that hangs while idle."""

    def __init__(self, raw: object, at: float) -> None:
        self._raw, self._at = raw, at

    def __iter__(self):  # type: ignore[no-untyped-def]
        for line in self._raw:  # type: ignore[attr-defined]
            if time.monotonic() >= self._at:
                _raw.log("hang: frozen")
                time.sleep(3600)
            yield line


class _Stdin:
    def __init__(self, buffer: object) -> None:
        self.buffer = buffer


def main() -> None:
    after = os.environ.get("HANG_AFTER")
    if after is not None:
        sys.stdin = _Stdin(_FreezingLines(sys.stdin.buffer, time.monotonic() + float(after)))  # type: ignore[assignment]
    tools = {
        **quick.TOOLS,
        "alloc": _raw.Tool(alloc, "Allocate and keep MiB.", {"mb": {"type": "integer"}}),
        "ask": _raw.Tool(ask, "Elicit, waiting serially.", {"message": {"type": "string"}}),
    }
    _raw.log("hang: ready")
    _raw.serve("hang", tools)


if __name__ == "__main__":
    main()
