"""The daemon's side of the control protocol, in memory: what the control server and the CLI talk to."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp_types as types

from supervisor.daemon.metrics import Metrics
from supervisor.errors import CallFailed, ConfigError, ExtensionUnavailable, SupervisorError, UnknownExtension
from supervisor.extension.state import ExitStatus, Snapshot, State

__all__ = ("PROCESS_KEYS", "SINCE", "Answer", "FakeBackend")

SINCE = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
PROCESS_KEYS = (
    "rss_bytes",
    "threads",
    "worker_threads",
    "blocking_calls",
    "open_fds",
    "asyncio_tasks",
    "uptime_s",
)
Answer = Callable[[str, dict[str, Any]], types.CallToolResult]  # (extension, arguments) -> result


def _unavailable(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    raise ExtensionUnavailable(name, "backoff", retryable=True, detail="restart in 1s")


def _broken(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    raise CallFailed("the extension closed the connection", code=-32000)


def _plain(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    raise SupervisorError("something the daemon refuses")


def _explode(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    raise RuntimeError("boom\nsecond line")


def _echo_json(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    text = types.TextContent(text=json.dumps(arguments))
    return types.CallToolResult(content=[text], structured_content={"echo": arguments})


ERRORS: dict[str, Answer] = {  # tools that fail each way a call can
    "unavailable": _unavailable,
    "broken": _broken,
    "plain": _plain,
    "explode": _explode,
}


def _cast() -> dict[str, Snapshot]:
    return {
        "alpha": Snapshot("alpha", State.RUNNING, SINCE, pid=101, tools=1),
        "beta": Snapshot("beta", State.STOPPED, SINCE, last_exit=ExitStatus(3, SINCE)),
    }


def _echo_tool() -> list[tuple[str, types.Tool]]:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    tool = types.Tool(
        name="echo",
        title="Echo",
        description="Echo text.",
        input_schema=schema,
        output_schema={"type": "object"},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
    return [("alpha", tool)]


class FakeBackend:
    """Extensions as snapshots, their tools, and an answer per tool name; records what it was asked.

    By default: alpha running with one tool, echo (answering its arguments as JSON), beta stopped;
    the tools in ERRORS fail each their own way. A failed extension stays failed when started.
    """

    def __init__(
        self,
        snapshots: Mapping[str, Snapshot] | None = None,
        tools: Sequence[tuple[str, types.Tool]] | None = None,
        answers: Mapping[str, Answer] | None = None,
        *,
        log_line: str | None = "x",
    ) -> None:
        self.snapshots = dict(snapshots if snapshots is not None else _cast())
        self._tools = list(tools if tools is not None else _echo_tool())
        self.answers = {**ERRORS, **(answers or {})}
        self.log_line = log_line  # every log line; None: numbered ones
        self.reload_errors: list[str] = []
        self.actions: list[tuple[str, str, bool]] = []
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.gate: anyio.Event | None = None  # when set, start() waits for it

    def _get(self, name: str) -> Snapshot:
        if name not in self.snapshots:
            raise UnknownExtension(name)
        return self.snapshots[name]

    def status(self, name: str | None = None) -> list[Snapshot]:
        return [self._get(name)] if name is not None else list(self.snapshots.values())

    async def _act(self, verb: str, name: str, wait: bool) -> Snapshot:
        old = self._get(name)
        self.actions.append((verb, name, wait))
        if verb == "start" and self.gate is not None:
            await self.gate.wait()
        if old.state is State.FAILED and verb != "stop":
            return old  # cannot start: stays failed
        if not wait:
            state = State.STOPPING if verb == "stop" else State.STARTING
        else:
            state = State.STOPPED if verb == "stop" else State.RUNNING
        pid = 5000 if state is State.RUNNING else None
        self.snapshots[name] = Snapshot(name, state, datetime.now(UTC), pid=pid, tools=1 if pid else 0)
        return self.snapshots[name]

    async def start(self, name: str, *, wait: bool = True) -> Snapshot:
        return await self._act("start", name, wait)

    async def stop(self, name: str, *, wait: bool = True) -> Snapshot:
        return await self._act("stop", name, wait)

    async def restart(self, name: str, *, wait: bool = True) -> Snapshot:
        return await self._act("restart", name, wait)

    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]:
        return f"{extension}__{tool}", None

    def collisions(self, extension: str) -> list[str]:
        return []

    def tool_changes(self, name: str, *, texts: bool = False) -> list[dict[str, Any]]:
        return []

    def clients(self) -> list[dict[str, Any]]:
        return []

    def recent_calls(self) -> dict[str, Any]:
        return {"bucket_seconds": 10.0, "extensions": {name: [] for name in self.snapshots}}

    async def dashboard(self, *, read_only: bool = False) -> dict[str, Any]:
        url = "http://127.0.0.1:1/dashboard/login?code=x"
        return {"url": url, "read_only": read_only, "expires_in": 120.0}

    async def approve(self, name: str, tool: str | None = None) -> list[str]:
        self._get(name)
        return []

    async def explain(self, name: str) -> list[str]:
        self._get(name)
        return [f"{name}: not sandboxed (sandbox: false): it can do whatever the daemon's user can"]

    def profiles(self) -> list[dict[str, Any]]:
        return []

    def tools(self, name: str | None = None) -> list[tuple[str, types.Tool]]:
        if name is not None:
            self._get(name)
        return [(ext, tool) for ext, tool in self._tools if name in (None, ext)]

    async def call(
        self, name: str, tool: str, arguments: dict[str, Any], *, progress: Any = None
    ) -> types.CallToolResult:
        self._get(name)
        self.calls.append((name, tool, arguments))
        return self.answers.get(tool, _echo_json)(name, arguments)

    def logs(self, name: str, lines: int) -> list[str]:
        self._get(name)
        if self.log_line is None:
            return [f"line {i}" for i in range(lines)]
        return [self.log_line] * lines

    async def reload(self) -> dict[str, list[str]]:
        if self.reload_errors:
            raise ConfigError(self.reload_errors)
        return {
            "added": ["gamma"],
            "removed": [],
            "restarted": [],
            "unchanged": ["alpha"],
            "needs_restart": [],
        }

    def health(self) -> dict[str, Any]:
        return {"process": {"pid": 1}, "spool": {"files": 0}, "extensions": []}

    def metrics_text(self) -> str:
        return Metrics(
            lambda: {
                "process": dict.fromkeys(PROCESS_KEYS, 0),
                "spool": {"bytes": 0, "files": 0},
                "extensions": [],
            }
        ).render()
