"""Long strings found in a JSON answer as it streams, before anything parses it. Pure.

A remote server's tool result arrives as bytes: one JSON body, or events whose ``data`` lines
hold the JSON. Media in it is a long base64 string under a ``data`` or ``blob`` key
(:mod:`.media`); parsed whole, a 20 MiB image is 27 MiB of text held at once, then more as a
Python string. :class:`JsonScanner` passes every byte through as it comes but the content of
such a string once it runs longer than *longer_than*: that goes to a sink (a file), and a
short placeholder the sink names takes its place in the text. Whether it was media at all is
decided later, on the parsed message, where the string's siblings are known (the sink's file
is read back if not). :class:`EventScanner` does the same for an event stream, where each
event is a JSON text of its own.

Bounds: nothing is held but one string's first *longer_than* bytes and a few bytes of state;
each chunk is searched, not walked byte by byte. Malformed input is passed on as it is (the
parser after us says what is wrong), with at worst a sink ended early.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

__all__ = ("MEDIA_KEYS", "Divert", "EventScanner", "JsonScanner", "Sink")

MEDIA_KEYS = frozenset({b"data", b"blob"})  # the keys whose long strings may be media
MAX_FIELD = 16  # bytes of an event line's field name held until its colon: longer is no field of ours
_WHITESPACE = b" \t\r\n"
_QUOTE_OR_ESCAPE = re.compile(rb'["\\]')
_FIELD_END = re.compile(rb"[:\r\n]")
_LINE_END = re.compile(rb"[\r\n]")
_OUT, _STRING, _HELD, _DIVERTED = range(4)  # outside a string; in one; in a candidate held; in one diverted


class Sink(Protocol):
    """Where one long string's content goes (its bytes as they are in the JSON, escapes included)."""

    def write(self, data: bytes) -> None: ...

    def end(self) -> bytes:
        """The string ended: the placeholder that stands for it in the text."""
        ...


Divert = Callable[[], Sink | None]  # a sink for the next long string; None: keep it in the text


class JsonScanner:
    """One JSON text after another (:meth:`reset` between two), long ``data``/``blob`` strings
    diverted (see the module's docstring)."""

    __slots__ = (
        "_between", "_divert", "_escape", "_held", "_key", "_last_key", "_longer_than", "_sink", "_state",
    )  # fmt: skip

    def __init__(self, longer_than: int, divert: Divert) -> None:
        self._longer_than, self._divert = longer_than, divert
        self._begin()

    def _begin(self) -> None:
        self._state = _OUT
        self._escape = False  # the byte before was a backslash in a string
        self._key = bytearray()  # the current string's first bytes: is it "data" or "blob"?
        self._last_key: bytes | None = None  # the last string that ended, if short
        self._between = b""  # significant bytes since it ended (two at most): b":" makes it a key
        self._held = bytearray()  # a candidate's content, until it is long enough to divert
        self._sink: Sink | None = None

    def reset(self) -> None:
        """A new JSON text begins (an event ended): what the last one left open is dropped."""
        if self._sink is not None:
            self._sink.end()  # its placeholder is never seen: the text was broken off
        self._begin()

    def close(self) -> None:
        """The answer ended."""
        self.reset()

    def feed(self, data: bytes) -> bytes:
        """The next bytes of the text; what to pass on in their place."""
        out = bytearray()
        pos, end = 0, len(data)
        while pos < end:
            if self._state == _OUT:
                quote = data.find(b'"', pos)
                stop = end if quote < 0 else quote
                if len(self._between) < 2:
                    self._between = (self._between + data[pos:stop].translate(None, _WHITESPACE))[:2]
                out += data[pos:stop]
                if quote < 0:
                    break
                out += b'"'
                candidate = self._between == b":" and self._last_key in MEDIA_KEYS
                self._state = _HELD if candidate else _STRING
                self._key.clear()
                pos = quote + 1
            elif self._escape:  # the escaped byte: content, whatever it is
                self._escape = False
                self._content(out, data[pos : pos + 1])
                pos += 1
            else:
                found = _QUOTE_OR_ESCAPE.search(data, pos)
                stop = end if found is None else found.start()
                self._content(out, data[pos:stop])
                if found is None:
                    break
                if data[stop] == 0x5C:  # a backslash: it and the next byte are content
                    self._escape = True
                    self._content(out, b"\\")
                else:
                    self._close(out)
                pos = stop + 1
        return bytes(out)

    def _content(self, out: bytearray, piece: bytes) -> None:
        if self._state == _STRING:
            out += piece
            if len(self._key) <= 4:
                self._key += piece[:5]
        elif self._state == _DIVERTED:
            assert self._sink is not None
            self._sink.write(piece)
        else:  # held: diverted once it is long enough, if a sink takes it
            self._held += piece
            if len(self._held) > self._longer_than:
                self._sink = self._divert()
                if self._sink is None:
                    out += self._held
                    self._key += b"(long)"  # so that it names no key when it ends
                    self._state = _STRING
                else:
                    self._sink.write(bytes(self._held))
                    self._state = _DIVERTED
                self._held.clear()

    def _close(self, out: bytearray) -> None:
        if self._state == _STRING:
            self._last_key = bytes(self._key) if len(self._key) <= 4 else None
        else:
            if self._state == _DIVERTED:
                assert self._sink is not None
                out += self._sink.end()
                self._sink = None
            else:
                out += self._held
                self._held.clear()
            self._last_key = None
        out += b'"'
        self._state = _OUT
        self._between = b""


