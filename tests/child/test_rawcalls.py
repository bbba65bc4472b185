"""rawcalls: encode's strict JSON lines (the errors callers rely on, json's bytes for what JSON
parsers give), and which child messages belong to a raw call."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import anyio
import pydantic_core
import pytest

from supervisor.child.rawcalls import RawCalls
from supervisor.upstream.raw import encode


def _json(message: Any) -> bytes:
    return json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode() + b"\n"


def _nested(depth: int) -> dict[str, Any]:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return {"v": value}


@pytest.mark.parametrize(
    "message",
    [
        {
            "jsonrpc": "2.0",
            "id": "mcpsv-1",
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {}},
        },
        {"text": 'é ü \u2028 \x7f \x00 \x1f " \\ / 😀 ' + "".join(map(chr, range(0x20)))},
        {"numbers": [0, -1, 2**70, -(2**70), 1.5, -0.0, 0.1, 1e16, 1e300, 5e-324, 123456789.123]},
        {"nested": [{"a": [None, True, False, {}, []]}], "": "", "k" * 300: "v"},
        _nested(190),  # about as deep as the JSON parser lets a value be, in an envelope
    ],
)
def test_the_bytes_are_jsons(message: dict[str, Any]) -> None:
    assert encode(message) == _json(message)
    assert encode(message).count(b"\n") == 1


def test_small_floats_are_the_same_numbers() -> None:
    for number in (1e-05, 1e-07, -2.5e-300):
        assert json.loads(encode({"v": number})) == {"v": number}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_floats_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode({"v": [value]})


def test_strings_that_mention_nan_are_fine() -> None:
    assert encode({"NaN": "Infinity -Infinity NaN"}) == _json({"NaN": "Infinity -Infinity NaN"})


def test_a_lone_surrogate_is_a_value_error() -> None:
    with pytest.raises(ValueError) as caught:
        encode({"v": "\ud800"})
    assert not isinstance(caught.value, pydantic_core.PydanticSerializationError)  # json's own error


def test_deeper_than_to_json_goes_but_python_allows_is_encoded() -> None:
    message = _nested(400)
    assert encode(message) == _json(message)


def test_deeper_than_python_allows_is_a_recursion_error() -> None:
    with pytest.raises(RecursionError):
        encode(_nested(100_000))


def test_what_json_cannot_carry_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode({"v": object()})


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": "mcpsv-3", "result": {}},  # an answer, its waiter gone: dropped
        {"jsonrpc": "2.0", "id": "mcpsv-3", "error": {"code": 1, "message": "x"}},
        {"jsonrpc": "2.0", "id": 3, "result": {}},  # the SDK session's
        {"jsonrpc": "2.0", "id": "other-3", "result": {}},
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "mcpsv-3", "progress": 1},
        },
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 3, "progress": 1}},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": "mcpsv-3"},
        {"jsonrpc": "2.0", "id": "mcpsv-3", "method": "notifications/progress", "params": {}},
        {"jsonrpc": "2.0", "id": "mcpsv-3", "method": "roots/list"},  # the child's own request
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "mcpsv-3"}},
        ["mcpsv-3"],
        "mcpsv-3",
    ],
)
def test_claims_says_what_route_takes(message: Any) -> None:
    """The stdout pump's callback takes a chunk only if every line is one route() takes."""
    sink, _ = anyio.create_memory_object_stream[bytes](0)
    raw = RawCalls(sink, cast(asyncio.StreamWriter, None))  # route() never writes
    assert raw.claims(message) == raw.route(message)
