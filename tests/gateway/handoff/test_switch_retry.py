"""The switch after a restart, when it fails: a daemon that cannot take the client over now is
asked again later, one that never can (an older one) is not, and its successor is.

Real processes throughout: a real daemon whose fd limit is lowered from outside (``prlimit``)
while ``connect`` is about to switch, and, for the older daemon, a line-speaking stand-in on the
same socket that answers the switch as the MCP SDK answers any method it does not know.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from supervisor.gateway.hello import HANDOFF_METHOD
from tests.gateway.handoff.test_end_to_end import WAIT, Client, call, holds, line, restarted
from tests.harness import RICH
from tests.harness.daemon import Daemon, until

pytestmark = pytest.mark.timeout(60)
RETRIED = "could not hand the client over"
NEVER = "cannot take the client over"
HANDED = "handed the client over"


@pytest.fixture
def client_of() -> Iterator[Callable[[Daemon], Client]]:
    made: list[Client] = []

    def make(daemon: Daemon) -> Client:
        made.append(client := Client(daemon))
        return client

    yield make
    for client in made:
        client.kill()


def wait_note(client: Client, text: str, within: float = WAIT) -> str:
    """connect's stderr up to the first note with *text* in it (or all it said within *within*)."""
    assert client.process.stderr is not None
    fd = client.process.stderr.fileno()
    said = b""
    deadline = time.monotonic() + within
    while text.encode() not in said:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready or not (data := os.read(fd, 1 << 16)):
            break
        said += data
    return said.decode(errors="replace")


def stays_false(predicate: Callable[[], bool], seconds: float) -> bool:
    """Whether *predicate* stays false for *seconds* (polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return False
        time.sleep(0.02)
    return not predicate()


@contextmanager
def out_of_fds(pid: int, spare: int = 0) -> Iterator[None]:
    """Process *pid* can open no more fd but *spare* (its soft RLIMIT_NOFILE that far past its
    lowest free fd) in the block: receiving fds truncates them, a memfd fails with EMFILE."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
    lowest_free = next(fd for fd in itertools.count() if fd not in used)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free + spare, hard))
    try:
        yield
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))


class OlderDaemon:
    """A gateway from before the switch, on *path*: it answers ``initialize`` and ``ping``, and
    anything else -32601 (as the MCP SDK does for a method it does not know), noting the methods."""

    def __init__(self, path: str) -> None:
        self.methods: list[str] = []
        self._connections: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_UNIX)
        with suppress(FileNotFoundError):
            os.unlink(path)  # the killed daemon's
        self._listener.bind(path)
        self._listener.listen()
        self._path = path
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def switches(self) -> int:
        return self.methods.count(HANDOFF_METHOD)

    def close(self) -> None:
        for sock in [self._listener, *self._connections]:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
            sock.close()
        os.unlink(self._path)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with suppress(OSError, ValueError), connection.makefile("rb") as lines:
            for raw in lines:
                if raw.strip():
                    connection.sendall(self._answer(json.loads(raw)))

    def _answer(self, message: dict[str, Any]) -> bytes:
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            return b""  # a notification
        self.methods.append(method)
        if method == "initialize":
            info = {"name": "older", "version": "0"}
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": info}
            return line({"jsonrpc": "2.0", "id": request_id, "result": result})
        if method == "ping":
            return line({"jsonrpc": "2.0", "id": request_id, "result": {}})
        error = {"code": -32601, "message": "Method not found", "data": method}
        return line({"jsonrpc": "2.0", "id": request_id, "error": error})


class BrokenSwitchDaemon(OlderDaemon):
    """A gateway that says ready to every switch, then answers it without the journal's fd: each
    switch fails after the fds went, and connect ends that connection."""

    def _answer(self, message: dict[str, Any]) -> bytes:
        if message.get("method") != HANDOFF_METHOD:
            return super()._answer(message)
        self.methods.append(HANDOFF_METHOD)
        request_id = message["id"]
        ready = line({"jsonrpc": "2.0", "id": request_id, "result": {"ready": True}})
        return ready + line({"jsonrpc": "2.0", "id": request_id, "result": {"handoff": True}})


class EndingSwitchDaemon(OlderDaemon):
    """A gateway that ends the connection when asked to switch, before any answer: each switch
    ends its connection while asking."""

    def _serve(self, connection: socket.socket) -> None:
        with suppress(OSError, ValueError), connection.makefile("rb") as lines:
            for raw in lines:
                if raw.strip() and json.loads(raw).get("method") == HANDOFF_METHOD:
                    self.methods.append(HANDOFF_METHOD)
                    connection.shutdown(socket.SHUT_RDWR)
                    return
                if raw.strip():
                    connection.sendall(self._answer(json.loads(raw)))


class DyingSwitchDaemon(OlderDaemon):
    """A gateway that dies as a switch reaches it, before reading it: the connection is reset."""

    def _serve(self, connection: socket.socket) -> None:
        with suppress(OSError, ValueError):
            pending = b""
            while True:
                if HANDOFF_METHOD.encode() in connection.recv(1 << 16, socket.MSG_PEEK):
                    self.methods.append(HANDOFF_METHOD)
                    connection.close()  # with the switch unread: the peer's next read fails (reset)
                    return
                pending += connection.recv(1 << 16)
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    if raw.strip():
                        connection.sendall(self._answer(json.loads(raw)))


