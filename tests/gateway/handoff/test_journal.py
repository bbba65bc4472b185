"""The journal of a handed-off session, and what connect makes of it when the daemon is gone."""

from __future__ import annotations

import json
import os
import socket

import mcp_types as types
import pytest

from supervisor.cli.connect.handoff import BackLines, taken_back
from supervisor.cli.connect.resume import SessionMemory
from supervisor.gateway.handoff.backchannel import Backchannel, Tracking
from supervisor.gateway.handoff.handed import Handed
from supervisor.gateway.handoff.journal import SLOTS, Journal, recover
from supervisor.gateway.handoff.stream import HandedStream
from supervisor.gateway.hello import ANSWERED, HELD_LONG, RELEASED_LONG, SET_UP
from supervisor.gateway.session import InFlight
from supervisor.streams import Stream
from tests.harness.timing import fail_after


def request(request_id: object, method: str = "tools/call") -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {}}).encode() + b"\n"


@pytest.fixture
def journal() -> Journal:
    journal = Journal(capacity=1 << 16)
    yield journal
    journal.close()


def read(journal: Journal):  # what connect would read now
    assert journal.fd is not None
    return recover(journal.fd)


class TestJournal:
    def test_a_fresh_journal_says_nothing(self, journal: Journal) -> None:
        recovered = read(journal)
        assert recovered is not None
        assert (recovered.mid_line, recovered.ids, recovered.unconsumed) == (False, [], b"")

    def test_bytes_read_stay_until_taken(self, journal: Journal) -> None:
        journal.record(b'{"a": 1}\n{"b"')
        assert read(journal).unconsumed == b'{"a": 1}\n{"b"'
        journal.consume(len(b'{"a": 1}\n'))
        assert read(journal).unconsumed == b'{"b"'
        journal.record(b": 2}\n")
        journal.consume(len(b'{"b": 2}\n'))
        assert read(journal).unconsumed == b""

    def test_the_ring_starts_again_when_empty_and_moves_a_partial_line(self) -> None:
        journal = Journal(capacity=64)
        try:
            for _ in range(100):  # 100 x 40 bytes through a 64-byte ring
                journal.record(b"x" * 39 + b"\n")
                journal.consume(40)
            journal.record(b"a" * 40)  # a partial line at 0..40
            journal.consume(30)
            journal.record(b"b" * 30)  # past the end: the 10 unconsumed bytes move to the start
            assert read(journal).unconsumed == b"a" * 10 + b"b" * 30
            with pytest.raises(OverflowError):
                journal.record(b"c" * 30)  # a line longer than the ring can hold
        finally:
            journal.close()

    def test_ids_in_flight_until_released(self, journal: Journal) -> None:
        one, two = journal.hold(1), journal.hold("two")
        assert one is not None and two is not None
        assert sorted(map(str, read(journal).ids)) == ["1", "two"]
        journal.release(one)
        assert read(journal).ids == ["two"]

    def test_an_id_too_long_or_past_the_slots_is_not_held(self, journal: Journal) -> None:
        assert journal.hold("x" * 300) is None
        slots = [journal.hold(i) for i in range(SLOTS)]
        assert None not in slots
        assert journal.hold("one more") is None
        journal.release(slots[0])
        assert journal.hold("one more") is not None

    def test_mid_line(self, journal: Journal) -> None:
        journal.mid_line(True)
        assert read(journal).mid_line
        journal.mid_line(False)
        assert not read(journal).mid_line

    def test_anything_else_is_no_journal(self) -> None:
        fd = os.memfd_create("not-a-journal")
        try:
            os.write(fd, b"\0" * 4096)
            assert recover(fd) is None
        finally:
            os.close(fd)


class TestTakenBack:
    def test_what_connect_fails_resends_and_ends(self, journal: Journal) -> None:
        """Held requests get errors (and are not re-sent); the rest of the input is re-sent; a
        half-written answer is ended; listen streams are neither failed nor re-sent."""
        back = BackLines(SessionMemory())
        listen = request("L", "subscriptions/listen")
        back.feed(SET_UP + request("init", "initialize") + SET_UP + listen)
        back.feed(ANSWERED + b'"init"\n' + HELD_LONG + b'"a-long-id"\n')
        held = request(5)
        journal.record(held + request(6) + request("L", "subscriptions/listen") + b'{"partial')
        journal.hold(5)
        journal.hold("L")
        journal.mid_line(True)
        assert journal.fd is not None
        taken = taken_back(journal.fd, back)
        assert taken.mid_line
        assert sorted(map(str, taken.failed)) == ["5", "a-long-id"]
        assert taken.unsent == request(6) + b'{"partial'
        assert back.memory.remembered.initialize is not None  # replayed on the next daemon

    def test_a_long_id_answered_is_not_failed(self, journal: Journal) -> None:
        back = BackLines(SessionMemory())
        back.feed(HELD_LONG + b'"long"\n' + RELEASED_LONG + b'"long"\n')
        assert journal.fd is not None
        assert taken_back(journal.fd, back).failed == []

    def test_a_back_line_over_the_limit_is_dropped(self) -> None:
        back = BackLines(SessionMemory())
        back.feed(SET_UP + b"x" * (3 << 20))
        back.feed(b"x" * 100 + b"\n" + SET_UP + request("init", "initialize"))
        assert "init" in back.memory.in_flight


