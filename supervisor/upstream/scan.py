"""Long strings found in a JSON answer as it streams, before anything parses it. Pure.

A remote server's tool result arrives as bytes: one JSON body, or events whose ``data`` lines
hold the JSON. Media in it is a long base64 string under a ``data`` or ``blob`` key
(:mod:`.media`); parsed whole, a 20 MiB image is 27 MiB of text held at once, then more as a
Python string. :class:`Scanner` passes every byte through as it comes but the content of such
a string once it runs longer than *longer_than*: that goes to a sink (a file), and a short
placeholder the sink names takes its place in the text. Whether it was media at all is decided
later, on the parsed message, where the string's siblings are known (the sink's file is read
back if not).

How it finds them without a parser: in JSON a quote inside a string is escaped, so a quote not
after a backslash is the text's own, and ``"data": "`` made of such quotes opens a string
value of that key (:data:`KEY`; a closing quote is never followed by a letter). A string ends
at its next unescaped quote; a line break cannot be in one, so it ends a broken one too, which
also keeps a diversion within one event of a stream. Each chunk is searched by a regular
expression, not walked byte by byte: a small answer costs one search.

Bounds: nothing is held but one string's first *longer_than* bytes and :data:`TAIL` bytes of
the chunk before (a key cut in two). A key spaced out past that, or a value over two event
lines, stays in the text: the parser after us gets it as sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

__all__ = ("KEY", "TAIL", "Divert", "Scanner", "Sink")

KEY = re.compile(rb'"(?:data|blob)"[ \t\r\n]*:[ \t\r\n]*"')  # up to a value's opening quote
TAIL = 32  # bytes of the chunk before that a key may have begun in
_STOP = re.compile(rb'["\\\r\n]')  # what ends a string's plain run
_OUT, _HELD, _DIVERTED = range(3)  # outside a candidate; in one, held; in one, diverted


class Sink(Protocol):
    """Where one long string's content goes (its bytes as they are in the JSON, escapes included)."""

    def write(self, data: bytes) -> None: ...

    def end(self) -> bytes:
        """The string ended: the placeholder that stands for it in the text."""
        ...

    def abandon(self) -> None:
        """The answer broke off in the string: no placeholder stands for it, and none will."""
        ...


Divert = Callable[[], Sink | None]  # a sink for the next long string; None: keep it in the text


class Scanner:
    """One answer's bytes, a JSON body or an event stream, long ``data``/``blob`` strings
    diverted (see the module's docstring)."""

    __slots__ = ("_divert", "_escape", "_held", "_longer_than", "_sink", "_state", "_tail")

    def __init__(self, longer_than: int, divert: Divert) -> None:
        self._longer_than, self._divert = longer_than, divert
        self._state = _OUT
        self._escape = False  # the byte before was a backslash in a candidate
        self._held = bytearray()  # a candidate's content, until it is long enough to divert
        self._sink: Sink | None = None
        self._tail = b""  # the last bytes of the chunk before

    def feed(self, data: bytes) -> bytes:
        """The next bytes of the answer; what to pass on in their place."""
        out = bytearray()
        pos, end = 0, len(data)
        while pos < end:
            if self._state == _OUT:
                start = self._straddling(data) if pos == 0 else None
                if start is None:
                    found = _key(data, pos, self._tail)
                    if found is None:
                        out += data[pos:]
                        break
                    start = found[1]
                out += data[pos:start]
                self._state, pos = _HELD, start
            elif self._escape:  # the escaped byte: content, whatever it is
                self._escape = False
                self._content(out, data[pos : pos + 1])
                pos += 1
            else:
                found = _STOP.search(data, pos)
                stop = end if found is None else found.start()
                self._content(out, data[pos:stop])
                if found is None:
                    break
                if data[stop] == 0x5C:  # a backslash: it and the next byte are content
                    self._escape = True
                    self._content(out, b"\\")
                    pos = stop + 1
                else:  # its closing quote, or a line break in a broken string (passed on as it is)
                    self._close(out)
                    pos = stop
        self._tail = (self._tail + data[-TAIL:])[-TAIL:]
        return bytes(out)

    def close(self) -> None:
        """The answer ended: a string broken off is abandoned (its placeholder is never seen)."""
        if self._sink is not None:
            self._sink.abandon()
            self._sink = None
        self._state = _OUT

    def _straddling(self, data: bytes) -> int | None:
        """Where in *data* the value of a key begun in the chunk before opens, if one did."""
        if not self._tail:
            return None
        window, seen = self._tail + data[:TAIL], len(self._tail)
        found = _key(window, 0, b"")
        while found is not None and found[1] <= seen:  # wholly in the chunk before: taken there
            found = _key(window, found[0] + 1, b"")
        if found is None or found[0] >= seen:
            return None  # none, or wholly in this chunk: its own search finds it
        return found[1] - seen

    def _content(self, out: bytearray, piece: bytes) -> None:
        if self._state == _DIVERTED:
            assert self._sink is not None
            self._sink.write(piece)
            return
        self._held += piece
        if len(self._held) > self._longer_than:
            self._sink = self._divert()
            if self._sink is None:  # no sink: the string stays in the text, the rest passed on
                out += self._held
                self._held.clear()
                self._state, self._escape = _OUT, False  # no key can open inside a string
                return
            self._sink.write(bytes(self._held))
            self._held.clear()
            self._state = _DIVERTED

    def _close(self, out: bytearray) -> None:
        if self._state == _DIVERTED:
            assert self._sink is not None
            out += self._sink.end()
            self._sink = None
        else:
            out += self._held
            self._held.clear()
        self._state = _OUT


def _key(data: bytes, pos: int, before: bytes) -> tuple[int, int] | None:
    """Where in *data*, from *pos*, the next ``data``/``blob`` key starts, and where its value
    opens (just past its quote), if there is one; *before*: the bytes before *data*. A match whose
    first quote is escaped is none (the regex has no look-behind: with one it tries every byte,
    50 times slower)."""
    while (found := KEY.search(data, pos)) is not None:
        start = found.start()
        previous = data[start - 1 : start] if start else before[-1:]
        if previous != b"\\":
            return start, found.end()
        pos = start + 1
    return None
