"""The control methods: what each one takes and does, on a daemon seen as a :class:`Backend`.

One thin handler per JSON-RPC method, its params validated by a pydantic model; the wire
protocol around them lives in :mod:`supervisor.control.server`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import mcp_types

    from supervisor.extension.state import Snapshot

__all__ = ("METHODS", "PROGRESS_INTERVAL", "Backend", "Method", "Notify")

Notify = Callable[[str, dict[str, Any]], Awaitable[None]]  # a notification to the requesting client
ProgressFn = Callable[[float, "float | None", "str | None"], Awaitable[None]]
PROGRESS_INTERVAL = 0.1  # seconds between two progress notifications to a control client, at least


class Backend(Protocol):
    """What the control server needs from the daemon."""

    def status(self, name: str | None = None) -> list[Snapshot]: ...
    async def start(self, name: str, *, wait: bool = True) -> Snapshot: ...
    async def stop(self, name: str, *, wait: bool = True) -> Snapshot: ...
    async def restart(self, name: str, *, wait: bool = True) -> Snapshot: ...
    def tools(self, name: str | None = None) -> list[tuple[str, mcp_types.Tool]]: ...
    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]: ...
    def collisions(self, extension: str) -> list[str]: ...
    def profiles(self) -> list[dict[str, Any]]: ...
    def clients(self) -> list[dict[str, Any]]: ...  # the gateway's connected clients
    def recent_calls(self) -> dict[str, Any]: ...  # the last minutes of calls, per extension
    async def call(
        self, name: str, tool: str, arguments: dict[str, Any], *, progress: ProgressFn | None = None
    ) -> mcp_types.CallToolResult: ...
    def logs(self, name: str, lines: int) -> list[str]: ...
    def tool_changes(self, name: str, *, texts: bool = False) -> list[dict[str, Any]]: ...
    async def approve(self, name: str, tool: str | None = None) -> list[str]: ...
    async def reload(self) -> dict[str, list[str]]: ...
    def health(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...
    async def explain(self, name: str) -> list[str]: ...  # its sandbox's grants, as this daemon sees them
    async def login(self, name: str, *, device: bool = False) -> dict[str, Any]: ...  # its URL (and code)
    async def login_wait(self, name: str, patience: float) -> Snapshot: ...
    async def logout(self, name: str) -> dict[str, Any]: ...
    async def dashboard(self, *, read_only: bool = False) -> dict[str, Any]: ...  # its URL, with a code


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _OptionalName(_Params):
    name: str | None = Field(None, min_length=1)


class _Name(_Params):
    name: str = Field(min_length=1)


class _Action(_Params):
    name: str = Field(min_length=1)
    wait: bool = True


class _Call(_Params):
    name: str = Field(min_length=1)
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    progress: bool = False  # send "progress" notifications on this connection before the result


class _Logs(_Params):
    name: str = Field(min_length=1)
    lines: int = Field(50, ge=1, le=10_000)


class _Approve(_Params):
    name: str = Field(min_length=1)
    tool: str | None = Field(None, min_length=1)  # None: every changed tool of the extension


class _Login(_Params):
    name: str = Field(min_length=1)
    device: bool = False  # a device code (RFC 8628) instead of a redirect to this host's loopback


class _LoginWait(_Params):
    name: str = Field(min_length=1)
    wait: float = Field(600.0, gt=0, le=3600)  # seconds for the person to log in


class _Dashboard(_Params):
    read_only: bool = False  # this code's session may look, not act


class _Health(_Params):
    format: Literal["json", "prometheus"] = "json"


@dataclass(frozen=True, slots=True)
class Method:
    """One control method: its params model and its handler."""

    params: type[BaseModel]
    handler: Callable[..., Awaitable[Any]]  # (backend, params), or (backend, params, notify) if streams
    streams: bool = False  # may send notifications to the client before its result


async def _status(backend: Backend, params: _OptionalName) -> dict[str, Any]:
    records = [snapshot.as_dict() for snapshot in backend.status(params.name)]
    for record in records:
        record["name_collisions"] = backend.collisions(record["name"])
        record["tools_changed"] = backend.tool_changes(record["name"])  # since pinned (tools_on_change)
    if params.name is not None:
        return {"extensions": records}
    return {"extensions": records, "profiles": backend.profiles()}  # the default view first


async def _start(backend: Backend, params: _Action) -> dict[str, Any]:
    return (await backend.start(params.name, wait=params.wait)).as_dict()


async def _stop(backend: Backend, params: _Action) -> dict[str, Any]:
    return (await backend.stop(params.name, wait=params.wait)).as_dict()


async def _restart(backend: Backend, params: _Action) -> dict[str, Any]:
    return (await backend.restart(params.name, wait=params.wait)).as_dict()


async def _tools(backend: Backend, params: _OptionalName) -> dict[str, Any]:
    records = []
    changes: dict[str, dict[str, dict[str, Any]]] = {}  # extension -> tool -> its change
    for extension, tool in backend.tools(params.name):
        if extension not in changes:
            changed = backend.tool_changes(extension, texts=True)  # both definitions: a diff
            changes[extension] = {change["tool"]: change for change in changed}
        exposed, collision = backend.exposed(extension, tool.name)
        definition = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
        record = {"extension": extension, "exposed": exposed, "collision": collision}
        record["changed"] = changes[extension].get(tool.name)  # None: as pinned
        records.append({**record, **definition})
    if params.name is not None:
        return {"tools": records}
    return {"tools": records, "profiles": backend.profiles()}


class _Progress:
    """The child's progress, to the control client: one notification per :data:`PROGRESS_INTERVAL` at
    most, and none while one is being written (a newer value follows soon enough: the result)."""

    def __init__(self, notify: Notify) -> None:
        self._notify = notify
        self._last = float("-inf")
        self._sending = False

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        if self._sending or now - self._last < PROGRESS_INTERVAL:
            return
        self._sending, self._last = True, now
        try:
            await self._notify("progress", {"progress": progress, "total": total, "message": message})
        finally:
            self._sending = False


async def _call(backend: Backend, params: _Call, notify: Notify) -> dict[str, Any]:
    progress = _Progress(notify) if params.progress else None
    result = await backend.call(params.name, params.tool, params.arguments, progress=progress)
    record = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    record.pop("resultType", None)  # a 2026 protocol field; our clients do not know it
    return record


async def _clients(backend: Backend, params: _Params) -> dict[str, Any]:
    return {"clients": backend.clients()}


async def _recent_calls(backend: Backend, params: _Params) -> dict[str, Any]:
    return backend.recent_calls()


async def _logs(backend: Backend, params: _Logs) -> dict[str, Any]:
    return {"lines": backend.logs(params.name, params.lines)}


async def _reload(backend: Backend, params: _Params) -> dict[str, Any]:
    return await backend.reload()


async def _approve(backend: Backend, params: _Approve) -> dict[str, Any]:
    return {"approved": await backend.approve(params.name, params.tool)}


async def _explain(backend: Backend, params: _Name) -> dict[str, Any]:
    return {"lines": await backend.explain(params.name)}


async def _login(backend: Backend, params: _Login) -> dict[str, Any]:
    return await backend.login(params.name, device=params.device)


async def _login_wait(backend: Backend, params: _LoginWait) -> dict[str, Any]:
    return (await backend.login_wait(params.name, params.wait)).as_dict()


async def _logout(backend: Backend, params: _Name) -> dict[str, Any]:
    return await backend.logout(params.name)


async def _dashboard(backend: Backend, params: _Dashboard) -> dict[str, Any]:
    return await backend.dashboard(read_only=params.read_only)


async def _health(backend: Backend, params: _Health) -> dict[str, Any]:
    if params.format == "prometheus":
        return {"text": backend.metrics_text()}
    return backend.health()


METHODS: Mapping[str, Method] = MappingProxyType(
    {
        "status": Method(_OptionalName, _status),
        "start": Method(_Action, _start),
        "stop": Method(_Action, _stop),
        "restart": Method(_Action, _restart),
        "tools": Method(_OptionalName, _tools),
        "call": Method(_Call, _call, streams=True),
        "logs": Method(_Logs, _logs),
        "clients": Method(_Params, _clients),
        "recent_calls": Method(_Params, _recent_calls),
        "reload": Method(_Params, _reload),
        "health": Method(_Health, _health),
        "approve": Method(_Approve, _approve),
        "explain": Method(_Name, _explain),
        "login": Method(_Login, _login),
        "login_wait": Method(_LoginWait, _login_wait),
        "logout": Method(_Name, _logout),
        "dashboard": Method(_Dashboard, _dashboard),
    }
)
