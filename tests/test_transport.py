"""transport.py's line splitting: every byte scanned once, at most one partial line held."""

from __future__ import annotations

from supervisor.transport import LineSplitter


class TestLineSplitter:
    def test_lines_within_and_across_chunks(self) -> None:
        """Lines may end inside a chunk or span several; order and bytes are kept."""
        splitter = LineSplitter()
        assert splitter.feed(b"one\ntw") == [b"one"]
        assert splitter.feed(b"o\nthr") == [b"two"]
        assert splitter.feed(b"ee") == []
        assert splitter.pending == 5
        assert splitter.feed(b"\n\nfour\n") == [b"three", b"", b"four"]
        assert splitter.pending == 0

    def test_a_line_in_many_chunks(self) -> None:
        """A 1 MiB line fed in 4 KiB chunks comes out whole, once."""
        splitter = LineSplitter()
        payload = bytes(range(256)).replace(b"\n", b"x") * 4096
        out = [
            line
            for start in range(0, len(payload), 4096)
            for line in splitter.feed(payload[start : start + 4096])
        ]
        assert out == [] and splitter.pending == len(payload)
        assert splitter.feed(b"\n") == [payload]

    def test_partial_line_can_be_taken_or_discarded(self) -> None:
        """An over-long or unterminated line can be handed out or dropped, leaving nothing held."""
        splitter = LineSplitter()
        splitter.feed(b"abc")
        splitter.feed(b"def")
        assert splitter.take_partial() == b"abcdef" and splitter.pending == 0
        splitter.feed(b"ghi")
        splitter.discard()
        assert splitter.pending == 0 and splitter.feed(b"\n") == [b""]
