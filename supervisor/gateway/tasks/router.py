"""Tasks (MCP 2025-11-25) through the gateway: task-augmented calls and ``tasks/*``, routed by id.

A handshake-era client may ask for a ``tools/call`` to run as a task; the call goes to the
owning extension with its ``task`` member kept, and the ``CreateTaskResult`` comes back with
the task id namespaced: ``EXTENSION:RUN:ID``, where RUN names the child process that holds the
task (the tail of its run marker) and ID is the child's own id. The mapping is a pure
function both ways, so the gateway keeps no table (nothing to bound or evict) and no id of
two extensions can clash. ``tasks/get``, ``tasks/result`` and ``tasks/cancel`` route back by
that id; an id whose run is no longer the extension's running child fails at once, naming the
restart (a server's tasks live in its process). ``tasks/list`` merges the lists of every
running extension that declares it, in name order, paged by the gateway's own cursor.
Each task is bound to the client that created it (:mod:`.taskowners`): another client's id is
as unknown as a made-up one, and ``tasks/list`` shows a client only its own tasks. None of
``tasks/*`` makes a per-client instance, and ``tasks/list`` does not renew ``idle_stop``.

The SDK 2.3 has the types but no task machinery: its lowlevel server validates a ``tools/call``
result as a ``CallToolResult`` (so the task-augmented call is answered here, in a middleware,
before that check), and its client session does the same (so the child is asked with plain
JSON, :meth:`Extension.request_raw`). The 2026-07-28 tasks extension
(``io.modelcontextprotocol/tasks``: ``tasks/get``, ``tasks/update``, ``tasks/cancel``,
``resultType: "task"``) is in neither: 2026-07-28 clients get a clear error for ``tasks/*``
and plain, synchronous calls (their ``task`` member is ignored, as that extension says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import structlog
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from supervisor.errors import CallFailed, ExtensionUnavailable, SupervisorError
from supervisor.extension.state import State
from supervisor.gateway.asks.callers import SessionCaller
from supervisor.gateway.links import expose_json
from supervisor.gateway.progress import LatestProgress
from supervisor.gateway.session import session_of
from supervisor.gateway.tasks.ids import (
    MAX_ID_LENGTH,
    decode_cursor,
    encode_cursor,
    invalid,
    parse_task_id,
    task_id,
)
from supervisor.gateway.tasks.owners import RELATED_TASK, Owners, TaskCaller
from supervisor.gateway.toolerrors import is_tool_error, raw_tool_error

if TYPE_CHECKING:
    from supervisor.extension.served import Served
    from supervisor.gateway.router import Router

__all__ = ("MAX_LIST_REQUESTS", "MAX_PAGE", "TaskRouter")

log = structlog.get_logger(__name__)

MAX_PAGE = 100  # tasks in one tasks/list page
MAX_LIST_REQUESTS = 8  # children's tasks/list pages fetched for one page of ours
LIST_TIMEOUT = 5.0  # seconds for one child's tasks/list page; a slow child is left out
Context = ServerRequestContext[Any]
_UNSUPPORTED_2026 = (
    "{method}: the 2026-07-28 tasks extension (io.modelcontextprotocol/tasks) is not supported: "
    "the MCP SDK 2.3 that mcp-supervisor runs on has no implementation of it; tasks work for "
    "clients speaking 2025-11-25"
)


class TaskRouter:
    """Task-augmented calls and ``tasks/*`` for the clients of *gateway*."""

    def __init__(
        self,
        router: Router,
        *,
        enroll: Callable[[Context], object],
        spool_prefix: str,
        unavailable: int,
    ) -> None:
        self._router = router  # names to extensions, and the instance that serves a client
        self._enroll = enroll  # a client's first request: it hears list changes from now on
        self._spool_prefix = spool_prefix
        self.owners = Owners()  # task id -> the client that created it
        self._unavailable = unavailable  # the JSON-RPC code for "the extension is not running"

    def install(self, server: Any) -> None:
        """Register the handlers and the ``tools/call`` middleware on the lowlevel *server*."""
        server.middleware.append(self.middleware)
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._get)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._result)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._cancel)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._list)

    # ---- tools/call with a task ------------------------------------------------------------

    async def middleware(self, ctx: Context, call_next: CallNext) -> HandlerResult:
        """Answer a handshake-era task-augmented ``tools/call`` here; pass everything else on."""
        params = ctx.params
        if (
            ctx.method != "tools/call"
            or ctx.request_id is None
            or not isinstance(params, Mapping)
            or params.get("task") is None
            or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS  # its tasks extension ignores `task`
        ):
            return await call_next(ctx)
        name, arguments, task = params.get("name"), params.get("arguments"), params.get("task")
        if not isinstance(name, str) or not isinstance(arguments, dict | None) or not isinstance(task, dict):
            raise invalid("tools/call: name must be a string, arguments and task objects")
        target = self._router.route(name, ctx.request)
        ext = self._router.extension(target[0]) if target is not None else None
        if target is None or ext is None:
            return await call_next(ctx)  # a meta-tool, a hidden or unknown tool: the usual answer
        tool = target[1]
        support = _task_support(ext, tool)
        if support not in ("optional", "required"):
            raise MCPError(
                types.METHOD_NOT_FOUND,
                f"tool {name!r} cannot run as a task (its execution.taskSupport is {support or 'absent'})",
            )
        self._enroll(ctx)
        forwarded: dict[str, Any] = {"name": tool, "task": task}
        if arguments is not None:
            forwarded["arguments"] = arguments
        try:
            ext = await self._router.serving_when_room(ext, session_of(ctx))
            result, run = await ext.request_raw(
                "tools/call", forwarded, progress=_relay(ctx), caller=SessionCaller(ctx)
            )
        except (ExtensionUnavailable, CallFailed) as exc:
            if is_tool_error(exc):
                return raw_tool_error(str(exc))
            raise MCPError(exc.code, str(exc), exc.data) from None
        if isinstance(result.get("task"), dict):  # it lives in the run that answered
            task = self._renamed(result["task"], ext.name, run)
            if len(task["taskId"]) > MAX_ID_LENGTH:  # no client could name it back: never kept
                message = f"extension {ext.name!r} answered with a task id over {MAX_ID_LENGTH} characters"
                raise MCPError(types.INTERNAL_ERROR, message)
            self.owners.add(_client(ctx), task["taskId"])
            return {**result, "task": task}
        return self._payload(result, ext.name, run)  # the child ran it plainly (it ignored `task`)

    # ---- tasks/get, tasks/result, tasks/cancel ---------------------------------------------

    async def _get(self, ctx: Context, params: types.GetTaskRequestParams) -> dict[str, Any]:
        ext, run, child_id = self._owner(ctx, "tasks/get", params.task_id)
        result = await self._send(ext, ctx, "tasks/get", {"taskId": child_id})
        return self._renamed(result, ext.name, run)

    async def _cancel(self, ctx: Context, params: types.CancelTaskRequestParams) -> dict[str, Any]:
        ext, run, child_id = self._owner(ctx, "tasks/cancel", params.task_id)
        result = await self._send(ext, ctx, "tasks/cancel", {"taskId": child_id})
        return self._renamed(result, ext.name, run)

    async def _result(self, ctx: Context, params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
        ext, run, child_id = self._owner(ctx, "tasks/result", params.task_id)
        result = await self._send(ext, ctx, "tasks/result", {"taskId": child_id}, blocking=True)
        return self._payload(result, ext.name, run)

    def _owner(self, ctx: Context, method: str, value: str) -> tuple[Served, str, str]:
        """The running extension that holds task *value*, its run and the child's id, or an error now."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(types.METHOD_NOT_FOUND, _UNSUPPORTED_2026.format(method=method))
        parsed = parse_task_id(value) if len(value) <= MAX_ID_LENGTH else None
        if parsed is None:
            raise invalid(
                f"unknown task id {value[:200]!r}: task ids from this gateway look like EXTENSION:RUN:ID",
                taskId=value[:200],
            )
        if not self.owners.owns(_client(ctx), value):  # another client's task: as if it did not exist
            raise invalid(f"unknown task id {value[:200]!r}", taskId=value[:200])
        extension, run, child_id = parsed
        ext = self._router.extension(extension)
        if ext is None:
            raise invalid(f"unknown task id {value[:200]!r}: no extension {extension!r}", taskId=value[:200])
        view = self._router.views.of(ctx.request)
        if not view.sees(extension):
            raise invalid(f"extension {extension!r} is not in profile {view.label!r}", taskId=value[:200])
        serving = self._router.existing(ext, session_of(ctx))
        if serving is None:  # its own instance is gone (stopped by hand): so are its tasks
            raise invalid(
                f"task {value[:200]!r} is gone: extension {extension!r} stopped its instance for this client",
                taskId=value[:200],
                extension=extension,
                reason="stopped",
            )
        ext = serving
        now = ext.run_id
        if now != run:
            state = ext.state
            if now is not None:
                why, reason = f"extension {extension!r} restarted since the task was created", "restarted"
            else:
                why, reason = f"extension {extension!r} is {state.value}", state.value
            raise invalid(
                f"task {value[:200]!r} is gone: {why}, and a server's tasks end with its process",
                taskId=value[:200],
                extension=extension,
                reason=reason,
            )
        return ext, run, child_id

    async def _send(
        self, ext: Served, ctx: Context, method: str, params: dict[str, Any], *, blocking: bool = False
    ) -> dict[str, Any]:
        """One request to the run that holds the task; a restart meanwhile fails it, never a newer run.

        *blocking* (``tasks/result``, which waits until the task ends): only ``call_timeout_max``
        bounds it, as nothing renews ``call_timeout`` (the task's progress goes to its creating call).
        """
        try:
            run = ext.run_id or ""
            caller = TaskCaller(SessionCaller(ctx), lambda child_id: task_id(ext.name, run, child_id))
            result, _ = await ext.request_raw(
                method, params, run=ext.run_id, progress=_relay(ctx), caller=caller, blocking=blocking
            )
            return result
        except ExtensionUnavailable as exc:
            data = {"state": exc.state, "retryable": exc.retryable}
            raise MCPError(self._unavailable, str(exc), data) from None
        except CallFailed as exc:
            raise MCPError(exc.code or types.INTERNAL_ERROR, str(exc), exc.data) from None
        except SupervisorError as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from None

    # ---- tasks/list --------------------------------------------------------------------------

    async def _list(self, ctx: Context, params: types.PaginatedRequestParams) -> dict[str, Any]:
        """Every running extension's tasks, extensions in name order, each in its own order.

        Bounds: at most :data:`MAX_PAGE` tasks and :data:`MAX_LIST_REQUESTS` child pages per
        page, each child page within :data:`LIST_TIMEOUT` (a slow or failing child is skipped).
        """
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(types.METHOD_NOT_FOUND, _UNSUPPORTED_2026.format(method="tasks/list"))
        start = decode_cursor(params.cursor) if params.cursor else ("", "", None, 0)
        client = _client(ctx)
        sources = self._listing_sources(ctx, {tuple(t.split(":", 2)[:2]) for t in self.owners.of(client)})
        names = [ext.name for ext, _ in sources]
        position = next((i for i, name in enumerate(names) if name >= start[0]), len(names))
        child_cursor, offset = None, 0
        if position < len(names) and names[position] == start[0] and sources[position][1] == start[1]:
            child_cursor, offset = start[2], start[3]  # the same run: go on where the last page ended
        found: list[dict[str, Any]] = []
        for _ in range(MAX_LIST_REQUESTS):
            if position >= len(sources) or len(found) >= MAX_PAGE:
                break
            ext, run = sources[position]
            page = await self._child_page(ext, ctx, child_cursor)
            items = page.get("tasks") if page is not None else None
            items = [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
            full = False
            for index in range(offset, len(items)):
                if len(found) >= MAX_PAGE:
                    offset, full = index, True  # the next page starts at this item of this child page
                    break
                task = self._renamed(items[index], ext.name, run)
                if self.owners.owns(client, task["taskId"]):  # only the client's own tasks
                    found.append(task)
            if full:
                break
            following = page.get("nextCursor") if page is not None else None
            if isinstance(following, str) and following and following != child_cursor:
                child_cursor, offset = following, 0
            else:
                position, child_cursor, offset = position + 1, None, 0
        result: dict[str, Any] = {"tasks": found}
        if position < len(sources):
            ext, run = sources[position]
            result["nextCursor"] = encode_cursor(ext.name, run, child_cursor, offset)
        return result

    def _listing_sources(self, ctx: Context, runs: set[tuple[str, ...]]) -> list[tuple[Served, str]]:
        """(extension serving this client, its run) for each running one that lists tasks and where
        the client has tasks (*runs*: its (extension, run) pairs), by name. Never makes an instance."""
        view = self._router.views.of(ctx.request)
        sources = []
        for shared in sorted(self._router.extensions(), key=lambda e: e.name):
            ext = self._router.existing(shared, session_of(ctx)) if view.sees(shared.name) else None
            if ext is None:
                continue
            capabilities, run = ext.capabilities, ext.run_id
            tasks = capabilities.tasks if capabilities is not None else None
            if (
                tasks is not None
                and tasks.list is not None
                and run
                and (ext.name, run) in runs
                and ext.state is State.RUNNING
            ):
                sources.append((ext, run))
        return sources

    async def _child_page(self, ext: Served, ctx: Context, cursor: str | None) -> dict[str, Any] | None:
        params = {"cursor": cursor} if cursor else {}
        try:
            with anyio.fail_after(LIST_TIMEOUT):
                page, _ = await ext.request_raw("tasks/list", params, run=ext.run_id, touch=False)
                return page
        except (TimeoutError, SupervisorError) as exc:
            log.warning("gateway.tasks_list_failed", extension=ext.name, error=str(exc)[:300])
            return None

    # ---- ids in results ----------------------------------------------------------------------

    def _renamed(self, task: Any, extension: str, run: str) -> dict[str, Any]:
        """A child's Task object with the id clients see."""
        if not isinstance(task, dict) or not isinstance(child_id := task.get("taskId"), str):
            raise MCPError(types.INTERNAL_ERROR, f"extension {extension!r} answered a task without a taskId")
        return {**task, "taskId": task_id(extension, run, child_id)}

    def _payload(self, result: dict[str, Any], extension: str, run: str) -> dict[str, Any]:
        """A task's result (a tool result): links and the related-task id as clients read them."""
        content = result.get("content")
        if isinstance(content, list):
            result = {**result, "content": expose_json(extension, content, self._spool_prefix)}
        meta = result.get("_meta")
        related = meta.get(RELATED_TASK) if isinstance(meta, dict) else None
        if isinstance(meta, dict) and isinstance(related, dict) and isinstance(related.get("taskId"), str):
            renamed = {**related, "taskId": task_id(extension, run, related["taskId"])}
            result = {**result, "_meta": {**meta, RELATED_TASK: renamed}}
        return result


def _task_support(ext: Served, tool: str) -> str | None:
    """The tool's ``execution.taskSupport`` in its last known listing (the running child's; else the
    one its gateway names are kept for: a call to it waits for a restart, or says it is stopped)."""
    for candidate in ext.known_listing().tools:
        if candidate.name == tool:
            return candidate.execution.task_support if candidate.execution is not None else None
    return None


def _client(ctx: Context) -> object:
    """The object that stands for the calling client (the same one its per-client instances use)."""
    return session_of(ctx)


def _relay(ctx: Context) -> LatestProgress:
    return LatestProgress(ctx.session.report_progress)
