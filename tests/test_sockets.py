"""sockets.Stream on a real socket pair: reads on demand, watches readiness only while wanted."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

from supervisor import sockets
from tests.harness.timing import fail_after

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def pair() -> Iterator[tuple[sockets.Stream, socket.socket]]:
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, peer:
        yield sockets.Stream(ours), peer


async def test_readiness_is_watched_only_while_someone_receives(
    pair: tuple[sockets.Stream, socket.socket],
) -> None:
    """After a receive that waited, bytes nobody asks for stop the watch (else it fires every
    loop round) and stay in the kernel for the next receive."""
    stream, peer = pair
    fd = stream._raw_socket.fileno()
    async with anyio.create_task_group() as tg:
        got: list[bytes] = []

        async def receive() -> None:
            got.append(await stream.receive())

        tg.start_soon(receive)
        await anyio.sleep(0.05)  # it waits: nothing was sent yet
        peer.sendall(b"one")
    assert got == [b"one"]
    peer.sendall(b"two")  # nobody receives now
    for _ in range(5):
        await anyio.lowlevel.checkpoint()  # loop rounds in which the readiness is seen
    assert not asyncio.get_running_loop().remove_reader(fd)  # no longer watched
    assert await stream.receive() == b"two"
    peer.close()
    with pytest.raises(anyio.EndOfStream):
        await stream.receive()


async def test_a_peer_that_never_pauses_does_not_hold_the_loop(
    pair: tuple[sockets.Stream, socket.socket],
) -> None:
    """Bytes that are there at once are read without waiting, and the receiver yields all the same."""
    stream, peer = pair
    peer.sendall(b"x" * 50_000)
    rounds = 0

    async def count() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(count)
        received = 0
        while received < 50_000:
            received += len(await stream.receive(100))
        tg.cancel_scope.cancel()
    assert rounds >= 400  # the other task ran between the receives


async def test_closing_wakes_a_waiting_receive(pair: tuple[sockets.Stream, socket.socket]) -> None:
    stream, _peer = pair
    with fail_after(5):
        async with anyio.create_task_group() as tg:
            failures: list[BaseException] = []

            async def receive() -> None:
                try:
                    await stream.receive()
                except anyio.ClosedResourceError as exc:
                    failures.append(exc)

            tg.start_soon(receive)
            await anyio.sleep(0.05)
            await stream.aclose()
    assert len(failures) == 1
    with pytest.raises(anyio.ClosedResourceError):
        await stream.receive()


async def test_a_cancelled_receive_loses_no_bytes(pair: tuple[sockets.Stream, socket.socket]) -> None:
    stream, peer = pair
    with anyio.move_on_after(0.05):
        await stream.receive()
    peer.sendall(b"later")
    with fail_after(5):
        assert await stream.receive() == b"later"


async def test_bytes_read_for_a_receive_cancelled_before_it_took_them_go_to_the_next(
    pair: tuple[sockets.Stream, socket.socket],
) -> None:
    """(anyio lets a task whose wait is over resume before it cancels it; a bare asyncio task not.)"""
    stream, peer = pair
    with fail_after(5):
        task = asyncio.ensure_future(stream.receive())
        while stream._receiving is None:
            await anyio.lowlevel.checkpoint()
        peer.sendall(b"early")
        while not stream._receiving[0].done():  # read for it, the receiver not yet resumed
            await anyio.lowlevel.checkpoint()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await stream.receive() == b"early"


async def test_readiness_seen_after_the_bytes_were_taken_wakes_nobody(
    pair: tuple[sockets.Stream, socket.socket],
) -> None:
    """A request-answer exchange: each receive gets its message, none returns empty-handed."""
    stream, peer = pair
    with fail_after(5):
        for n in range(50):
            got: list[bytes] = []
            async with anyio.create_task_group() as tg:

                async def receive(got: list[bytes] = got) -> None:
                    got.append(await stream.receive())

                tg.start_soon(receive)
                while stream._receiving is None:
                    await anyio.lowlevel.checkpoint()
                peer.sendall(b"%d" % n)
            assert got == [b"%d" % n]
