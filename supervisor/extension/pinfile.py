"""The pins of one extension on disk: one JSON file, bounded, private, replaced whole.

``<state>/pins/<daemon instance>/NAME.json``, 0600 in 0700 directories, at most
:data:`MAX_BYTES` (past it the pinned texts are left out: the hashes always fit); an
unreadable, oversized or malformed file is ignored with a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from supervisor.privatefiles import write_private

__all__ = ("HASH_CHARS", "MAX_BYTES", "MAX_TOOLS", "PARTS", "VERSION", "Pin", "PinStore", "digest_of")

log = structlog.get_logger(__name__)

MAX_BYTES = 4 * 1024 * 1024  # one pin file; past it the texts are left out (the hashes always fit)
VERSION = 1
HASH_CHARS = 32  # hex: 128 bits of sha256
PARTS = ("title", "description", "inputSchema", "outputSchema", "annotations", "execution", "_meta")
MAX_TOOLS = 1024  # pins per extension


@dataclass(slots=True)
class Pin:
    """One tool's pin: the hash of each part, and while the server differs, what it differs with."""

    pinned: dict[str, str]
    seen: dict[str, str] | None = None  # the server's definition while it differs from the pin
    since: str | None = None  # when it began to differ (ISO 8601)
    text: dict[str, Any] | None = None  # the pinned definition's parts, if known and small enough
    seen_text: dict[str, Any] | None = None  # the differing definition's (in memory only)


class PinStore:
    """The pin file of extension *name* in *directory*. Blocking methods: call them in a thread."""

    def __init__(self, directory: Path, name: str) -> None:
        self.name = name
        self.path = directory / f"{name}.json"

    def load(self) -> dict[str, Pin]:
        """The saved pins (empty when absent; or unusable, with a warning). Bounded read."""
        try:
            with self.path.open("rb") as file:
                data = file.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("pins.unreadable", extension=self.name, path=str(self.path), error=str(exc))
            return {}
        try:
            if len(data) > MAX_BYTES:
                raise ValueError("too large")
            return self._parse(json.loads(data))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            log.warning("pins.ignored", extension=self.name, path=str(self.path), reason=reason)
            return {}

    def _parse(self, record: Any) -> dict[str, Pin]:
        if not isinstance(record, dict) or record.get("version") != VERSION:
            raise ValueError("not a pin file of this version")
        if record.get("extension") != self.name:
            raise ValueError("written for another extension")
        pins: dict[str, Pin] = {}
        for name, entry in list(record["tools"].items())[:MAX_TOOLS]:
            seen, since = entry.get("seen"), entry.get("since")
            if not isinstance(name, str) or not isinstance(since, str | None):
                raise ValueError("malformed entry")
            pinned = digest_of(entry["pinned"])
            text = entry.get("text")
            if not isinstance(text, dict | None):
                raise ValueError("malformed entry")
            pins[name] = Pin(pinned, digest_of(seen) if seen is not None else None, since, text)
        return pins

    def save(self, record: dict[str, Any]) -> bool:
        """Replace the file with *record* atomically (without the texts, if they make it too
        large); False (with a warning) if it cannot."""
        data = json.dumps(record, separators=(",", ":")).encode()
        if len(data) > MAX_BYTES:
            log.warning("pins.texts_left_out", extension=self.name, bytes=len(data))
            for entry in record["tools"].values():
                entry.pop("text", None)
            data = json.dumps(record, separators=(",", ":")).encode()
        if len(data) > MAX_BYTES:
            log.warning("pins.not_saved", extension=self.name, reason="too large", bytes=len(data))
            return False
        try:
            write_private(self.path, data)
        except OSError as exc:
            log.warning("pins.not_saved", extension=self.name, path=str(self.path), error=str(exc))
            return False
        return True


def digest_of(value: Any) -> dict[str, str]:
    """*value* if it is a digest (a hash per part), else ValueError."""
    if not isinstance(value, dict) or not all(
        part in PARTS and isinstance(h, str) and len(h) == HASH_CHARS for part, h in value.items()
    ):
        raise ValueError("malformed digest")
    return dict(value)
