"""Who may see the dashboard: one-time codes, and the sessions they become.

``mcp-supervisor dashboard`` asks the daemon (over the control socket, whose peer is checked)
for a code; the URL it prints carries it once. The page exchanges it for a session cookie and
drops it from the address bar, so that no secret stays in a URL, a history or a screenshot.

Only digests of codes and sessions are kept, so a lookup's timing says nothing of a secret.
Both tables are bounded: at their caps the oldest entry goes.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ("CODE_TTL", "MAX_CODES", "MAX_SESSIONS", "SESSION_IDLE", "SESSION_MAX", "Passes", "Visit")

CODE_TTL = 120.0  # seconds a printed code may wait for its first load
MAX_CODES = 16  # codes not yet used; at the cap the oldest is forgotten
MAX_SESSIONS = 32  # browsers logged in at once; at the cap the one seen longest ago is ended
SESSION_IDLE = 3600.0  # a session unused this long is ended
SESSION_MAX = 12 * 3600.0  # and any session after this long


@dataclass(slots=True)
class Visit:
    """One browser's session."""

    read_only: bool
    created: float
    seen: float


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "replace")).digest()


class Passes:
    """One-time codes and the sessions they are exchanged for."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._codes: OrderedDict[bytes, tuple[float, bool]] = OrderedDict()  # digest -> (issued, read_only)
        self._sessions: OrderedDict[bytes, Visit] = OrderedDict()  # digest -> visit, least recent first

    def issue(self, *, read_only: bool) -> str:
        """A new one-time code."""
        code = secrets.token_urlsafe(32)
        self._codes[_digest(code)] = (self._clock(), read_only)
        while len(self._codes) > MAX_CODES:
            self._codes.popitem(last=False)
        return code

    def redeem(self, code: str) -> tuple[str, Visit] | None:
        """The session *code* opens (a new secret), once; None for a code unknown, used or expired."""
        issued = self._codes.pop(_digest(code), None)
        now = self._clock()
        if issued is None or now - issued[0] > CODE_TTL:
            return None
        secret = secrets.token_urlsafe(32)
        visit = Visit(read_only=issued[1], created=now, seen=now)
        self._sessions[_digest(secret)] = visit
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return secret, visit

    def visit(self, secret: str | None) -> Visit | None:
        """The live session of *secret* (and it counts as used now), or None."""
        if not secret:
            return None
        key = _digest(secret)
        visit = self._sessions.get(key)
        if visit is None:
            return None
        now = self._clock()
        if now - visit.seen > SESSION_IDLE or now - visit.created > SESSION_MAX:
            del self._sessions[key]
            return None
        visit.seen = now
        self._sessions.move_to_end(key)
        return visit

    def end(self, secret: str | None) -> None:
        if secret:
            self._sessions.pop(_digest(secret), None)

    @property
    def counts(self) -> tuple[int, int]:
        """Codes waiting and sessions open (for tests and ``health``)."""
        return len(self._codes), len(self._sessions)
