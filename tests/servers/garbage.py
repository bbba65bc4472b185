"""Server that writes junk to its protocol stdout, for parser-robustness and size-cap tests.

Before the ``initialize`` response it writes a non-JSON line and a JSON line that is not
JSON-RPC. Tools: ``echo(text)``; ``noise()`` writes junk lines, then answers;
``huge(bytes)`` writes ONE junk line of that many bytes (plus the newline), then answers.
"""

from __future__ import annotations

import _raw

_CHUNK = 1 << 20


def _junk() -> None:
    _raw.write_raw(b"this is not json\n")
    _raw.write_raw(b'{"hello": "not json-rpc"}\n')


def echo(args: _raw.Args) -> _raw.Content:
    """Return the text unchanged."""
    return [_raw.text(str(args["text"]))]


def noise(args: _raw.Args) -> _raw.Content:
    """Write junk lines to stdout, then answer normally."""
    _junk()
    _raw.write_raw(b"[1, 2, 3]\n")
    return [_raw.text("noisy")]


def huge(args: _raw.Args) -> _raw.Content:
    """Write one junk line of *bytes* bytes in 1 MiB chunks, then answer."""
    remaining = int(args["bytes"])
    chunk = b"z" * min(_CHUNK, remaining)
    while remaining > 0:
        _raw.write_raw(chunk[:remaining])
        remaining -= len(chunk)
    _raw.write_raw(b"\n")
    return [_raw.text(f"wrote {int(args['bytes'])} bytes")]


TOOLS = {
    "echo": _raw.Tool(echo, "Echo text back.", {"text": {"type": "string"}}, ("text",)),
    "noise": _raw.Tool(noise, "Write junk lines, then answer."),
    "huge": _raw.Tool(huge, "Write one junk line of N bytes.", {"bytes": {"type": "integer"}}, ("bytes",)),
}


def main() -> None:
    """Serve, writing junk before the initialize response."""
    _raw.serve("garbage", TOOLS, before_initialize=_junk)


if __name__ == "__main__":
    main()