class EventScanner:
    """An event stream: each ``data`` line's bytes through a :class:`JsonScanner`, which starts
    anew with each event (a blank line); every other byte passes as it is."""

    __slots__ = ("_after_cr", "_field", "_json", "_space", "_state")

    _START, _DATA, _OTHER = range(3)

    def __init__(self, json: JsonScanner) -> None:
        self._json = json
        self._state = self._START
        self._field = bytearray()  # the line's field name so far
        self._after_cr = False  # the last line ended with CR: an LF next is the same line end
        self._space = False  # a data line's value has not begun: one space there is no data

    def close(self) -> None:
        """The stream ended."""
        self._json.reset()

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        pos, end = 0, len(data)
        while pos < end:
            if self._after_cr:
                self._after_cr = False
                if data[pos] == 0x0A:
                    out.append(0x0A)
                    pos += 1
                    continue
            if self._state == self._START:
                found = _FIELD_END.search(data, pos)
                stop = end if found is None else found.start()
                self._field += data[pos:stop]
                if found is None or len(self._field) > MAX_FIELD:
                    if len(self._field) > MAX_FIELD:
                        out += self._field
                        self._field.clear()
                        self._state = self._OTHER
                        pos = stop if found is not None else end
                        continue
                    break
                out += self._field
                if data[stop] == 0x3A:  # the colon: the value follows
                    self._state = self._DATA if self._field == b"data" else self._OTHER
                    self._space = True
                elif not self._field:  # a blank line: the event ends
                    self._json.reset()
                    self._after_cr = data[stop] == 0x0D
                else:
                    self._after_cr = data[stop] == 0x0D
                out.append(data[stop])
                self._field.clear()
                pos = stop + 1
            else:
                found = _LINE_END.search(data, pos)
                stop = end if found is None else found.start()
                piece = data[pos:stop]
                if self._state == self._DATA:
                    if self._space and piece:
                        self._space = False
                        if piece[0] == 0x20:
                            out.append(0x20)
                            piece = piece[1:]
                    out += self._json.feed(piece)
                else:
                    out += piece
                if found is None:
                    break
                out.append(data[stop])
                self._after_cr = data[stop] == 0x0D
                self._state = self._START
                pos = stop + 1
        return bytes(out)
