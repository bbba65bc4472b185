"""What a handed-off client's connection keeps for ``connect``, so that connect can carry it on.

The connection (:class:`supervisor.gateway.stdio.StdioConnection`) serves the client as any
other; :class:`Handed` is its one tie to connect: the journal (bytes read, requests in flight,
through the connection's :class:`~supervisor.gateway.session.InFlight`), and the back channel,
on which connect hears of the lines that set the session up, their answers, and the bye.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import mcp_types as types

from supervisor.gateway.handoff.backchannel import Backchannel, Tracking
from supervisor.gateway.handoff.stream import HandedStream
from supervisor.gateway.hello import ANSWERED, SET_UP, SET_UP_MAX, SET_UP_METHODS
from supervisor.gateway.session import InFlight, RequestId
from supervisor.streams import Stream

__all__ = ("EOF_GRACE", "MAX_ID", "Handed")

EOF_GRACE = 2.0  # after the client's input ends: how long the answers still due may take
MAX_ID = 4096  # characters of a request id a handed-off session takes: connect is told each
_LISTEN = "subscriptions/listen"
_MAX_LISTENS = 64  # named by connect at a switch (it keeps as many)


class Handed:
    """The tie to connect of a connection serving *stream* (the client's own stdio): *back* is
    the socket to connect, *in_flight* the connection's slots, *end* ends the connection."""

    def __init__(
        self,
        stream: HandedStream,
        back: Stream,
        in_flight: InFlight,
        end: Callable[[], None],
        send_timeout: float,
    ) -> None:
        self.journal = stream.journal
        self.back = Backchannel(back, end, send_timeout)
        self._in_flight = in_flight
        in_flight.tracker = Tracking(self.journal, self.back)
        self._set_up: dict[RequestId, str] = {}  # requests whose answer connect must hear of: method

    def listening(self, listens: object, in_flight: InFlight) -> None:
        """Handed over on a live session: the listen streams it has open (connect names them,
        at most its own bound of them) are set-up requests connect must hear the end of."""
        if isinstance(listens, list):
            for request_id in listens[:_MAX_LISTENS]:
                if type(request_id) in (str, int) and in_flight.holds(request_id):
                    self._set_up[request_id] = _LISTEN

    def refuses(self, request_id: RequestId) -> bool:
        """Whether *request_id* is too long to take (connect would have to hear it whole)."""
        return isinstance(request_id, str) and len(request_id) > MAX_ID

    def set_up(self, message: types.JSONRPCMessage, line: bytes) -> None:
        """Tell connect of a client line that sets the session up, before it is served."""
        method = getattr(message, "method", None)
        if method not in SET_UP_METHODS or len(line) > SET_UP_MAX:
            return
        if method == "notifications/cancelled":
            params = getattr(message, "params", None) or {}
            cancelled = params.get("requestId")
            if type(cancelled) not in (str, int) or self._set_up.pop(cancelled, None) is None:
                return  # connect only cares for the requests it replays
        self.back.post(SET_UP, line)
        if isinstance(message, types.JSONRPCRequest):
            self._set_up[message.id] = method

    def answered(self, request_id: RequestId | None) -> None:
        """Tell connect that a set-up request is answered (before the client hears it: a daemon
        dying after the write told connect)."""
        if request_id is not None and self._set_up.pop(request_id, None) is not None:
            self.back.post(ANSWERED, json.dumps(request_id).encode())

    def cancelled(self, request_id: RequestId) -> None:
        """The client gave up *request_id*: no answer comes, nothing to tell."""
        self._set_up.pop(request_id, None)

    async def input_ended(self) -> None:
        """The client's input ended: wait (a while) for the answers still due, as connect does
        when it pumps; its listen streams never end by themselves."""
        listens = {request_id for request_id, method in self._set_up.items() if method == _LISTEN}
        with anyio.move_on_after(EOF_GRACE):
            await self._in_flight.answered(besides=listens)
