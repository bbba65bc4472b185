"""The journal of a handed-off session: what ``connect`` needs to carry the client on if the daemon dies.

A memfd that the daemon creates, maps and sends back with its answer to the handoff;
``connect`` reads it only once the daemon is gone (its socket ended without a bye). The daemon
writes it as it serves, with no system call:

- the input ring: the bytes read from the client's stdin and not yet taken, from ``consumed``
  to ``filled`` (a partial line, or lines read and not yet served): connect sends them on to
  the next daemon;
- the slot table: the ids of the requests taken and not yet answered in full: connect
  answers each with an error (it may or may not have run);
- ``mid_line``: an answer is half-written to stdout: connect ends the line.

Order of writes: a request's id is in the table before its line leaves the ring, so a request
is re-sent or answered with an error, never lost; connect drops a re-sent request whose id is
in the table (the error answers it). A slot's length is written after its bytes. An id too
long for a slot goes over the socket instead (:data:`~supervisor.gateway.hello.HELD_LONG`).

Pure layout, reader and writer (``mmap``, ``struct``): connect imports it.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ("SLOTS", "Journal", "Recovered", "recover")

SLOTS = 64  # requests in flight per client (the listener's MAX_IN_FLIGHT); past it, over the socket
_SLOT = 256  # bytes per slot: a length, then the id as JSON
_MAGIC, _VERSION = b"MCPJ", 1
# magic, version, consumed, filled, mid_line, slots, slot size, the ring's offset, its capacity
_HEADER = struct.Struct("<4sI QQ I II QQ")
_POSITIONS = struct.Struct("<QQ")  # consumed, filled
_AT_POSITIONS, _AT_MID = 8, 24
_TABLE = 64  # the slot table's offset
_LENGTH = struct.Struct("<I")
_KEEP_TOUCHED = 1 << 20  # ring bytes kept mapped in after a big line has gone through


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a dead daemon's journal says: end a half-written line, fail *ids*, re-send *unconsumed*."""

    mid_line: bool
    ids: list[Any]
    unconsumed: bytes


class Journal:
    """The daemon's side: a fresh journal with an input ring of *capacity* bytes.

    Resource handling: :attr:`fd` is for sending to connect, then :meth:`close_fd`; the mapping
    lives until :meth:`close`.
    """

    def __init__(self, capacity: int, slots: int = SLOTS) -> None:
        self._ring = -(-(_TABLE + slots * _SLOT) // mmap.PAGESIZE) * mmap.PAGESIZE
        self._capacity = capacity
        self.fd: int | None = os.memfd_create("mcp-supervisor-journal", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self._ring + capacity)  # sparse: pages exist once written
            self._map = mmap.mmap(self.fd, self._ring + capacity)
        except BaseException:
            self.close_fd()
            raise
        header = (_MAGIC, _VERSION, 0, 0, 0, slots, _SLOT, self._ring, capacity)
        _HEADER.pack_into(self._map, 0, *header)
        self._free = list(range(slots - 1, -1, -1))
        self._consumed = self._filled = self._touched = 0

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        self.close_fd()
        self._map.close()

    def record(self, data: bytes) -> None:
        """*data* was read from the client's stdin."""
        end = self._filled + len(data)
        if end > self._capacity:
            end = self._compact(len(data))
        start = self._ring + self._filled
        self._map[start : start + len(data)] = data
        self._filled = end
        self._touched = max(self._touched, end)
        _POSITIONS.pack_into(self._map, _AT_POSITIONS, self._consumed, end)

    def consume(self, size: int) -> None:
        """*size* more bytes are taken: served, or their request's id is held (:meth:`hold`)."""
        self._consumed += size
        if self._consumed >= self._filled:
            self._consumed = self._filled = 0  # empty: the next read starts the ring again
            _POSITIONS.pack_into(self._map, _AT_POSITIONS, 0, 0)
            self._release_pages()
        elif self._consumed >= _KEEP_TOUCHED and self._filled - self._consumed <= self._consumed:
            # A partial line always pending: keep the ring near its start. The positions first,
            # so that the bytes they name are not where the move writes.
            _POSITIONS.pack_into(self._map, _AT_POSITIONS, self._consumed, self._filled)
            self._compact(0)
        else:
            _POSITIONS.pack_into(self._map, _AT_POSITIONS, self._consumed, self._filled)

    def _compact(self, incoming: int) -> int:
        """Move the unconsumed bytes to the ring's start, if they do not overlap where they go
        (a copy cut short by the daemon's death leaves the old ones whole); the new end."""
        unconsumed = self._filled - self._consumed
        if unconsumed + incoming > self._capacity or unconsumed > self._consumed:
            raise OverflowError("the client's line is over the journal's ring")
        start = self._ring + self._consumed
        self._map.move(self._ring, start, unconsumed)
        self._consumed, self._filled = 0, unconsumed
        _POSITIONS.pack_into(self._map, _AT_POSITIONS, 0, unconsumed)
        self._release_pages()
        return unconsumed + incoming

    def _release_pages(self) -> None:
        """Give back the pages past what is in use (and past a first MiB kept for reuse)."""
        keep = -(-max(self._filled, _KEEP_TOUCHED) // mmap.PAGESIZE) * mmap.PAGESIZE
        if self._touched > keep:
            self._map.madvise(mmap.MADV_REMOVE, self._ring + keep, self._touched - keep)
            self._touched = keep

    def hold(self, request_id: str | int) -> int | None:
        """Note request *request_id* in flight; its slot, or None when it does not fit one."""
        encoded = json.dumps(request_id).encode()
        if not self._free or len(encoded) > _SLOT - _LENGTH.size:
            return None
        slot = self._free.pop()
        at = _TABLE + slot * _SLOT
        self._map[at + _LENGTH.size : at + _LENGTH.size + len(encoded)] = encoded
        _LENGTH.pack_into(self._map, at, len(encoded))  # last: the slot is whole once it counts
        return slot

    def release(self, slot: int) -> None:
        """The request in *slot* was answered in full (or the client cancelled it). Idempotent."""
        if slot in self._free:
            return
        _LENGTH.pack_into(self._map, _TABLE + slot * _SLOT, 0)
        self._free.append(slot)

    def mid_line(self, mid: bool) -> None:
        """Whether an answer is half-written to the client's stdout."""
        self._map[_AT_MID] = 1 if mid else 0


def recover(fd: int) -> Recovered | None:
    """Read the journal in the memfd *fd* of a daemon that is gone; None if it is not one."""
    size = os.fstat(fd).st_size
    if size < _HEADER.size:
        return None
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as view:
        magic, version, consumed, filled, mid, slots, slot_size, ring, capacity = _HEADER.unpack_from(view)
        fits = ring + capacity <= size and _TABLE + slots * slot_size <= ring
        if magic != _MAGIC or version != _VERSION or not fits:
            return None
        ids = []
        for slot in range(slots):
            at = _TABLE + slot * slot_size
            (length,) = _LENGTH.unpack_from(view, at)
            if 0 < length <= slot_size - _LENGTH.size:
                try:
                    ids.append(json.loads(view[at + _LENGTH.size : at + _LENGTH.size + length]))
                except ValueError:
                    continue
        whole = consumed <= filled <= capacity
        unconsumed = view[ring + consumed : ring + filled] if whole else b""
        return Recovered(mid_line=bool(mid), ids=ids, unconsumed=bytes(unconsumed))
