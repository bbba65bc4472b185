"""The pure half of connect: framing, peeking at lines, and what is remembered for a resume."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from supervisor.cli.connect.lines import HEAD, PARSE_WHOLE, Kind, LineBuffer, Oversize, Peek, error_line, peek
from supervisor.cli.connect.resume import MAX_IN_FLIGHT, Downstream, SessionMemory


def dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def request(request_id: Any, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


BIG = "x" * (PARSE_WHOLE + 10)


def fresh_ids() -> Callable[[], str]:
    return (f"r{n}" for n in itertools.count(1)).__next__


class TestPeek:
    @pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
    def test_python_member_order(self, big: bool) -> None:
        """jsonrpc, id, method, params: a request with its id, whether parsed whole or not."""
        line = dumps(request(7, text=BIG if big else "hi"))
        seen = peek(line)
        assert (seen.kind, seen.id, seen.method) == (Kind.REQUEST, 7, "tools/call")
        assert (seen.message is None) is big

    def test_typescript_member_order_puts_the_id_last(self) -> None:
        """method, params, jsonrpc, id: the id is read from the last member of a big line."""
        line = dumps(
            {"method": "tools/call", "params": {"text": BIG, "id": 99}, "jsonrpc": "2.0", "id": "a-1"}
        )
        assert peek(line[:HEAD], tail=line[-256:]) == Peek(Kind.REQUEST, "a-1", "tools/call")
        assert peek(line).id == "a-1"

    def test_a_nested_id_is_not_taken_for_the_request_id(self) -> None:
        """An `id` inside params, at the end of a big notification, is not the message's id."""
        line = dumps({"jsonrpc": "2.0", "method": "notifications/x", "params": {"text": BIG, "id": 5}})
        assert peek(line[:HEAD], tail=line[-256:]).kind is Kind.UNKNOWN  # cannot tell from the parts
        assert peek(line).kind is Kind.NOTIFICATION  # the whole line in memory: parsed after all

    def test_an_escaped_id_in_a_string_is_not_an_id(self) -> None:
        text = BIG + '","id":3}'
        line = dumps({"jsonrpc": "2.0", "method": "notifications/x", "params": {"text": text}})
        assert peek(line).kind is Kind.NOTIFICATION

    def test_a_big_response(self) -> None:
        line = dumps({"jsonrpc": "2.0", "id": 12, "result": {"content": [{"type": "text", "text": BIG}]}})
        assert peek(line[:HEAD], tail=b"") == Peek(Kind.RESPONSE, 12)

    def test_a_big_answer_is_not_parsed_whole(self) -> None:
        """A response over PARSE_WHOLE is classified from its head: no parse, no message kept."""
        line = dumps({"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": BIG}]}})
        assert peek(line) == Peek(Kind.RESPONSE, 3)

    def test_a_big_message_to_remember_is_parsed_whole(self) -> None:
        """A large initialize (big capabilities) still yields its message, so it can be replayed."""
        line = dumps(request(0, "initialize", capabilities={"experimental": {"x": BIG}}))
        seen = peek(line)
        assert seen.kind is Kind.REQUEST and seen.message is not None
        memory = SessionMemory()
        memory.sent(line, seen)
        memory.answered(0)
        assert memory.replay(fresh_ids())[0] == {**json.loads(line), "id": "r1"}

    def test_a_head_cut_inside_the_id_does_not_guess(self) -> None:
        """A number cut off at the end of the head is not read as a shorter number."""
        line = b'{"jsonrpc":"2.0","id":123456'
        assert peek(line[:-3], tail=b"").kind is Kind.UNKNOWN

    @pytest.mark.parametrize(
        ("line", "kind"),
        [
            (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', Kind.NOTIFICATION),
            (b'{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}', Kind.RESPONSE),
            (b"not json", Kind.UNKNOWN),
            (b"[1, 2]", Kind.UNKNOWN),
            (b'{"jsonrpc":"2.0","id":true,"method":"x"}', Kind.UNKNOWN),
            (b"", Kind.UNKNOWN),
        ],
    )
    def test_small_lines(self, line: bytes, kind: Kind) -> None:
        assert peek(line).kind is kind


class TestLineBuffer:
    def test_lines_split_across_chunks(self) -> None:
        buffer = LineBuffer(cap=100)
        assert buffer.feed(b"ab") == []
        assert buffer.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
        assert buffer.feed(b"g\n") == [b"fg"]

    def test_a_line_over_the_cap_is_dropped_as_it_arrives(self) -> None:
        """Over the cap nothing more is held; the line comes out as its head, tail and size."""
        buffer = LineBuffer(cap=HEAD + 100)
        first = b'{"id":4,' + b"x" * HEAD
        assert buffer.feed(first) == []
        assert buffer.feed(b"y" * 1000) == []
        assert len(buffer._partial) == 0  # given back at once
        (over, after) = buffer.feed(b"z}\nnext\n")
        assert isinstance(over, Oversize)
        assert over.size == len(first) + 1000 + 2
        assert over.head == first[:HEAD]
        assert over.tail.endswith(b"yz}")
        assert after == b"next"

    def test_a_line_of_exactly_the_cap_passes(self) -> None:
        buffer = LineBuffer(cap=10)
        assert buffer.feed(b"0123456789\n") == [b"0123456789"]
        assert buffer.feed(b"0123456789") == []
        assert buffer.feed(b"\n") == [b"0123456789"]


class TestSessionMemory:
    def test_requests_in_flight_until_answered_or_cancelled(self) -> None:
        memory = SessionMemory()
        for request_id in (1, 2, 3):
            line = dumps(request(request_id))
            memory.sent(line, peek(line))
        memory.answered(1)
        cancel = dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
        memory.sent(cancel, peek(cancel))
        assert list(memory.in_flight) == [3]
        assert memory.broken() == [3]
        assert memory.in_flight == {}

    def test_in_flight_is_bounded(self) -> None:
        """Past MAX_IN_FLIGHT requests are forwarded untracked: memory stays bounded."""
        memory = SessionMemory()
        for request_id in range(MAX_IN_FLIGHT + 5):
            line = dumps(request(request_id))
            memory.sent(line, peek(line))
        assert len(memory.in_flight) == MAX_IN_FLIGHT
        assert memory.untracked == 5

    def test_replay_of_an_answered_initialize(self) -> None:
        """initialize is replayed under a new id once answered; then initialized, level, subscriptions."""
        memory = SessionMemory()
        lines = [
            request(0, "initialize", protocolVersion="2025-11-25"),
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            request(1, "logging/setLevel", level="debug"),
            request(2, "resources/subscribe", uri="a://1"),
            request(3, "resources/subscribe", uri="a://2"),
            request(4, "resources/unsubscribe", uri="a://1"),
        ]
        for message in lines:
            memory.sent(dumps(message), peek(dumps(message)))
        assert memory.replay(fresh_ids())[0] is None  # not answered yet
        for request_id in range(5):
            memory.answered(request_id)
        initialize, rest = memory.replay(fresh_ids())
        assert initialize == {**lines[0], "id": "r1"}
        assert rest[0] == dumps(lines[1])
        assert [json.loads(line) for line in rest[1:]] == [{**lines[2], "id": "r2"}, {**lines[4], "id": "r3"}]

    def test_an_initialize_unanswered_at_the_break_is_not_replayed(self) -> None:
        memory = SessionMemory()
        line = dumps(request(0, "initialize"))
        memory.sent(line, peek(line))
        assert memory.broken() == [0]
        memory.answered(0)
        assert memory.replay(fresh_ids()) == (None, [])

    def test_listen_streams_survive_a_break(self) -> None:
        """2026-07-28 listen requests are not failed: they are re-sent under their own id."""
        memory = SessionMemory()
        listen = dumps(request("listen-1", "subscriptions/listen", notifications={"toolsListChanged": True}))
        call = dumps(request(5))
        memory.sent(listen, peek(listen))
        memory.sent(call, peek(call))
        assert memory.broken() == [5]
        assert memory.replay(fresh_ids()) == (None, [listen])
        assert list(memory.in_flight) == ["listen-1"]


class TestDownstream:
    def make(self, drop: set[Any], stream_after: int = 1 << 20) -> tuple[Downstream, list[Peek]]:
        done: list[Peek] = []
        downstream = Downstream(lambda seen: seen.id not in drop, done.append, stream_after)
        return downstream, done

    def test_whole_lines_pass_as_one_block(self) -> None:
        downstream, done = self.make(set())
        chunk = (
            dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
            + b"\n"
            + dumps({"jsonrpc": "2.0", "id": 2, "result": {}})
        )
        assert downstream.feed(chunk) == chunk[: chunk.index(b"\n") + 1]
        assert downstream.feed(b"\n") == chunk[chunk.index(b"\n") + 1 :] + b"\n"
        assert [seen.id for seen in done] == [1, 2]

    def test_dropped_lines_are_cut_out(self) -> None:
        downstream, _ = self.make({"mine"})
        keep = dumps({"jsonrpc": "2.0", "id": 1, "result": {}}) + b"\n"
        drop = dumps({"jsonrpc": "2.0", "id": "mine", "result": {}}) + b"\n"
        assert downstream.feed(keep + drop + keep) == keep + keep

    def test_a_long_line_streams_through_and_a_break_ends_it(self) -> None:
        """Over the threshold, bytes go out as they come; a break mid-line terminates it."""
        downstream, done = self.make(set(), stream_after=1000)
        head = b'{"jsonrpc":"2.0","id":9,"result":{"text":"'
        assert downstream.feed(head + b"x" * 500) == b""
        assert downstream.feed(b"x" * 600) == head + b"x" * 1100
        assert downstream.feed(b"x" * 10) == b"x" * 10
        assert downstream.cut() == b"\n"
        assert done == []  # never completed: the request stays in flight and gets its error

    def test_a_long_dropped_line_is_dropped_whole(self) -> None:
        downstream, done = self.make({"mine"}, stream_after=100)
        line = dumps({"jsonrpc": "2.0", "id": "mine", "result": {"text": "y" * 300}}) + b"\n"
        assert downstream.feed(line[:150]) == b""
        assert downstream.feed(line[150:] + b"{}\n") == b"{}\n"
        assert done[0].id == "mine"


def test_error_line() -> None:
    assert json.loads(error_line("a", -32000, "gone")) == {
        "jsonrpc": "2.0",
        "id": "a",
        "error": {"code": -32000, "message": "gone"},
    }
