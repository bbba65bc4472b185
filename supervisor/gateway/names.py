"""The gateway's names: exposed tool and prompt names, and resource URIs, to and from the originals.

Pure: no I/O, no clock. A :class:`NameTable` is built from what the running extensions offer
and is the only place a name is decided, so the same inputs give the same names, in any order,
across restarts and reloads.

- A tool or prompt ``NAME`` of an extension with prefix ``PREFIX`` is exposed as
  ``PREFIX__NAME``. Every exposed name matches :data:`NAME_PATTERN`: other characters become
  ``_``, and a name over the budget keeps its readable start and ends in ``_`` plus a short
  hash of the whole original, stable across runs.
- Two entries that would get the same name never abort anything: the one that sorts first by
  (extension, original) keeps it, the other gets a hash suffix of its own, and the collision is
  recorded so that the log, ``status`` and ``tools`` can show it.
- A resource URI ``U`` of extension ``EXT`` is exposed as ``mcp-supervisor://EXT/U``: reversible,
  and a URI template stays a template (``{var}`` passes through untouched).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = (
    "NAME_PATTERN",
    "URI_SCHEME",
    "Collision",
    "NameTable",
    "expose",
    "expose_uri",
    "parse_uri",
)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEPARATOR = "__"
URI_SCHEME = "mcp-supervisor"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_TAG_LENGTH = 6  # hex digits: 16M values, plenty for one host's tools


def _tag(*parts: str) -> str:
    digest = hashlib.blake2s("\0".join(parts).encode("utf-8", "surrogatepass"), digest_size=8)
    return digest.hexdigest()[:_TAG_LENGTH]


def _shorten(full: str, budget: int, tag: str) -> str:
    return f"{full[: budget - len(tag) - 1]}_{tag}"


def expose(prefix: str, name: str, budget: int = 64) -> str:
    """``prefix__name``, made safe for clients and at most *budget* characters. Pure, stable."""
    full = _UNSAFE.sub("_", f"{prefix}{SEPARATOR}{name}")
    if len(full) <= budget:
        return full
    return _shorten(full, budget, _tag(prefix, name))


@dataclass(frozen=True, slots=True)
class Collision:
    """Two originals wanted one exposed name; ``loser`` was given ``given`` instead."""

    wanted: str
    winner: tuple[str, str]  # (extension, original)
    loser: tuple[str, str]
    given: str

    def describe(self) -> str:
        return (
            f"{self.loser[0]}/{self.loser[1]} is exposed as {self.given!r}: "
            f"{self.wanted!r} is taken by {self.winner[0]}/{self.winner[1]}"
        )


class NameTable:
    """Exposed names to (extension, original) and back, for one kind (tools or prompts).

    Build it with :meth:`build` from ``(extension, prefix, original)`` triples.
    """

    def __init__(self, forward: Mapping[tuple[str, str], str], collisions: tuple[Collision, ...]) -> None:
        self._forward = dict(forward)
        self._backward = {exposed: key for key, exposed in self._forward.items()}
        self.collisions = collisions

    @classmethod
    def build(cls, entries: Iterable[tuple[str, str, str]], budget: int = 64) -> NameTable:
        wanted = sorted(
            (expose(prefix, original, budget), extension, original) for extension, prefix, original in entries
        )
        taken: dict[str, tuple[str, str]] = {}
        forward: dict[tuple[str, str], str] = {}
        collisions: list[Collision] = []
        for name, extension, original in wanted:
            key = (extension, original)
            if key in forward:  # the same original listed twice by one server: first one wins
                continue
            given = name
            salt = 0
            while given in taken:
                salt += 1
                given = _shorten(name, budget, _tag(extension, original, str(salt)))
            if given != name:
                collisions.append(Collision(name, taken[name], key, given))
            taken[given] = key
            forward[key] = given
        return cls(forward, tuple(collisions))

    def exposed(self, extension: str, original: str) -> str | None:
        return self._forward.get((extension, original))

    def resolve(self, exposed: str) -> tuple[str, str] | None:
        """The (extension, original) behind an exposed name, or None if no entry has it."""
        return self._backward.get(exposed)

    def __len__(self) -> int:
        return len(self._forward)


def expose_uri(extension: str, uri: str) -> str:
    """The URI (or URI template) clients see for *uri* of *extension*."""
    return f"{URI_SCHEME}://{extension}/{uri}"


def parse_uri(uri: str) -> tuple[str, str] | None:
    """(extension, original URI) of an exposed URI, or None if it is not one of ours."""
    head = f"{URI_SCHEME}://"
    if not uri.startswith(head):
        return None
    extension, slash, original = uri[len(head) :].partition("/")
    if not extension or not slash or not original:
        return None
    return extension, original
