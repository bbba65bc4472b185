"""A 2025-11-25 MCP server with tasks: tools that run as tasks, and tasks/get|result|list|cancel.

Usage: ``tasks.py [PAGE_SIZE]`` (tasks per ``tasks/list`` page, default 50). Stdlib only.

Tools:

- ``slow(seconds=0.3, text="")``, ``execution.taskSupport: "required"``: a task that completes
  after *seconds* with the text ``done: TEXT``; called without ``task``, error -32601.
- ``quick(seconds=0.3, text="")``, ``"optional"``: as ``slow`` when called as a task; a plain
  call answers ``quick: TEXT`` at once.
- ``plain(text="")``, no ``execution``: echoes; called as a task, error -32601.
- ``ask()``, ``"required"``: a task that works until ``tasks/result`` is asked for it; then it
  asks the client (``elicitation/create``, its ``_meta`` naming the task by the server's own id
  as ``related-task``) and completes with ``answered: ACTION`` once the client answers.

Task ids are ``task-1``, ``task-2``, ... in every process, so two of these servers clash
(``TASK_ID_PAD=N`` in the environment appends N ``x`` to each: a child with absurd ids).
``tools/call`` with ``task`` answers a ``CreateTaskResult`` at once; the work finishes on a
timer. ``tasks/result`` blocks (in a thread of its own) until the task ends. When a task ends
the server sends ``notifications/tasks/status``. Requests are read one at a time; answers are
written whole, one line each, under a lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from datetime import UTC, datetime
from typing import Any

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
RELATED_TASK = "io.modelcontextprotocol/related-task"
SUPPORT = {"slow": "required", "quick": "optional", "plain": None, "ask": "required"}
TERMINAL = ("completed", "failed", "cancelled")

_out = sys.stdout.buffer
_write_lock = threading.Lock()
_state_lock = threading.Lock()
_tasks: dict[str, Task] = {}  # in creation order
_page_size = int(sys.argv[1]) if len(sys.argv) > 1 else 50
_answers: dict[str, tuple[threading.Event, list[dict[str, Any]]]] = {}  # our requests' answers, by id


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def send(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    with _write_lock:
        _out.write(line)
        _out.flush()


class Task:
    def __init__(self, task_id: str, ttl: int | None) -> None:
        self.task_id = task_id
        self.status = "working"
        self.created = self.updated = _now()
        self.ttl = ttl
        self.result: dict[str, Any] | None = None
        self.done = threading.Event()
        self.asks = False  # an ask() task: tasks/result asks the client first

    def describe(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttl": self.ttl,
            "pollInterval": 50,
        }

    def end(self, status: str, result: dict[str, Any] | None = None) -> bool:
        with _state_lock:
            if self.status in TERMINAL:
                return False
            self.status, self.result, self.updated = status, result, _now()
        self.done.set()
        send({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": self.describe()})
        return True


def _tool(name: str) -> dict[str, Any]:
    properties = {"seconds": {"type": "number"}, "text": {"type": "string"}}
    tool: dict[str, Any] = {"name": name, "inputSchema": {"type": "object", "properties": properties}}
    if SUPPORT[name] is not None:
        tool["execution"] = {"taskSupport": SUPPORT[name]}
    return tool


def _create(name: str, arguments: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    with _state_lock:
        pad = "x" * int(os.environ.get("TASK_ID_PAD", "0"))
        created = Task(f"task-{len(_tasks) + 1}{pad}", task.get("ttl"))
        _tasks[created.task_id] = created
    if name == "ask":
        created.asks = True
        return {"task": created.describe()}  # it works until tasks/result asks the client
    text = {"content": [{"type": "text", "text": f"done: {arguments.get('text', '')}"}], "isError": False}
    timer = threading.Timer(float(arguments.get("seconds", 0.3)), created.end, ("completed", text))
    timer.daemon = True
    timer.start()
    return {"task": created.describe()}


def _ask_client(task: Task) -> None:
    ask_id, waiter = f"ask-{task.task_id}", (threading.Event(), [])
    _answers[ask_id] = waiter
    params = {
        "message": "go on?",
        "requestedSchema": {"type": "object", "properties": {}},
        "_meta": {RELATED_TASK: {"taskId": task.task_id}},
    }
    send({"jsonrpc": "2.0", "id": ask_id, "method": "elicitation/create", "params": params})
    waiter[0].wait()
    action = waiter[1][0].get("result", {}).get("action", "error")
    task.end("completed", {"content": [{"type": "text", "text": f"answered: {action}"}], "isError": False})


def _result_later(msg_id: Any, task: Task) -> None:
    if task.asks and task.status == "working":
        _ask_client(task)
    task.done.wait()
    if task.status == "completed" and task.result is not None:
        related = {RELATED_TASK: {"taskId": task.task_id}}
        send({"jsonrpc": "2.0", "id": msg_id, "result": {**task.result, "_meta": related}})
    else:
        send(_error(msg_id, INVALID_PARAMS, f"task {task.task_id} was {task.status}"))


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def _handle(msg_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    if method == "initialize":
        tasks = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion") or "2025-11-25",
            "capabilities": {"tools": {}, "tasks": tasks},
            "serverInfo": {"name": "tasks", "version": "0.1.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": [_tool(name) for name in SUPPORT]}
    elif method == "tools/call":
        name, arguments, task = params.get("name"), params.get("arguments") or {}, params.get("task")
        if name not in SUPPORT:
            return _error(msg_id, INVALID_PARAMS, f"Unknown tool: {name}")
        if task is not None:
            if SUPPORT[name] is None:
                return _error(msg_id, METHOD_NOT_FOUND, f"Tool {name} does not support tasks")
            result = _create(name, arguments, task)
        elif SUPPORT[name] == "required":
            return _error(msg_id, METHOD_NOT_FOUND, f"Tool {name} must be called as a task")
        else:
            result = {"content": [{"type": "text", "text": f"{name}: {arguments.get('text', '')}"}]}
    elif method in ("tasks/get", "tasks/result", "tasks/cancel"):
        task = _tasks.get(params.get("taskId"))
        if task is None:
            return _error(msg_id, INVALID_PARAMS, f"Unknown task: {params.get('taskId')}")
        if method == "tasks/result":
            threading.Thread(target=_result_later, args=(msg_id, task), daemon=True).start()
            return None
        if method == "tasks/cancel" and not task.end("cancelled"):
            return _error(msg_id, INVALID_PARAMS, f"Cannot cancel task {task.task_id}: it is {task.status}")
        result = task.describe()
    elif method == "tasks/list":
        start = int(params.get("cursor") or 0)
        listed = list(_tasks.values())
        result = {"tasks": [task.describe() for task in listed[start : start + _page_size]]}
        if start + _page_size < len(listed):
            result["nextCursor"] = str(start + _page_size)
    else:
        return _error(msg_id, METHOD_NOT_FOUND, f"Method not found: {method}")
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def main() -> None:
    sys.stdout = sys.stderr  # a stray print() cannot corrupt the protocol stream
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = json.loads(line)
        if isinstance(msg, dict) and "method" not in msg and msg.get("id") in _answers:
            waiter = _answers.pop(msg["id"])
            waiter[1].append(msg)
            waiter[0].set()
        elif isinstance(msg, dict) and "id" in msg and "method" in msg:
            answer = _handle(msg["id"], msg["method"], msg.get("params") or {})
            if answer is not None:
                send(answer)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        main()
