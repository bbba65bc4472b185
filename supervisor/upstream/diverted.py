"""Long strings of a remote answer kept on disk while it streams, and put back or spooled after.

:mod:`.scan` finds a long ``data``/``blob`` string in an answer's bytes; :class:`Diversions`
gives it a :class:`Diversion`, a 0600 file in the extension's spool directory that takes the
string's bytes as they come, and a placeholder (``mcp-supervisor-diverted:<random>``) takes its
place in the text the SDK parses. Once the message is parsed, :meth:`Diversions.resolving`
hands the spool the placeholders of a tool result (:meth:`.spool.Spool.rewrite` decodes media
from the file into its own, never holding it whole), and every placeholder left, media kept
inline or a long string that was no media, gets its text back. So a remote server's image
costs the daemon about one read buffer, as a child's costs its line.

Bounds: at most :data:`MAX_PENDING` diversions at once per run (past that a string stays in
the text, bounded by ``max_message_bytes`` as before), each file removed once its message is
resolved (one broken off mid-string at once: no message will name it), and every one when the
run ends. A placeholder a server sends itself names no diversion (each is random) and stays
as it is.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.upstream.media import MAX_DEPTH
from supervisor.upstream.scan import Scanner

if TYPE_CHECKING:
    import mcp_types as types

__all__ = ("MAX_PENDING", "PREFIX", "Diversion", "Diversions", "Rewrite")

PREFIX = "mcp-supervisor-diverted:"
MAX_PENDING = 8  # diversions of one run not yet resolved
READ_CHUNK = 1 << 20  # base64 characters decoded per step (a multiple of 4)


Rewrite = Callable[[Any, Mapping[str, "Diversion"]], object]  # the spool's: a tool result, its diversions


class Diversion:
    """One long string's content on disk (the :class:`.scan.Sink` of it), as the JSON had it."""

    __slots__ = ("_fd", "_forget", "escaped", "length", "path", "placeholder", "tail")

    def __init__(self, path: Path, placeholder: str, forget: Callable[[], object] = lambda: None) -> None:
        self.path, self.placeholder, self._forget = path, placeholder, forget
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.length = 0
        self.tail = b""  # its last two bytes: the base64 padding
        self.escaped = False  # a backslash in it: only json can read it back

    def write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self.length += len(data)
        self.tail = (self.tail + data[-2:])[-2:]
        self.escaped = self.escaped or b"\\" in data

    def end(self) -> bytes:
        self._close()
        return self.placeholder.encode()

    def abandon(self) -> None:
        """Broken off (a call given up mid-answer): no message will name it, so it goes now,
        file and slot, not when the run ends."""
        self.remove()
        self._forget()

    def decoded_size(self) -> int | None:
        """Bytes it decodes to as base64; None when it cannot be (or only through json)."""
        if self.escaped or self.length % 4:
            return None
        return self.length // 4 * 3 - self.tail.count(b"=")

    def decode_into(self, path: Path) -> str:
        """Decode it into a new 0600 file at *path*, in chunks; the sha256 of the bytes."""
        digest = hashlib.sha256()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out, self.path.open("rb") as source:
            while chunk := source.read(READ_CHUNK):
                decoded = base64.b64decode(chunk, validate=True)
                digest.update(decoded)
                out.write(decoded)
        return digest.hexdigest()

    def text(self) -> str:
        """The string itself, as the parser would have made it (in memory: it stays inline)."""
        raw = self.path.read_bytes()
        return json.loads(b'"' + raw + b'"') if self.escaped else raw.decode("utf-8", "replace")

    def remove(self) -> None:
        self._close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Diversions:
    """One run's diversions, filed in *directory* (created 0700 when first needed), for strings
    longer than *longer_than* bytes."""

    def __init__(self, directory: Path, longer_than: int, rewrite: Rewrite, limit: int = MAX_PENDING) -> None:
        self._directory, self._longer_than, self._limit = directory, longer_than, limit
        self._rewrite = rewrite
        self._pending: dict[str, Diversion] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def scanner(self) -> Scanner:
        """A scanner for one answer (a JSON body or an event stream)."""
        return Scanner(self._longer_than, self._divert)

    def _divert(self) -> Diversion | None:
        if len(self._pending) >= self._limit:
            return None
        token = secrets.token_urlsafe(16)
        try:
            self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            placeholder = PREFIX + token
            forget = functools.partial(self._pending.pop, placeholder, None)
            diversion = Diversion(self._directory / f".diverted-{token}", placeholder, forget)
        except OSError:
            return None  # it stays in the text, as without diversions
        self._pending[diversion.placeholder] = diversion
        return diversion

    @contextlib.contextmanager
    def resolving(self, root: Any) -> Iterator[Mapping[str, Diversion]]:
        """The diversions whose placeholders are in *root* (a parsed message's dicts and lists),
        for the spool to decode (those it can); on leaving, every placeholder still in *root*
        gets its text back, and their files go. Blocking (file reads)."""
        if not self._pending:
            yield {}
            return
        found = self._placeholders(root)
        try:
            readable = {key: diversion for key, diversion in found.items() if not diversion.escaped}
            if len(readable) < len(found):
                _restore(root, {key: found[key] for key in found.keys() - readable.keys()})
            yield readable
            _restore(root, found)
        finally:
            for key, diversion in found.items():
                self._pending.pop(key, None)
                diversion.remove()

    def spool(self, message: Any) -> None:
        """*message* (a tool result) through the spool's rewrite, its diversions given: media
        is decoded from their files, the rest put back. Blocking."""
        with self.resolving(message) as diverted:
            self._rewrite(message, diverted)

    def put_back(self, message: types.JSONRPCMessage) -> None:
        """Every long string of *message* kept on disk back in it (the spool takes media from a
        tool result only: :meth:`spool`). Blocking."""
        error = getattr(message, "error", None)  # the SDK's models, not imported: a light module
        if error is not None:
            holder = {"data": error.data}
            with self.resolving(holder):
                pass
            error.data = holder["data"]
            return
        result = getattr(message, "result", None)
        with self.resolving(result if result is not None else getattr(message, "params", None)):
            pass

    def close(self) -> None:
        """The run ended: every diversion left goes (a message that never parsed, say)."""
        pending, self._pending = self._pending, {}  # a resolving thread may still pop from it
        for diversion in pending.values():
            diversion.remove()

    def _placeholders(self, root: Any) -> dict[str, Diversion]:
        pending = self._pending
        found = ((holder[key], pending.get(holder[key])) for holder, key in _strings(root))
        return {placeholder: diversion for placeholder, diversion in found if diversion is not None}


def _restore(root: Any, diversions: Mapping[str, Diversion]) -> None:
    """Each placeholder of *diversions* in *root* replaced by its string."""
    for holder, key in _strings(root):
        diversion = diversions.get(holder[key])
        if diversion is not None:
            holder[key] = diversion.text()


def _strings(root: Any) -> Iterator[tuple[Any, Any]]:
    """(holder, key) of every string that may be a placeholder in *root*, MAX_DEPTH deep."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            continue
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, str):
                if value.startswith(PREFIX):
                    yield node, key
            elif isinstance(value, dict | list):
                stack.append((value, depth + 1))
