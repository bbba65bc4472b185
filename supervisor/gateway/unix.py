"""Where MCP clients reach the gateway: the unix socket ``mcp.sock`` (and, in ``http``, streamable HTTP).

Each connection to ``mcp.sock`` is one MCP session in the stdio framing, served by its own
task (:mod:`.stdio`). Its first bytes may be ``connect``'s handoff (:mod:`.handoff`): then the
client is served on its own stdin and stdout, which came along, and the socket carries only
what connect needs to carry the client on if the daemon dies. At most ``max_connections``
clients at once; one more gets an error and is closed.
"""

from __future__ import annotations

import contextlib
import json

import anyio
import anyio.abc
import mcp_types as types
import structlog

from supervisor import sockets
from supervisor.gateway.handoff import offer
from supervisor.gateway.handoff.journal import Journal
from supervisor.gateway.handoff.stream import HandedStream
from supervisor.gateway.server import Gateway
from supervisor.gateway.session import MAX_CONNECTIONS, MAX_IN_FLIGHT
from supervisor.gateway.stdio import MAX_MESSAGE, RING, SEND_TIMEOUT, StdioConnection
from supervisor.gateway.view.profiles import Chosen
from supervisor.logs import Throttled

__all__ = ("MAX_CONNECTIONS", "MAX_IN_FLIGHT", "MAX_MESSAGE", "SEND_TIMEOUT", "serve_unix")

log = structlog.get_logger(__name__)

_FIRST_READ = 1 << 16  # the first read of a connection, which may carry a handoff's fds
_TAKEN_TIMEOUT = 10.0  # seconds for connect to acknowledge the handoff's answer


async def serve_unix(
    gateway: Gateway,
    path: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway on the unix socket *path* until cancelled, to *max_connections* clients at once.

    Raises:
        SupervisorError: another daemon is listening on *path*, or it cannot be bound.

    Resource handling: the socket file is removed on exit unless another process replaced it.
    """
    listener = await sockets.listen(path)
    identity = sockets.identity(path)
    active = 0
    refused = Throttled(log, "gateway.too_many_connections")
    log.info("gateway.listening", path=path, max_connections=max_connections)

    async def serve_one(stream: sockets.Stream) -> None:
        nonlocal active
        try:
            async with stream:
                pid, uid = sockets.peer_credentials(stream)
                if not sockets.trusted_uid(uid):
                    log.warning("gateway.peer_refused", uid=uid, pid=pid)
                    return
                first, fds = await stream.receive_with_fds(_FIRST_READ, offer.MAX_FDS)
                handoff = offer.parse(first, fds)
                if handoff is not None:
                    await _serve_handed(gateway, stream, handoff)
                elif first:
                    connection = StdioConnection(gateway, stream, first)
                    await connection.serve()
                    if connection.client_ended and connection.handed is not None:  # switched
                        await connection.handed.back.bye()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            log.debug("gateway.client_gone")
        except Exception:  # a bug of ours: end this client, never the daemon
            log.exception("gateway.connection_crashed")
        finally:
            active -= 1

    try:
        async with listener, anyio.create_task_group() as connections:
            task_status.started()
            while True:
                stream = await sockets.next_client(listener, event="gateway.accept_failed")
                if active >= max_connections:
                    refused("cap", limit=max_connections)
                    await _refuse(stream, f"too many connections (at most {max_connections})")
                    continue
                active += 1
                connections.start_soon(serve_one, stream)
    finally:
        sockets.unlink_if_ours(path, identity)
        log.info("gateway.closed", path=path)


async def _serve_handed(gateway: Gateway, stream: sockets.Stream, handoff: offer.Offer) -> None:
    """Serve a client whose stdio ``connect`` handed over, on those fds, the socket a back channel.
    A refused handoff (connect then pumps the bytes itself) is answered with an error."""
    refusal, chosen = handoff.problem, None
    if refusal is None and handoff.profile is not None:
        view = gateway.views.choose(handoff.profile)
        if isinstance(view, str):
            refusal = view
        else:
            chosen = Chosen(view.name or "")
    if refusal is not None:
        handoff.close()
        offer.refuse(stream._raw_socket, handoff.id, offer.REFUSED, refusal)
    else:
        took = await offer.accept(stream, handoff, RING, _TAKEN_TIMEOUT)
        if took is None:
            return  # connect gave up waiting, and pumps: its client's fds are not ours
        if not isinstance(took, str):
            await _serve_taken(gateway, stream, took, chosen)
            return
        refusal = took
    log.info("gateway.handoff_refused", reason=refusal)


async def _serve_taken(
    gateway: Gateway, stream: sockets.Stream, took: tuple[int, int, Journal], chosen: Chosen | None
) -> None:
    stdin, stdout, journal = took
    with contextlib.closing(journal):
        handed = HandedStream(stdin, stdout, journal)
        try:
            connection = StdioConnection(gateway, handed, chosen=chosen, back=stream)
            await connection.serve()
            if connection.client_ended and connection.handed is not None:
                await connection.handed.back.bye()
        finally:
            await handed.aclose()


async def _refuse(stream: anyio.abc.SocketStream, message: str) -> None:
    error = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": types.INTERNAL_ERROR, "message": message}}
    )
    with (
        anyio.move_on_after(1),
        contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError),
    ):
        await stream.send(error.encode() + b"\n")
    await stream.aclose()
