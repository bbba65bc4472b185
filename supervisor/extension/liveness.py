"""Liveness: a child that stops answering is restarted like one that crashed.

Every ``ping_interval`` seconds the watcher's helper task sends the child a ``ping``. No
answer within ``ping_timeout`` means "not answering", except while calls are in flight and
one of them was answered (or reported progress) within the last ``ping_timeout``: a server
that serves one request at a time cannot answer a ping during a call, and its answers show it
is alive (as is one waiting for a client's answer to its own request). The verdict ends the
connection through :meth:`Connection.end`, the path a broken pipe takes, so the restart
policy and its backoff apply as for a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import structlog

from supervisor.extension.upstream import Upstream

__all__ = ("NOT_ANSWERING", "is_unresponsive", "watch")

log = structlog.get_logger(__name__)

NOT_ANSWERING = "not answering"


def is_unresponsive(*, answered: bool, in_flight: int, since_answer: float, timeout: float) -> bool:
    """The verdict after one ping. Pure.

    Args:
        answered: the ping was answered within *timeout*.
        in_flight: calls to the child in progress.
        since_answer: seconds since the child last answered a call or reported progress.
    """
    if answered:
        return False
    return in_flight == 0 or since_answer >= timeout


async def watch(
    connection: Upstream,
    *,
    interval: float,
    ping_timeout: float,
    in_flight: Callable[[], int],
    answered_at: Callable[[], float],
    on_unresponsive: Callable[[str], None],
) -> None:
    """Ping the child until it stops answering; then end *connection* and return.

    *in_flight* and *answered_at* (a ``time.monotonic`` value) describe the calls to the
    child; *on_unresponsive* is told the error before the connection ends (sync).
    """
    while not connection.ended.is_set():
        await anyio.sleep(interval)
        answered = False
        with anyio.move_on_after(ping_timeout):
            try:
                await connection.ping()
            except Exception:  # an error answer is an answer; a closed connection ends below
                if connection.ended.is_set():
                    return
            answered = True
        since = time.monotonic() - answered_at()
        if is_unresponsive(
            answered=answered, in_flight=in_flight(), since_answer=since, timeout=ping_timeout
        ):
            error = f"{NOT_ANSWERING}: no answer to a ping within {ping_timeout:g}s"
            if in_flight():
                error += f", nor to any of the {in_flight()} calls in flight"
            log.warning("extension.not_answering", ping_timeout=ping_timeout, in_flight=in_flight())
            on_unresponsive(error)
            connection.end(error)
            return
