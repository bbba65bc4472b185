"""Hostile raw-protocol server: ``flood.py MODE`` misbehaves once its handshake is done.

Modes (after answering ``initialize`` and the first ``tools/list``):

* ``list_changed``: writes ``notifications/tools/list_changed`` without pause (from a thread)
  while it keeps answering requests.
* ``ping``: sends ``ping`` requests without pause and never reads its stdin again.
* ``deaf``: never reads its stdin again; stays alive.
* ``close_stdout``: closes its stdout and stays alive, still reading stdin.
* ``stderr``: writes stderr lines without pause while it keeps answering requests.
* ``junk``: writes non-JSON and invalid JSON-RPC lines without pause (from a thread) while it
  keeps answering requests.
* ``endless_line``: writes one line that never ends (1 MiB chunks of "x", no newline), forever.

Tool: ``echo(text)``. Writes "flood: MODE" to stderr when the misbehaviour starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

_lock = threading.Lock()
_urgent = threading.Event()  # an answer waits for the lock: floods step aside (locks are not fair)
_out = sys.stdout.buffer
TOOLS = [{"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}]


def encode(message: dict[str, object]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(message: dict[str, object]) -> None:
    """Write an answer ahead of any flood: a flood thread that re-takes the lock at once would
    otherwise starve it on a loaded machine."""
    _urgent.set()
    try:
        with _lock:
            _out.write(encode(message))
            _out.flush()
    finally:
        _urgent.clear()


def raw(data: bytes) -> None:
    """Write flood data, after any answer that waits."""
    while _urgent.is_set():
        time.sleep(0.001)
    with _lock:
        _out.write(data)
        _out.flush()


def answer(msg: dict[str, object]) -> None:
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "initialize":
        result: object = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "flood", "version": "0"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        text = str((params.get("arguments") or {}).get("text", ""))  # type: ignore[union-attr]
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        result = {}
    send({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def forever(fn: object) -> None:
    def loop() -> None:
        try:
            while True:
                fn()  # type: ignore[operator]
        except (BrokenPipeError, OSError):
            os._exit(0)

    threading.Thread(target=loop, daemon=True).start()


def misbehave(mode: str) -> bool:
    """Start the misbehaviour; return whether to keep reading stdin."""
    sys.stderr.write(f"flood: {mode}\n")
    sys.stderr.flush()
    if mode == "list_changed":
        forever(lambda: raw(encode({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})))
    elif mode == "stderr":
        forever(lambda: (sys.stderr.write("flood " * 20 + "\n"), sys.stderr.flush()))
    elif mode == "junk":
        lines = (b"not json\n", b'{"jsonrpc":"2.0","id":{},"result":1}\n', b'{"jsonrpc":"1.0"}\n', b"[]\n")
        forever(lambda: [raw(line) for line in lines])
    elif mode == "endless_line":
        forever(lambda: raw(b"x" * (1 << 20)))
    elif mode == "close_stdout":
        os.close(1)
    elif mode == "ping":
        ids = iter(range(1, 1 << 62))
        while True:
            send({"jsonrpc": "2.0", "id": f"p{next(ids)}", "method": "ping"})
    elif mode == "deaf":
        while True:
            time.sleep(3600)
    return True


def main() -> None:
    mode = sys.argv[1]
    started = False
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        if "id" in msg and "method" in msg:
            with contextlib.suppress(OSError):  # close_stdout: nowhere to answer; stay alive anyway
                answer(msg)
            if msg["method"] == "tools/list" and not started:
                started = True
                misbehave(mode)


if __name__ == "__main__":
    main()
