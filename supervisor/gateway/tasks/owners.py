"""Which client created each task: tasks are bound to their requestor (MCP 2025-11-25).

The spec says a task MUST be bound to the requestor's context when there is one, and
``tasks/get|result|cancel|list`` MUST serve only that requestor's tasks. The gateway's clients
share the children (a shared extension's ``tasks/list`` lists everyone's tasks), so the router
keeps this table: namespaced task id -> the client object of :func:`passthrough.client_of`.

Bounds: :data:`MAX_PER_CLIENT` tasks per client and :data:`MAX_TASKS` in all. Over either, the
oldest entry (of that client, or of all) is forgotten rather than the new task refused: the
child has made the task by the time we see its id, a long-lived client creates tasks for days
(refusing would lock it out for good, since nothing tells us when a child's task expires), and
the oldest task is the one most likely expired at the child already. A forgotten task is
unknown to every client from then on (fail closed: nobody else gains it). A client's entries
go when its connection closes.

:class:`TaskCaller`: what a child asks its client during ``tasks/result`` names the task by the
child's own id (``_meta`` ``related-task``); the client gets the id it knows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import mcp_types as types

if TYPE_CHECKING:
    from supervisor.extension.asking import Caller

__all__ = ("MAX_PER_CLIENT", "MAX_TASKS", "RELATED_TASK", "Owners", "TaskCaller")

RELATED_TASK = "io.modelcontextprotocol/related-task"

MAX_PER_CLIENT = 256
MAX_TASKS = 4096


class _Client(Protocol):
    def on_close(self, callback: Callable[[], None]) -> None: ...


class Owners:
    """Task id -> the client that created it, bounded (see the module's docstring)."""

    def __init__(self, per_client: int = MAX_PER_CLIENT, total: int = MAX_TASKS) -> None:
        self.per_client, self.total = per_client, total
        self._owner: dict[str, _Client] = {}  # oldest first (dicts keep insertion order)
        self._of: dict[_Client, dict[str, None]] = {}  # each client's ids, oldest first
        self._hooked: set[_Client] = set()  # clients whose close we hear of (once each)

    def __len__(self) -> int:
        return len(self._owner)

    def add(self, client: _Client, task_id: str) -> None:
        """Bind *task_id* to *client*; forgets the oldest entries over the bounds."""
        self._forget(task_id)  # a re-used id (never, from a sane child) belongs to the newest creator
        own = self._of.setdefault(client, {})
        own[task_id] = None
        self._owner[task_id] = client
        while len(own) > self.per_client:
            self._forget(next(iter(own)))
        while len(self._owner) > self.total:
            self._forget(next(iter(self._owner)))
        if client not in self._hooked:
            self._hooked.add(client)
            client.on_close(lambda: self._closed(client))  # at once if it has closed: drops it all

    def owns(self, client: object, task_id: str) -> bool:
        return self._owner.get(task_id) is client

    def of(self, client: object) -> list[str]:
        """*client*'s task ids, oldest first."""
        return list(self._of.get(client, ()))  # type: ignore[call-overload]

    def _forget(self, task_id: str) -> None:
        client = self._owner.pop(task_id, None)
        if client is None:
            return
        own = self._of[client]
        del own[task_id]
        if not own:
            del self._of[client]

    def _closed(self, client: _Client) -> None:
        self._hooked.discard(client)
        for task_id in self._of.pop(client, {}):
            del self._owner[task_id]


class TaskCaller:
    """*caller* (the client of a ``tasks/*`` request), with the child's related-task id in what
    the child asks it mapped by *rename* (child's id -> the id the client knows)."""

    def __init__(self, caller: Caller, rename: Callable[[str], str]) -> None:
        self._caller, self._rename = caller, rename

    @property
    def client(self) -> object:
        return self._caller.client

    def refusal(self, method: str) -> str | None:
        return self._caller.refusal(method)

    def opens_urls(self) -> bool:
        return self._caller.opens_urls()

    async def ask(self, request: types.ServerRequest, patience: float) -> types.ClientResult:
        params = request.params
        meta = params.meta if params is not None else None
        related = meta.get(RELATED_TASK) if isinstance(meta, dict) else None
        if params is not None and isinstance(related, dict) and isinstance(related.get("taskId"), str):
            renamed = {**related, "taskId": self._rename(related["taskId"])}
            params = params.model_copy(update={"meta": {**meta, RELATED_TASK: renamed}})  # type: ignore[dict-item]
            request = request.model_copy(update={"params": params})
        return await self._caller.ask(request, patience)
