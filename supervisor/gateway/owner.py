"""A gateway part that owns the tasks it starts, in a task group held by a task of the gateway's."""

from __future__ import annotations

import anyio
from anyio.abc import TaskGroup, TaskStatus

__all__ = ("TaskOwner",)


class TaskOwner:
    """Owns the tasks it starts: :meth:`run`, started by the gateway, holds their task group.

    Before ``run`` has started and once it has ended, :attr:`_tg` is None: nothing may start then.
    """

    _tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the tasks until cancelled (then they are cancelled too)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                await self._serve()
            finally:
                self._tg = None

    async def _serve(self) -> None:
        """What the owner does besides owning its tasks: by default nothing, until cancelled."""
        await anyio.sleep_forever()