class TestWithInFlight:
    @pytest.mark.anyio
    async def test_a_reused_id_frees_each_slot_once(self, journal: Journal) -> None:
        """A fast call and an SDK request under one id (a client may reuse ids): the SDK's answer
        settles its own slot, not the fast call's, and each is freed once, in the semaphore and
        in the journal; else every such pair leaked a slot until one request was left in flight."""
        in_flight = InFlight(2)
        in_flight.tracker = Tracking(journal, Backchannel.__new__(Backchannel))
        with fail_after(5):  # a leaked slot blocks the next take
            await self._pairs(in_flight)
        assert read(journal).ids == []
        with fail_after(1):  # both slots free
            await in_flight.take()
            await in_flight.take()
        in_flight.hold("y")
        in_flight.hold("z")
        assert sorted(read(journal).ids) == ["y", "z"]

    async def _pairs(self, in_flight: InFlight) -> None:
        for _ in range(3):
            await in_flight.take()
            fast = in_flight.hold("x", by_id=False)
            await in_flight.take()
            in_flight.hold("x")
            in_flight.settle("x")  # the SDK's answer
            in_flight.settle("x", fast)  # the fast call's
            in_flight.settle("x", fast)  # again: nothing

    @pytest.mark.anyio
    async def test_a_request_unanswered_at_the_end_stays_journaled(self, journal: Journal) -> None:
        in_flight = InFlight(8)
        in_flight.tracker = Tracking(journal, Backchannel.__new__(Backchannel))
        slot = in_flight.hold(1)
        in_flight.settle(1, slot, answered=False)
        assert read(journal).ids == [1]


class TestPages:
    def test_a_partial_line_always_pending_keeps_the_ring_small(self) -> None:
        """Every read ends mid-line, so the ring is never empty: it is still kept near its start,
        and the pages behind are given back (8 MiB went through)."""
        journal = Journal(capacity=64 << 20)
        try:
            assert journal.fd is not None
            journal.record(b"n" * 500)
            for _ in range(8 << 10):
                journal.record(b"n" * 499 + b"\n" + b"n" * 500)  # ends one line, starts the next
                journal.consume(1000)
            assert read(journal).unconsumed == b"n" * 500
            assert os.fstat(journal.fd).st_blocks * 512 <= 2 << 20
        finally:
            journal.close()

    def test_the_journal_names_what_is_pending_even_while_it_moves(self) -> None:
        """When the ring moves a pending partial line to its start, the positions already name
        it: a daemon dying mid-move leaves connect the bytes it must re-send, not a line it took."""
        seen: list[bytes] = []

        class Watched(Journal):
            def _compact(self, incoming: int) -> int:
                seen.append(read(self).unconsumed)  # what connect would read if we died now
                return super()._compact(incoming)

        journal = Watched(capacity=8 << 20)
        try:
            big = b"b" * (1 << 20) + b"\n"
            journal.record(big + b'{"id": 7')
            journal.consume(len(big))
            assert seen == [b'{"id": 7']
            assert read(journal).unconsumed == b'{"id": 7'
        finally:
            journal.close()


class TestHanded:
    @pytest.mark.anyio
    async def test_set_up_requests_given_up_are_forgotten(self, journal: Journal) -> None:
        """The set-up requests connect must hear answered are bounded by those in flight: one the
        client gives up (its cancellation, or the SDK's hook for it) leaves the table."""
        ours, theirs = socket.socketpair()
        read_end, write_end = os.pipe()
        stream = HandedStream(read_end, write_end, journal)
        in_flight = InFlight(8)
        handed = Handed(stream, Stream(ours), in_flight, lambda: None, 1.0)
        try:
            for i in range(1000):
                listen = {"jsonrpc": "2.0", "id": i, "method": "subscriptions/listen", "params": {}}
                handed.set_up(types.JSONRPCRequest.model_validate(listen), json.dumps(listen).encode())
                if i % 2:
                    handed.cancelled(i)  # the SDK's hook: the client cancelled it
                else:
                    cancel = {
                        "jsonrpc": "2.0",
                        "method": "notifications/cancelled",
                        "params": {"requestId": i},
                    }
                    message = types.JSONRPCNotification.model_validate(cancel)
                    handed.set_up(message, json.dumps(cancel).encode())
                theirs.recv(1 << 16)  # what connect hears
            assert handed._set_up == {}
        finally:
            await stream.aclose()
            theirs.close()
