"""Progress on its way back to a client: the latest value only.

While one notification is being sent to a slow client, newer ones replace each other, so a
chatty child costs no queue and no task per notification. Both of the gateway's call paths
relay through :class:`LatestProgress`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ("LatestProgress",)

Progress = tuple[float, float | None, str | None]  # progress, total, message


class LatestProgress:
    """A progress callback that hands *send* the latest value, one send at a time."""

    def __init__(self, send: Callable[[float, float | None, str | None], Awaitable[object]]) -> None:
        self._send = send
        self._latest: Progress | None = None
        self._sending = False

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self._latest = (progress, total, message)
        if self._sending:
            return
        self._sending = True
        try:
            while self._latest is not None:
                latest, self._latest = self._latest, None
                await self._send(*latest)
        finally:
            self._sending = False
