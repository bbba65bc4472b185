"""Raw-protocol server whose one tool answers with big images, then exits at once.

Tool: ``images_then_exit(bytes, count=2, code=0)``: writes a result of ``count`` PNG images of
``bytes`` decoded bytes each (the payloads of ``media.py``'s ``image`` with seeds 0, 1, ...),
then exits with ``code`` without reading anything more. Everything else as in ``_raw``.
"""

from __future__ import annotations

import json
import os
import sys

import _raw
import media

TOOLS = {
    "images_then_exit": _raw.Tool(
        lambda args: [], "Big images, then exit.", {"bytes": {"type": "integer"}}, ("bytes",)
    )
}


def main() -> None:
    """Serve the handshake; on the call, answer and exit."""
    sys.stdout = sys.stderr
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        if msg.get("method") == "tools/call":
            args = msg["params"].get("arguments") or {}
            content = [
                media._image_block(int(args["bytes"]), seed) for seed in range(int(args.get("count", 2)))
            ]
            _raw._send({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": content, "isError": False}})
            os._exit(int(args.get("code", 0)))
        if "id" in msg and "method" in msg:
            _raw._send(_raw._handle("last_words", TOOLS, None, msg))


if __name__ == "__main__":
    main()
