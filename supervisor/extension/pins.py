"""Pinned tool definitions: the "rug pull" defence.

The first definition seen of each tool of an extension is pinned: a hash of each part of it
that clients rely on (:data:`PARTS`: what the model reads, what the client validates, the hints
an auto-approval trusts). A later definition that differs, at a restart or after the server's
``list_changed``, is a *change*: logged once as ``tool.changed`` with the parts that differ
(never the definitions), and handled as ``tools_on_change`` says:

- ``allow``: the new definition is pinned at once (logged at info);
- ``warn``: served as is, logged as a warning, shown as changed until approved;
- ``hold``: as ``warn``, and gateway clients neither see nor can call the tool until approved.

:meth:`Pins.approve` (``mcp-supervisor approve NAME [TOOL]``) pins the current definitions; a
server that changes a tool back to its pinned definition ends the change by itself. A new tool
is pinned on first sight; a tool the server stops listing keeps its pin, so coming back changed
is still a change. At most :data:`MAX_TOOLS` pins per extension: past it, pins of tools no
longer listed go first (oldest first), and tools beyond it are not pinned (warned once).

Beside each hash the pin keeps the pinned definition's text (its :data:`PARTS`, up to
:data:`MAX_TEXT` bytes; past it, the hash alone), so that a change can be shown as a diff
(``tools`` with its ``changed`` record: ``pinned`` and ``now``). A pin from before texts were
kept gets its text from the first listing that matches its hash.

The pins of one extension are one JSON file beside the saved catalogs (:mod:`.pinfile`).
Per-client instances share their extension's :class:`Pins`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import mcp_types as types
import structlog

from supervisor.errors import SupervisorError
from supervisor.extension.pinfile import HASH_CHARS, MAX_BYTES, MAX_TOOLS, PARTS, VERSION, Pin, PinStore
from supervisor.upstream.listing import Listing

__all__ = (
    "MAX_BYTES",
    "MAX_CHANGE_EVENTS",
    "MAX_TEXT",
    "MAX_TOOLS",
    "PARTS",
    "Change",
    "PinStore",
    "Pins",
    "digest",
    "held_message",
)

log = structlog.get_logger(__name__)

Mode = Literal["allow", "warn", "hold"]
MAX_TEXT = 8 * 1024  # one pinned definition's text, as canonical JSON; a larger one: its hash only
MAX_CHANGE_EVENTS = 32  # tool.changed lines per listing; a server that changes all 500 tools: one more
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
)  # built once: 5x faster


def digest(tool: types.Tool) -> dict[str, str]:
    """The hash of each of *tool*'s :data:`PARTS` (an absent part hashes as ``null``). Pure."""
    plain = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {part: _hash(plain.get(part)) for part in PARTS}


