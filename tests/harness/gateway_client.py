"""A test client for the gateway socket: the SDK's ClientSession over a real unix socket connection."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import ClientSession
from mcp.shared.message import SessionMessage

from supervisor import sockets

from .timing import fail_after

__all__ = (
    "ANSWERING",
    "INITIALIZE",
    "MAX_LINE",
    "Streams",
    "elicit_yes",
    "gateway_session",
    "list_home",
    "raw_exchange",
    "sample_hi",
    "unix_transport",
)

MAX_LINE = 256 << 20
INITIALIZE = {  # a handshake-era client's first request, for tests that speak plain JSON-RPC
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


@asynccontextmanager
async def unix_transport(path: str, profile: str | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """An SDK client transport over the gateway's unix socket: (read stream, write stream).

    With a *profile*, the connection first chooses it as ``connect --profile`` does.
    """
    stream = await sockets.connect(path)
    buffered = BufferedByteReceiveStream(stream)
    if profile is not None:
        hello = {
            "jsonrpc": "2.0",
            "id": "hello",
            "method": "mcp-supervisor/profile",
            "params": {"name": profile},
        }
        await stream.send(json.dumps(hello).encode() + b"\n")
        with fail_after(10):
            answer = json.loads(await buffered.receive_until(b"\n", MAX_LINE))
        assert "result" in answer, answer
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)

    async def reader() -> None:
        async with read_send:
            while True:
                try:
                    line = await buffered.receive_until(b"\n", MAX_LINE)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError):
                    return
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                try:
                    await read_send.send(SessionMessage(message))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the session ended; a late notification is nobody's

    async def writer() -> None:
        async with write_recv:
            async for item in write_recv:
                await stream.send(
                    item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                )

    async with stream, anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        yield read_recv, write_send
        tg.cancel_scope.cancel()


@asynccontextmanager
async def gateway_session(
    path: str, *, initialize: bool = True, profile: str | None = None, **session_args: Any
) -> AsyncIterator[ClientSession]:
    """A handshake-era ClientSession connected to the gateway at *path* (initialized unless asked not to)."""
    async with (
        unix_transport(path, profile) as (read, write),
        ClientSession(read, write, **session_args) as session,
    ):
        if initialize:
            await session.initialize()
        yield session


async def raw_exchange(
    path: str, lines: list[bytes], replies: int, within: float = 10.0
) -> list[dict[str, Any]]:
    """Send raw *lines* to the gateway and read *replies* JSON replies back."""
    async with await sockets.connect(path) as stream:
        for line in lines:
            await stream.send(line)
        buffered = BufferedByteReceiveStream(stream)
        out = []
        with fail_after(within):
            for _ in range(replies):
                out.append(json.loads(await buffered.receive_until(b"\n", MAX_LINE)))
        return out


class Streams:
    """Already-open (read, write) streams as a client transport, for ``mcp.Client``."""

    def __init__(self, streams: Any) -> None:
        self._streams = streams

    async def __aenter__(self) -> Any:
        return self._streams[0], self._streams[1]

    async def __aexit__(self, *exc: object) -> None:
        return None


# ---- a client that answers every question (tests/servers/plain_asker.py asks them) ----------------


async def elicit_yes(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"answer": f"yes to {params.message}"})


async def sample_hi(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", content=types.TextContent(text="hi"), model="m1")


async def list_home(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///home/client", name="client")])


ANSWERING = {
    "elicitation_callback": elicit_yes,
    "sampling_callback": sample_hi,
    "list_roots_callback": list_home,
}
