"""How long a remote run waits for a POST's answer (supervisor/remote/deadlines.py): a request's
until its cancel is posted, or as long as any call may go on; anything else's briefly."""

from __future__ import annotations

import json

import anyio
import httpx2
import pytest

from supervisor.remote.deadlines import AnswerTimes, Deadlines, Post, TimeUp
from supervisor.upstream.raw import request_line

pytestmark = pytest.mark.anyio
TIMES = AnswerTimes(request=600, other=5)


def post(message: dict[str, object] | bytes) -> Post:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return Post.read(httpx2.Request("POST", "https://example.com/mcp", content=body))


def call(request_id: int | str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "t"}}


def cancel(request_id: int | str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}


async def test_a_request_waits_as_long_as_a_call_may_and_the_rest_briefly() -> None:
    deadlines = Deadlines(TIMES)
    now = anyio.current_time()
    request, _ = deadlines.posted(post(call(1)))
    answer, _ = deadlines.posted(post({"jsonrpc": "2.0", "id": 1, "result": {}}))
    note, _ = deadlines.posted(post({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    assert request.at - now >= 600 and answer.at - now <= 6 and note.at - now <= 6


def test_only_a_request_other_than_a_ping_may_take_long() -> None:
    """What takes the pool of calls; the rest (answered at once) has a pool of its own."""
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    answer = {"jsonrpc": "2.0", "id": 1, "result": {}}
    long_call = request_line(
        "mcpsv-1", "tools/call", {"name": "t", "arguments": {"text": "x" * 100_000}}, None
    )
    assert post(call(1)).may_take_long and post(long_call).may_take_long
    assert post(long_call).method == "tools/call"
    assert not any(post(message).may_take_long for message in (ping, answer, cancel(1), b"grant_type=x"))


async def test_its_cancel_ends_a_wait_for_its_answer_at_once() -> None:
    deadlines = Deadlines(TIMES)
    deadline, forget = deadlines.posted(post(call(7)))
    other, _ = deadlines.posted(post(call("7")))  # another id: "7" is not 7
    ended: list[str] = []

    async def wait() -> None:
        try:
            await deadline.wait(anyio.sleep_forever())
        except TimeUp:
            ended.append("cut")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            deadlines.posted(post(cancel(7)))
    assert ended == ["cut"] and deadline.cut_off and not other.cut_off
    with pytest.raises(TimeUp):  # and every later wait (its next chunk)
        await deadline.wait(anyio.sleep(1))
    forget()
    fresh, _ = deadlines.posted(post(call(7)))  # the id answered and forgotten: a new request's
    deadlines.posted(post(cancel(8)))  # an id no one awaits: nothing
    assert not fresh.cut_off


async def test_a_long_call_is_known_by_its_head_and_only_answers_being_read_are_kept() -> None:
    deadlines = Deadlines(TIMES)
    body = request_line("mcpsv-1", "tools/call", {"name": "t", "arguments": {"text": "x" * 200_000}}, None)
    deadline, forget = deadlines.posted(post(body))
    deadlines.posted(post(cancel("mcpsv-1")))
    assert deadline.cut_off
    forget()
    forgets = [deadlines.posted(post(call(n)))[1] for n in range(100)]
    assert len(deadlines) == 100
    for each in forgets:
        each()
    assert len(deadlines) == 0
