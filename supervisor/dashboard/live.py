"""How the dashboard's open pages hear of changes without asking: a counter anyone can wait on.

The daemon bumps :class:`Pulse` on every state change of an extension or an instance, a reload
and an approval. A page's event stream waits on it (or on its refresh interval, for what moves
on its own: RSS, CPU, uptime), then sends what changed, at most once per coalescing window.
"""

from __future__ import annotations

import anyio

__all__ = ("Pulse",)


class Pulse:
    """A version number that grows on every change, and a wait for the next one."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = anyio.Event()

    def bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def wait(self, seen: int) -> int:
        """The version once it is past *seen*."""
        while self.version == seen:
            await self._changed.wait()
        return self.version
