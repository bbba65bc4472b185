"""connect's pump without sockets: what it tells the client after a restart, from what it kept."""

from __future__ import annotations

import json

from supervisor.cli.connect.lines import peek
from supervisor.cli.connect.pump import Link, Pump


def _listen(request_id: int, params: object) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": "subscriptions/listen", "params": params}
    return json.dumps(message).encode()


class TestChanges:
    def test_listen_streams_hear_of_what_they_asked_for(self) -> None:
        pump = Pump()
        line = _listen(7, {"notifications": {"toolsListChanged": True}})
        pump.memory.sent(line, peek(line))
        sent = [json.loads(text) for text in pump.changes(Link(pump)).splitlines()]
        assert [message["method"] for message in sent] == ["notifications/tools/list_changed"]
        assert sent[0]["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7}

    def test_a_listen_with_params_of_the_wrong_shape_is_told_nothing(self) -> None:
        """A client's malformed listen still open at a restart: before, an AttributeError ended connect."""
        pump = Pump()
        for request_id, params in enumerate(["x", {"notifications": ["x"]}, None, {"notifications": 3}]):
            line = _listen(request_id, params)
            pump.memory.sent(line, peek(line))
        assert pump.changes(Link(pump)) == b""
