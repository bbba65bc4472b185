"""Task ids and cursors as clients see them: pure mappings, so the gateway keeps no table of them.

A child's task *ID* of *EXTENSION*'s run *RUN* is ``EXTENSION:RUN:ID`` for clients (:func:`task_id`,
:func:`parse_task_id`); a ``tasks/list`` cursor encodes the extension, run, the child's own cursor
and an offset. The tasks capability handshake-era clients are told of is :func:`declare`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

import mcp_types as types
from mcp import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = (
    "MAX_ID_LENGTH",
    "declare",
    "decode_cursor",
    "encode_cursor",
    "invalid",
    "parse_task_id",
    "task_id",
)

MAX_ID_LENGTH = 4096  # a task id or cursor from a client, in characters
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # extension names (config.py), which never hold ":"
_RUN = re.compile(r"[0-9a-f]{12}")  # a run id (Extension.run_id)


def task_id(extension: str, run: str, child_id: str) -> str:
    """The id clients see for the task *child_id* of *extension*'s run *run*. Pure."""
    return f"{extension}:{run}:{child_id}"


def parse_task_id(value: str) -> tuple[str, str, str] | None:
    """(extension, run, child's id) of a :func:`task_id`, or None if *value* is not one. Pure."""
    extension, _, rest = value.partition(":")
    run, _, child_id = rest.partition(":")
    if _NAME.fullmatch(extension) and _RUN.fullmatch(run) and child_id:
        return extension, run, child_id
    return None


def declare(capabilities: types.ServerCapabilities, protocol_version: str | None) -> types.ServerCapabilities:
    """*capabilities* with the 2025-11-25 ``tasks`` capability, for handshake-era clients.

    Always, not only while some child has it: capabilities are fixed at ``initialize``, while
    children start, restart and are reloaded later; each tool's ``execution.taskSupport``
    (passed through whole) is what says which calls may be tasks.
    """
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        return capabilities
    tools = types.TasksToolsCapability(call=types.TasksCallCapability())
    tasks = types.ServerTasksCapability(
        list=types.TasksListCapability(),
        cancel=types.TasksCancelCapability(),
        requests=types.ServerTasksRequestsCapability(tools=tools),
    )
    return capabilities.model_copy(update={"tasks": tasks})


def invalid(message: str, **data: Any) -> MCPError:
    return MCPError(types.INVALID_PARAMS, message, data or None)


def encode_cursor(extension: str, run: str, child_cursor: str | None, offset: int) -> str:
    raw = json.dumps([extension, run, child_cursor, offset], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str) -> tuple[str, str, str | None, int]:
    """A cursor of :func:`encode_cursor`, or an error for the client (-32602)."""
    try:
        if len(cursor) > MAX_ID_LENGTH:
            raise ValueError("too long")
        value = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, binascii.Error, RecursionError):  # RecursionError: '[[[[...' nested deeply
        value = None
    if not (
        isinstance(value, list)
        and len(value) == 4
        and isinstance(value[0], str)
        and isinstance(value[1], str)
        and isinstance(value[2], str | None)
        and isinstance(value[3], int)
        and not isinstance(value[3], bool)
        and value[3] >= 0
    ):
        raise invalid("tasks/list: invalid cursor (use the nextCursor of a previous page)")
    return value[0], value[1], value[2], value[3]