class TestSwitchRetry:
    @pytest.mark.parametrize(
        ("short", "why"), [("daemon", "the daemon refused"), ("connect", "could not keep its input")]
    )
    def test_a_switch_without_fds_is_tried_again_later(
        self, gateway, client_of, short: str, why: str
    ) -> None:
        """After a restart, the first switch fails for want of fds: the daemon's (it refuses), or
        connect's own (it does not ask: it could not read the client's input again if the switch
        failed). The session goes on, pumped, on the same connection, and once there are fds
        again connect hands the client over after all."""
        daemon = gateway({"echo": RICH})
        client = client_of(daemon)
        client.open_session()
        daemon.status()  # a round trip: the daemon has noted the last answer as written
        pipe = client.stdin_pipe()
        whole = line(call(1, "echo__echo", text="held"))
        with restarted(daemon):
            client.send(whole[:10])  # half a line: connect does not switch while it is on its way
            until(lambda: client.unread_input() == 0, within=WAIT)
        assert client.receive(within=20)["method"] == "notifications/tools/list_changed"  # resumed
        with out_of_fds(daemon.pid if short == "daemon" else client.process.pid):
            client.send(whole[10:])
            assert client.answer(1)["result"]["content"][0]["text"] == "held"
            said = wait_note(client, RETRIED)  # the switch failed, the next try backed off
            assert not holds(daemon.pid, pipe)
        until(lambda: holds(daemon.pid, pipe), within=WAIT)  # handed over on the next try
        said += wait_note(client, HANDED)
        _, _, after = said.partition(RETRIED)
        assert why in after and "lost the daemon" not in after, said  # the same connection
        client.send(line(call(2, "echo__echo", text="over")))
        assert client.answer(2)["result"]["content"][0]["text"] == "over"
        assert client.close() == 0

    def test_a_first_handoff_refused_for_want_of_fds_is_asked_again(self, gateway, client_of) -> None:
        """The daemon has room for connect's connections but not for the client's two pipes when
        connect starts: it pumps, and once the session has begun and the daemon has fds again,
        it hands the client over."""
        daemon = gateway({"echo": RICH})
        daemon.status()  # its own control connection is closed again before the limit is set
        with out_of_fds(daemon.pid, spare=2):
            client = client_of(daemon)
            client.open_session()
            pipe = client.stdin_pipe()
            assert not holds(daemon.pid, pipe)  # refused: pumped
        until(lambda: holds(daemon.pid, pipe), within=WAIT)  # a switch, after its backoff
        assert HANDED in wait_note(client, HANDED)
        client.send(line(call(1, "echo__echo", text="over")))
        assert client.answer(1)["result"]["content"][0]["text"] == "over"
        assert client.close() == 0

    @pytest.mark.parametrize(
        "stand_in",
        [BrokenSwitchDaemon, EndingSwitchDaemon, DyingSwitchDaemon],
        ids=["handing", "asking", "reset while asking"],
    )
    def test_a_switch_that_ends_its_connection_still_backs_off(self, gateway, client_of, stand_in) -> None:
        """Each switch ends its connection, after the fds went (no journal) or while asking: the
        next connection is asked after the backoff, not at once, and the client is served."""
        daemon = gateway({"echo": RICH})
        client = client_of(daemon)
        client.open_session()
        daemon.status()  # a round trip: the daemon has noted the last answer as written
        daemon.kill()
        broken = stand_in(daemon.mcp_sock)
        try:
            until(lambda: broken.switches >= 1, within=20)
            client.send(line({"jsonrpc": "2.0", "id": "p", "method": "ping"}))
            assert client.answer("p") == {"jsonrpc": "2.0", "id": "p", "result": {}}  # stdin is read
            assert stays_false(lambda: broken.switches > 3, 2.5), (
                broken.switches
            )  # 1 s, then 2 s: not one per connection
        finally:
            broken.close()

    def test_an_older_daemon_is_asked_once_and_its_successor_again(self, gateway, client_of) -> None:
        """A daemon that does not know the switch (-32601) is not asked again: connect pumps on.
        The daemon that replaces it after a restart (an upgrade) is asked, and takes the client."""
        daemon = gateway({"echo": RICH})
        client = client_of(daemon)
        client.open_session()
        daemon.status()  # a round trip: the daemon has noted the last answer as written
        pipe = client.stdin_pipe()
        daemon.kill()
        older = OlderDaemon(daemon.mcp_sock)
        try:
            assert client.receive(within=20)["method"] == "notifications/tools/list_changed"
            until(lambda: older.switches == 1, within=WAIT)
            assert stays_false(lambda: older.switches > 1, 2.5)  # a retry would come after ~1 s
            client.send(line({"jsonrpc": "2.0", "id": "p", "method": "ping"}))
            assert client.answer("p") == {"jsonrpc": "2.0", "id": "p", "result": {}}  # pumped
        finally:
            older.close()
        daemon.start()
        daemon.wait_state("echo", "running")
        assert client.receive(within=20)["method"] == "notifications/tools/list_changed"
        until(lambda: holds(daemon.pid, pipe), within=WAIT)
        said = wait_note(client, HANDED)
        assert NEVER in said and "Method not found" in said, said
        client.send(line(call(3, "echo__echo", text="upgraded")))
        assert client.answer(3)["result"]["content"][0]["text"] == "upgraded"
