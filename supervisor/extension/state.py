"""The extension state machine's vocabulary: states, exit records and the status snapshot.

::

                  start()                handshake ok
    STOPPED ───────────────▶ STARTING ──────────────────▶ RUNNING
       ▲                      ▲    │ spawn/handshake          │ exit / crash
       │ stop()               │    │ failed                   ▼
       │                      └────┴──────────────────── BACKOFF  (policy says restart)
       │                                                      │
    STOPPING ◀── stop() from any live state                   │ policy says give up,
                                                              ▼ or a permanent error
                                                           FAILED
    A remote server that wants a login ends the watcher in NEEDS_LOGIN instead (not a failure:
    nothing restarts it until ``mcp-supervisor login`` succeeds, or a start).

A snapshot is immutable and written by the extension's watcher task only, so readers
(control socket, gateway) never take a lock and never see a half-updated record.
"""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = ("ExitStatus", "Snapshot", "State", "one_line")

SHOWN_LINE_CAP = 200  # characters of a child's stderr line shown in a status record

# ANSI escape sequences (npm's colours and spinners), then any other control or bidi character.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]+")


def one_line(text: str, limit: int = SHOWN_LINE_CAP) -> str:
    """*text* made safe to show in one table cell: no escapes or control characters, at most *limit*."""
    clean = " ".join(_CONTROLS.sub(" ", _ESCAPES.sub("", text[: limit * 4])).split())
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


class State(enum.StrEnum):
    STOPPED = enum.auto()
    STARTING = enum.auto()
    RUNNING = enum.auto()
    BACKOFF = enum.auto()
    STOPPING = enum.auto()
    FAILED = enum.auto()
    NEEDS_LOGIN = "needs-login"  # a remote server wants a person to log in: no restart until one does

    @property
    def is_live(self) -> bool:
        """A watcher task exists for this state (it may be about to restart the child)."""
        return self in (State.STARTING, State.RUNNING, State.BACKOFF, State.STOPPING)

    def remedy(self, name: str) -> str:
        """What brings extension *name* back from this state (not running), in the user's words."""
        if self is State.NEEDS_LOGIN:
            return f"log in with `mcp-supervisor login {name}`"
        return f"start it with `mcp-supervisor start {name}`"

    @property
    def is_transient(self) -> bool:
        """The extension is on its way to running; a call may wait for it."""
        return self in (State.STARTING, State.BACKOFF)


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How one child process ended: an exit code, or the signal that killed it."""

    returncode: int
    at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        return f"killed by {self.signal_name}" if self.signal_name else f"exited with code {self.returncode}"

    def as_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"at": self.at.isoformat()}
        if self.signal_name:
            record["signal"] = self.signal_name
        else:
            record["code"] = self.returncode
        return record


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One extension's status at one moment."""

    name: str
    state: State
    since: datetime
    pid: int | None = None
    run: str | None = None  # the running run's id (see Extension.run_id); None between runs
    restarts: int = 0  # automatic restarts since the extension was created
    failures: int = 0  # consecutive runs that did not stay up for backoff.reset_after
    last_exit: ExitStatus | None = None
    last_error: str | None = None
    tools: int = 0
    next_restart: datetime | None = None
    in_flight: int = 0
    waiting: str | None = None  # while starting: the MCP request the child has not answered yet
    last_stderr: str | None = None  # the last line this run wrote to stderr, made safe by one_line
    detail: str | None = None  # "on demand": stopped, and the next call starts it; starting: queued, slow
    queued: int | None = None  # starting, waiting for a start slot: the place in the queue (1: next)
    instances: tuple[Snapshot, ...] = ()  # per-client instances (instances: per-client)
    unresponsive: int = 0  # runs ended by liveness: "not answering"
    memory_exceeded: int = 0  # runs ended by memory_max
    resources: dict[str, Any] | None = None  # the tree's processes, RSS, CPU (filled in by status)
    sandbox: dict[str, Any] | None = None  # mode ("confined" | "off"), network, grants digest
    remote: dict[str, Any] | None = None  # a remote server's url; running: transport, protocol, rtt_ms

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready status record of the control protocol."""
        return {
            "name": self.name,
            "state": self.state.value,
            "since": self.since.isoformat(),
            "pid": self.pid,
            "restarts": self.restarts,
            "failures": self.failures,
            "last_exit": self.last_exit.as_dict() if self.last_exit else None,
            "last_error": self.last_error,
            "tools": self.tools,
            "next_restart": self.next_restart.isoformat() if self.next_restart else None,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "last_stderr": self.last_stderr,
            "detail": self.detail,
            "queued": self.queued,
            "instances": [
                {
                    "pid": i.pid,
                    "state": i.state.value,
                    "since": i.since.isoformat(),
                    "queued": i.queued,
                    "in_flight": i.in_flight,
                    "restarts": i.restarts,
                    "resources": i.resources,
                }
                for i in self.instances
            ],
            "unresponsive": self.unresponsive,
            "memory_exceeded": self.memory_exceeded,
            "resources": self.resources,
            "sandbox": self.sandbox,
            "remote": self.remote,
        }
