"""Two tiny demo MCP servers to supervise: ``mcp-supervisor-demo clock|notes`` (stdio).

``clock`` tells the time in any IANA zone and can sleep (handy for watching in-flight calls);
``notes`` keeps a bounded in-memory list of notes, which is lost on restart (handy for seeing
one). They exist for ``make run`` and ``configs/example.yaml``; they are not part of the daemon.
"""

from __future__ import annotations

import collections
import math
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

__all__ = ("main",)

_USAGE = "usage: mcp-supervisor-demo {clock|notes}\n  runs a demo MCP server on stdio"
_EXIT_USAGE = 2
_MAX_SLEEP = 60.0
_MAX_NOTES = 1000  # oldest notes are dropped beyond this
_MAX_NOTE_CHARS = 10_000


def _clock() -> MCPServer:
    """A server with ``now(timezone)`` and ``sleep(seconds)``."""
    server = MCPServer("demo-clock", instructions="Tells the current time; can sleep up to a minute.")

    @server.tool()
    def now(timezone: str = "UTC") -> str:
        """The current time in an IANA timezone such as "Europe/Paris", as ISO 8601."""
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ToolError(f"unknown timezone: {timezone!r}") from exc
        return datetime.now(zone).isoformat(timespec="seconds")

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleep for up to 60 seconds, then say how long it slept."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ToolError("seconds must be a finite number >= 0")
        seconds = min(seconds, _MAX_SLEEP)
        await anyio.sleep(seconds)
        return f"slept {seconds:g} s"

    return server


def _notes() -> MCPServer:
    """A server with ``add_note``, ``list_notes`` and ``clear_notes`` over a bounded deque."""
    server = MCPServer("demo-notes", instructions=f"In-memory notes; the newest {_MAX_NOTES} are kept.")
    notes: collections.deque[str] = collections.deque(maxlen=_MAX_NOTES)

    @server.tool()
    def add_note(text: str) -> str:
        """Store a note (at most 10,000 characters). The oldest note goes once 1000 are stored."""
        if len(text) > _MAX_NOTE_CHARS:
            raise ToolError(f"note too long: {len(text)} characters, limit {_MAX_NOTE_CHARS}")
        notes.append(text)
        return f"{len(notes)} note(s) stored"

    @server.tool()
    def list_notes() -> list[str]:
        """All stored notes, oldest first."""
        return list(notes)

    @server.tool()
    def clear_notes() -> str:
        """Delete every note and say how many there were."""
        count = len(notes)
        notes.clear()
        return f"cleared {count} note(s)"

    return server


_SERVERS: dict[str, Callable[[], MCPServer]] = {"clock": _clock, "notes": _notes}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the named demo server on stdio until stdin closes; 2 on a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print(_USAGE)
        return 0
    if len(args) != 1 or args[0] not in _SERVERS:
        print(_USAGE, file=sys.stderr)
        return _EXIT_USAGE
    _SERVERS[args[0]]().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