def _hash(value: Any) -> str:
    text = _CANONICAL.encode(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


def _text(tool: types.Tool) -> dict[str, Any] | None:
    """*tool*'s :data:`PARTS` as plain JSON, or None past :data:`MAX_TEXT`. Pure."""
    plain = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    text = {part: plain[part] for part in PARTS if part in plain}
    return text if len(_CANONICAL.encode(text)) <= MAX_TEXT else None


def _differing(pinned: dict[str, str], current: dict[str, str]) -> list[str]:
    return [part for part in PARTS if part in pinned and part in current and pinned[part] != current[part]]


@dataclass(frozen=True, slots=True)
class Change:
    """A tool whose current definition differs from its pin."""

    tool: str
    parts: tuple[str, ...]  # of PARTS, those that differ
    held: bool  # hidden from gateway clients until approved (tools_on_change: hold)
    since: str | None
    pinned: dict[str, Any] | None = None  # the pinned definition's parts, where known
    now: dict[str, Any] | None = None  # the server's definition's parts, where known

    def as_dict(self, *, texts: bool = False) -> dict[str, Any]:
        """The record ``status`` and ``tools`` show; with *texts*, both definitions (for a diff)."""
        record = {"tool": self.tool, "parts": list(self.parts), "held": self.held, "since": self.since}
        if texts:
            record |= {"pinned": self.pinned, "now": self.now}
        return record


def held_message(extension: str, exposed: str, change: Change) -> str:
    """What a gateway client calling held tool *exposed* is told."""
    return (
        f"tool {exposed!r} is held: extension {extension!r} changed its {', '.join(change.parts)} since "
        f"it was pinned (tools_on_change: hold); an operator who accepts the new definition runs "
        f"`mcp-supervisor approve {extension} {change.tool}`"
    )


class Pins:
    """The pinned tool definitions of one extension, and what changed since.

    Args:
        name: the extension's name.
        mode: its ``tools_on_change``.
        store: where the pins persist; None: in memory only.
        on_change: called (sync) when the set of changed or held tools changes, so that the
            gateway lists again.

    Sync methods run in the event loop; :meth:`save` writes in a thread.
    """

    def __init__(
        self,
        name: str,
        *,
        mode: Mode,
        store: PinStore | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.mode: Mode = mode
        self._store = store
        self._on_change = on_change
        self._pins = store.load() if store is not None else {}
        self._dirty = False
        self._saving = anyio.Lock()
        self._full_warned = False
        self._events = 0  # tool.changed lines logged for the listing being observed
        self._shown: tuple[Listing, frozenset[str], Listing] | None = None  # shown()'s last answer

    def __len__(self) -> int:
        return len(self._pins)

    # ---- reading -------------------------------------------------------------------------

    def changes(self) -> dict[str, Change]:
        """Tools whose current definition differs from their pin, by name."""
        held = self.mode == "hold"
        return {
            name: Change(
                name, tuple(_differing(pin.pinned, pin.seen)), held, pin.since, pin.text, pin.seen_text
            )
            for name, pin in self._pins.items()
            if pin.seen is not None
        }

    def held(self) -> frozenset[str]:
        """The tools gateway clients must neither see nor call."""
        if self.mode != "hold":
            return frozenset()
        return frozenset(name for name, pin in self._pins.items() if pin.seen is not None)

    def shown(self, listing: Listing) -> Listing:
        """*listing* without the held tools; *listing* itself when none is in it (identity matters:
        the gateway compares listings by identity to decide what changed)."""
        held = self.held() & listing.tool_names
        if not held:
            return listing
        if self._shown is not None and self._shown[0] is listing and self._shown[1] == held:
            return self._shown[2]
        tools = tuple(tool for tool in listing.tools if tool.name not in held)
        shown = replace(listing, tools=tools, tool_names=listing.tool_names - held)
        self._shown = (listing, held, shown)
        return shown

    # ---- writing -------------------------------------------------------------------------

    def observe(self, tools: Sequence[types.Tool]) -> None:
        """A server's current tool definitions: pin the new ones, note (and log) the changes."""
        before = self.changes()
        self._events = 0
        current: dict[str, types.Tool] = {}
        for tool in tools:
            current.setdefault(tool.name, tool)  # listed twice: the first wins, as in the gateway
        new = []
        for name, tool in current.items():
            pin = self._pins.get(name)
            if pin is None:
                new.append(name)
            else:
                self._compare(name, pin, digest(tool), tool)
        if new:
            self._pin_new(new, current)
        if self._events > MAX_CHANGE_EVENTS:
            more = self._events - MAX_CHANGE_EVENTS
            log.warning(
                "tool.changed_more", extension=self.name, tools=more, hint=f"mcp-supervisor tools {self.name}"
            )
        if self.changes() != before:
            self._changed()

    def _compare(self, name: str, pin: Pin, current: dict[str, str], tool: types.Tool) -> None:
        missing = {part: h for part, h in current.items() if part not in pin.pinned}
        if missing:  # a part a newer version of this module hashes: adopted as it is now
            pin.pinned.update(missing)
            self._dirty = True
        parts = _differing(pin.pinned, current)
        if not parts:
            if pin.text is None and (text := _text(tool)) is not None:  # pinned before texts were kept
                pin.text = text
                self._dirty = True
            if pin.seen is not None:
                pin.seen = pin.since = pin.seen_text = None
                self._dirty = True
                log.info("tool.restored", extension=self.name, tool=name)
            return
        if self.mode == "allow":
            pin.pinned, pin.seen, pin.since, pin.text = current, None, None, _text(tool)
            self._dirty = True
            if self._count_event():
                log.info("tool.changed", extension=self.name, tool=name, parts=parts, on_change="allow")
            return
        if pin.seen == current:
            if pin.seen_text is None:  # known already (logged when first seen), from before a restart
                pin.seen_text = _text(tool)
            return
        pin.seen, pin.since, pin.seen_text = current, pin.since or _now(), _text(tool)
        self._dirty = True
        if self._count_event():
            log.warning(
                "tool.changed",
                extension=self.name,
                tool=name,
                parts=parts,
                on_change=self.mode,
                hint=f"mcp-supervisor approve {self.name} {name}",
            )

    def _count_event(self) -> bool:
        """Whether one more tool.changed fits in this listing's share (the rest: tool.changed_more)."""
        self._events += 1
        return self._events <= MAX_CHANGE_EVENTS

    def _pin_new(self, names: list[str], current: dict[str, types.Tool]) -> None:
        over = len(self._pins) + len(names) - MAX_TOOLS
        if over > 0:  # tools the server no longer lists give up their pins first, oldest first
            gone = [name for name in self._pins if name not in current][:over]
            for name in gone:
                del self._pins[name]
        room = max(0, MAX_TOOLS - len(self._pins))
        for name in names[:room]:
            self._pins[name] = Pin(digest(current[name]), text=_text(current[name]))
        self._dirty = True
        log.info("tool.pinned", extension=self.name, tools=min(room, len(names)), pinned=len(self._pins))
        if len(names) > room and not self._full_warned:
            self._full_warned = True
            unpinned = len(names) - room
            log.warning("tool.pins_full", extension=self.name, unpinned=unpinned, max_tools=MAX_TOOLS)

    def approve(self, tool: str | None = None) -> list[str]:
        """Pin the current definition of *tool* (None: of every changed tool); the names approved.

        Error handling: :class:`SupervisorError` when *tool* has no pin (the server never listed it).
        """
        if tool is not None and tool not in self._pins:
            raise SupervisorError(f"extension {self.name!r} has no pinned tool {tool!r}")
        names = [name for name, pin in self._pins.items() if pin.seen is not None and tool in (None, name)]
        for name in names:
            pin = self._pins[name]
            assert pin.seen is not None
            pin.pinned, pin.seen, pin.since = pin.seen, None, None
            pin.text, pin.seen_text = pin.seen_text, None
        if names:
            self._dirty = True
            log.info("tool.approved", extension=self.name, tools=names)
            self._changed()
        return names

    def set_mode(self, mode: Mode) -> None:
        """A reload's ``tools_on_change``; ``allow`` accepts what is pending at once."""
        if mode == self.mode:
            return
        self.mode = mode
        if mode == "allow":
            self.approve()
        if self.changes():
            self._changed()  # held or not: clients list again

    async def save(self) -> None:
        """Write the pins if they changed since the last write (in a thread, one write at a time)."""
        if self._store is None:
            self._dirty = False
            return
        async with self._saving:
            if not self._dirty:
                return
            self._dirty = False
            record = {"version": VERSION, "extension": self.name, "tools": self._record()}  # as of now
            await anyio.to_thread.run_sync(self._store.save, record)

    def _record(self) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        for name, pin in self._pins.items():
            entry: dict[str, Any] = {"pinned": pin.pinned}
            if pin.text is not None:
                entry["text"] = pin.text
            if pin.seen is not None:
                entry["seen"], entry["since"] = pin.seen, pin.since
            tools[name] = entry
        return tools

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
