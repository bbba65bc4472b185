"""The daemon's stream over a handed-off client's own stdin and stdout, its journal kept as it goes.

An :class:`~supervisor.sockets.FdStream` over two fds (pipes or sockets) that ``connect``
handed over. Every byte read goes into the journal's ring as it is read, before anyone sees
it, and an answer left half-written is marked there, so that connect can carry on if the
daemon dies.

Resource handling: the stream owns both fds and closes them in ``aclose``.
"""

from __future__ import annotations

import os

from supervisor.gateway.handoff.journal import Journal
from supervisor.streams import FdStream

__all__ = ("HandedStream",)


class HandedStream(FdStream):
    def __init__(self, stdin: int, stdout: int, journal: Journal) -> None:
        super().__init__(stdin, stdout)  # owned from here: closed by aclose()
        self.journal = journal
        os.set_blocking(stdin, False)
        os.set_blocking(stdout, False)

    def _recv(self, max_bytes: int) -> bytes:
        data = os.read(self._read_fd, max_bytes)
        self.journal.record(data)
        return data

    def _send(self, data: bytes | memoryview) -> int:
        written = os.write(self._write_fd, data)
        if written < len(data):
            self.journal.mid_line(True)  # its sender finishes it with send()
        return written

    async def send(self, item: bytes | memoryview) -> None:
        """Write all of *item*: the rest of a line, or a whole one."""
        await super().send(item)
        self.journal.mid_line(False)

    async def send_eof(self) -> None:
        """Nothing to do: the client's stdout is closed once connect exits."""

    def _close_fds(self) -> None:
        try:
            os.close(self._read_fd)
        finally:
            os.close(self._write_fd)
