"""Fd passing end to end: ``connect`` hands its client's pipes to a real daemon, and takes them back.

The client here is this test, on real pipes to a real ``mcp-supervisor connect``, line by line,
so that a break can fall anywhere: mid-call, mid-line, at the end of input.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.gateway.handoff.handed import MAX_ID
from supervisor.gateway.hello import HANDOFF_METHOD
from supervisor.gateway.stdio import MAX_MESSAGE
from tests.harness.daemon import Daemon, until
from tests.harness.servers import extension_settings

pytestmark = pytest.mark.timeout(60)
WAIT = 30.0  # a line from connect, two suites at once: 10 s was missed (pair 6)
HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
INITIALIZE = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": HELLO}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
IN_FLIGHT = "may or may not have run"
# What connect hands over is bytes: the extension behind is the standard library's rich.py
# (echo, wait), which starts without the SDK's 1.8 s of imports.
ECHO = extension_settings("rich.py")


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def call(request_id: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


class Client:
    """``mcp-supervisor connect`` on pipes, spoken to line by line."""

    def __init__(self, daemon: Daemon, *extra: str, env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "supervisor", "connect", "--socket", daemon.socket, *extra]
        pipe = subprocess.PIPE
        environment = {**os.environ, **(env or {})}
        self.process = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=pipe, env=environment)
        self._pending = b""

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def receive(self, within: float = WAIT) -> dict[str, Any]:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + within
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no line within {within} s (have {self._pending[:200]!r})"
            data = os.read(fd, 1 << 16)
            assert data, f"stdout ended (have {self._pending[:200]!r})"
            self._pending += data
        first, _, self._pending = self._pending.partition(b"\n")
        return json.loads(first)

    def answer(self, request_id: Any) -> dict[str, Any]:
        """The answer to *request_id*, past the notifications before it."""
        while True:
            message = self.receive()
            if message.get("id") == request_id and "method" not in message:
                return message

    def notified(self, method: str, within: float = 20.0) -> None:
        """Until the notification *method* comes, past the others (rich.py's prompts and
        resources change with its tools)."""
        deadline = time.monotonic() + within
        while self.receive(max(0.0, deadline - time.monotonic())).get("method") != method:
            pass

    def open_session(self) -> None:
        self.send(line(INITIALIZE))
        assert "result" in self.answer("init")
        self.send(line(INITIALIZED) + line({"jsonrpc": "2.0", "id": "list", "method": "tools/list"}))
        assert "result" in self.answer("list")

    def unread_input(self) -> int:
        """Bytes written to connect's stdin that nobody has read yet."""
        assert self.process.stdin is not None
        raw = fcntl.ioctl(self.process.stdin.fileno(), termios.FIONREAD, b"\0\0\0\0")
        return struct.unpack("i", raw)[0]

    def stdin_pipe(self) -> str:
        """The pipe connect reads as its stdin, as /proc names it."""
        return os.readlink(f"/proc/{self.process.pid}/fd/0")

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=WAIT)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(daemon: Daemon, *extra: str, env: dict[str, str] | None = None) -> Client:
        client = Client(daemon, *extra, env=env)
        made.append(client)
        return client

    yield make
    for client in made:
        client.kill()


def holds(pid: int, target: str) -> bool:
    """Whether process *pid* has *target* (a /proc fd link, e.g. ``pipe:[123]``) open."""
    return bool(fds_of(pid, target))


def fds_of(pid: int, target: str) -> list[Path]:
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == target:
                found.append(fd)
        except FileNotFoundError:
            continue
    return found


@contextmanager
def live_session(daemon: Daemon) -> Iterator[tuple[socket.socket, Any]]:
    """A raw connection to *daemon*'s mcp.sock, initialized: the socket and its unbuffered lines."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(WAIT)
        sock.connect(daemon.mcp_sock)
        replies = sock.makefile("rb", buffering=0)  # nothing read ahead: fds may follow a line
        sock.sendall(line(INITIALIZE))
        assert "result" in json.loads(replies.readline())
        yield sock, replies


def handoff_line(**params: Any) -> bytes:
    return line({"jsonrpc": "2.0", "id": 1, "method": HANDOFF_METHOD, "params": {"profile": None, **params}})


@contextmanager
def restarted(daemon: Daemon) -> Iterator[None]:
    """SIGKILL the daemon (as a crash would); start it again on leaving the block."""
    daemon.kill()
    try:
        yield
    finally:
        daemon.start()
        daemon.wait_state("echo", "running")


class TestHandedOver:
    def test_the_daemon_serves_the_client_pipes_itself(self, gateway, clients) -> None:
        """connect hands its stdio over: the daemon holds the client's pipe, answers on it, and lets
        go of it when the client ends; connect exits 0."""
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        pipe = client.stdin_pipe()
        [held] = fds_of(daemon.pid, pipe)
        flags = int(
            Path(f"/proc/{daemon.pid}/fdinfo/{held.name}").read_text().split("flags:")[1].split()[0], 8
        )
        assert flags & os.O_CLOEXEC  # no child of the daemon inherits a client's pipe
        client.send(line(call(1, "echo__echo", text="hi")))
        assert client.answer(1)["result"]["content"][0]["text"] == "hi"
        assert client.close() == 0
        until(lambda: not holds(daemon.pid, pipe), within=WAIT)

    def test_answers_due_at_the_end_of_input_still_come(self, gateway, clients) -> None:
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        client.send(line(call(1, "echo__wait", seconds=0.3)))
        assert client.process.stdin is not None
        client.process.stdin.close()
        assert "result" in client.answer(1)
        assert client.process.wait(timeout=WAIT) == 0

    def test_environment_can_keep_connect_pumping(self, gateway, clients) -> None:
        daemon = gateway({"echo": ECHO})
        client = clients(daemon, env={"MCP_SUPERVISOR_HANDOFF": "0"})
        client.open_session()
        assert not holds(daemon.pid, client.stdin_pipe())
        assert client.close() == 0

    def test_a_profile_is_chosen_in_the_handoff(self, gateway, clients) -> None:
        daemon = gateway({"echo": ECHO}, profiles={"some": {"tools": {"allow": ["*__echo"]}}})
        client = clients(daemon, "--profile", "some")
        client.open_session()
        assert holds(daemon.pid, client.stdin_pipe())
        client.send(line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        assert [tool["name"] for tool in client.answer(2)["result"]["tools"]] == ["echo__echo"]
        unknown = clients(daemon, "--profile", "nope")
        assert unknown.process.wait(timeout=WAIT) == 2


@pytest.mark.timeout(150)  # a restart each (two in one), and each took 20-30 s with two suites at once
class TestTheDaemonDies:
    def test_a_call_in_flight_fails_and_the_session_goes_on(self, gateway, clients) -> None:
        """SIGKILL mid-call: connect answers the call with an error, waits for a daemon, resumes the
        session there (the client is told to list again), and calls work."""
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        client.send(line(call(1, "echo__wait", seconds=30)))
        until(lambda: daemon.status()["echo"]["in_flight"] == 1, within=WAIT)
        with restarted(daemon):
            error = client.answer(1)["error"]
            assert IN_FLIGHT in error["message"]
        client.notified("notifications/tools/list_changed")
        client.send(line(call(2, "echo__echo", text="after")))
        assert client.answer(2)["result"]["content"][0]["text"] == "after"
        until(lambda: holds(daemon.pid, client.stdin_pipe()), within=WAIT)  # handed over again

    def test_a_line_half_read_by_the_dead_daemon_reaches_the_next(self, gateway, clients) -> None:
        """The daemon had read half a request when it died: connect has those bytes from its
        journal, and the request, completed, is answered by the next daemon."""
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        whole = line(call(7, "echo__echo", text="split"))
        client.send(whole[:20])
        until(lambda: client.unread_input() == 0, within=WAIT)  # the daemon has it
        with restarted(daemon):
            client.send(whole[20:])
        assert client.answer(7)["result"]["content"][0]["text"] == "split"

    def test_a_graceful_stop_hands_the_client_back_and_over_again(self, gateway, clients) -> None:
        """SIGTERM: connect takes the client back, resumes on the next daemon, and hands the
        client over to it once nothing is on its way; twice over."""
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        pipe = client.stdin_pipe()
        for round_ in range(2):
            assert daemon.terminate() == 0
            daemon.start()
            daemon.wait_state("echo", "running")
            client.notified("notifications/tools/list_changed")
            until(lambda: holds(daemon.pid, pipe), within=WAIT)  # handed over again
            client.send(line(call(round_, "echo__echo", text="back")))
            assert client.answer(round_)["result"]["content"][0]["text"] == "back"

    def test_a_session_ended_by_the_daemon_hands_its_calls_in_flight_back(self, gateway, clients) -> None:
        """The daemon ends a handed session on its own (here: a message over its cap), alive: the
        call in flight is not forgotten, connect answers it with an error and carries on."""
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        client.send(line(call(1, "echo__wait", seconds=30)))
        until(lambda: daemon.status()["echo"]["in_flight"] == 1, within=WAIT)
        chunk = b"x" * (1 << 20)
        for _ in range(MAX_MESSAGE // len(chunk) + 1):
            client.send(chunk)
        client.send(b"\n")
        errors = []
        while not any(message.get("id") == 1 for message in errors):
            errors.append(client.receive(within=20))
        assert IN_FLIGHT in next(m for m in errors if m.get("id") == 1)["error"]["message"]
        client.send(line(call(2, "echo__echo", text="on")))
        assert client.answer(2)["result"]["content"][0]["text"] == "on"

    def test_odd_requests_leave_the_session_standing(self, gateway, clients) -> None:
        """A cancellation naming a list (while a set-up request is in flight), and an id too long
        to journal (answered -32600)."""
        daemon = gateway({"echo": ECHO})
        client = clients(daemon)
        client.open_session()
        level = {"jsonrpc": "2.0", "id": "level", "method": "logging/setLevel", "params": {"level": "info"}}
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1]}}
        long_id = "i" * (MAX_ID + 1)
        client.send(line(level) + line(cancel) + line(call(long_id, "echo__echo", text="x")))
        assert client.answer(long_id)["error"]["code"] == -32600
        client.send(line(call(2, "echo__echo", text="still")))
        assert client.answer(2)["result"]["content"][0]["text"] == "still"
        assert holds(daemon.pid, client.stdin_pipe())


class TestBounds:
    def test_a_killed_connect_ends_its_session_and_no_other(self, gateway, clients) -> None:
        """connect SIGKILLed while its client lives: the daemon lets go of the client's pipes (the
        client sees its server's output end), and another client goes on."""
        daemon = gateway({"echo": ECHO})
        gone, other = clients(daemon), clients(daemon)
        gone.open_session()
        other.open_session()
        pipe = gone.stdin_pipe()
        gone.send(line(call(1, "echo__wait", seconds=30)))
        until(lambda: daemon.status()["echo"]["in_flight"] == 1, within=WAIT)
        gone.kill()
        until(lambda: not holds(daemon.pid, pipe), within=WAIT)
        until(lambda: daemon.status()["echo"]["in_flight"] == 0, within=WAIT)  # its call was cancelled
        other.send(line(call(2, "echo__echo", text="fine")))
        assert other.answer(2)["result"]["content"][0]["text"] == "fine"

    @pytest.mark.parametrize(
        ("fds", "problem"),
        [
            ("file", "neither a pipe nor a socket"),
            ("one", "expected 2 fds"),
            ("wrong way", "not open for reading"),
        ],
    )
    def test_an_unusable_handoff_is_refused_and_nothing_is_kept(
        self, gateway, tmp_path, fds, problem
    ) -> None:
        daemon = gateway({"echo": ECHO})
        before = psutil.Process(daemon.pid).num_fds()
        read_end, write_end = os.pipe()
        plain = (tmp_path / "file").open("w+b")
        passed = {
            "file": [plain.fileno(), write_end],
            "one": [read_end],
            "wrong way": [write_end, write_end],
        }[fds]
        request = {"jsonrpc": "2.0", "id": 1, "method": HANDOFF_METHOD, "params": {"profile": None}}
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(WAIT)
            sock.connect(daemon.mcp_sock)
            socket.send_fds(sock, [line(request)], passed)
            reply = json.loads(sock.makefile("rb").readline())
        assert problem in reply["error"]["message"]
        until(lambda: psutil.Process(daemon.pid).num_fds() <= before, within=WAIT)
        for fd in (read_end, write_end):
            os.close(fd)
        plain.close()

    def test_fds_sent_with_anything_else_are_closed(self, gateway) -> None:
        """fds attached to a plain first line are not kept: the session is an ordinary one."""
        daemon = gateway({"echo": ECHO})
        read_end, write_end = os.pipe()
        pipe = os.readlink(f"/proc/self/fd/{read_end}")
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(WAIT)
            sock.connect(daemon.mcp_sock)
            socket.send_fds(sock, [line(INITIALIZE)], [read_end, write_end, read_end])
            assert "result" in json.loads(sock.makefile("rb").readline())
            # The pipe itself, not a count of the daemon's fds: under load a count caught one
            # opened for something else (a catalog written, a scan of /proc) at that moment.
            assert not holds(daemon.pid, pipe)
        os.close(read_end)
        os.close(write_end)

    def test_a_handoff_nested_too_deep_keeps_no_fd(self, gateway) -> None:
        daemon = gateway({"echo": ECHO})
        before = psutil.Process(daemon.pid).num_fds()
        deep = b'{"method": "mcp-supervisor/handoff", "params": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"
        for _ in range(5):
            read_end, write_end = os.pipe()
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(WAIT)
                sock.connect(daemon.mcp_sock)
                socket.send_fds(sock, [deep], [read_end, write_end])
                sock.makefile("rb").readline()  # an error, as for any line that is no request
            os.close(read_end)
            os.close(write_end)
        until(lambda: psutil.Process(daemon.pid).num_fds() <= before, within=WAIT)

    def test_an_unacknowledged_handoff_never_touches_the_pipes(self, gateway) -> None:
        """A connect that gave up waiting pumps the client itself: the daemon, whose answer came
        too late, must not read a byte of its stdin."""
        daemon = gateway({"echo": ECHO})
        before = psutil.Process(daemon.pid).num_fds()
        read_end, write_end = os.pipe()
        out_read, out_write = os.pipe()
        os.write(write_end, line(INITIALIZE))
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(WAIT)
            sock.connect(daemon.mcp_sock)
            socket.send_fds(sock, [handoff_line()], [read_end, out_write])
            answer, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
            assert b'"handoff": true' in answer and len(fds) == 1
            os.close(fds[0])
        until(lambda: psutil.Process(daemon.pid).num_fds() <= before, within=WAIT)
        assert os.get_blocking(read_end)  # not even set non-blocking (the mode is the pipe's, shared)
        assert os.read(read_end, 1 << 16) == line(INITIALIZE)  # still there
        for fd in (read_end, write_end, out_read, out_write):
            os.close(fd)

    @pytest.mark.timeout(60)
    def test_a_handoff_never_acknowledged_is_let_go_after_its_deadline(self, gateway) -> None:
        """A client that takes the answer and then says nothing holds the pipes for 10 s at most."""
        daemon = gateway({"echo": ECHO})
        read_end, write_end = os.pipe()
        out_read, out_write = os.pipe()
        pipe = os.readlink(f"/proc/self/fd/{read_end}")
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(WAIT)
            sock.connect(daemon.mcp_sock)
            socket.send_fds(sock, [handoff_line()], [read_end, out_write])
            _, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
            os.close(fds[0])
            assert holds(daemon.pid, pipe)
            started = time.monotonic()
            until(lambda: not holds(daemon.pid, pipe), within=20)
            assert time.monotonic() - started < 15
            sock.settimeout(WAIT)
            assert sock.recv(1) == b""  # and the connection is closed
        for fd in (read_end, write_end, out_read, out_write):
            os.close(fd)

    def test_a_switch_given_up_by_its_client_loses_no_byte(self, gateway) -> None:
        """A live session asks for a switch, hears "ready", then sends a plain request instead
        of the fds (as a connect that gave up does): the request is served whole."""
        daemon = gateway({"echo": ECHO})
        with live_session(daemon) as (sock, replies):
            sock.sendall(handoff_line(switch=True))
            assert json.loads(replies.readline())["result"] == {"ready": True}
            sock.sendall(line({"jsonrpc": "2.0", "id": "p", "method": "ping"}))
            assert json.loads(replies.readline()) == {"jsonrpc": "2.0", "id": "p", "result": {}}

    def test_a_switch_followed_by_more_input_is_refused_for_now(self, gateway) -> None:
        """A switch asked with more input behind it is refused with the handoff's own -32602, not
        -32601 (which tells connect that the daemon never can), and the input after it is served."""
        daemon = gateway({"echo": ECHO})
        with live_session(daemon) as (sock, replies):
            sock.sendall(handoff_line(switch=True) + line({"jsonrpc": "2.0", "id": "p", "method": "ping"}))
            refused = json.loads(replies.readline())
            assert refused["id"] == 1 and refused["error"]["code"] == -32602, refused
            assert json.loads(replies.readline()) == {"jsonrpc": "2.0", "id": "p", "result": {}}

    @pytest.mark.timeout(60)
    def test_a_switch_never_acknowledged_keeps_no_fd(self, gateway) -> None:
        """A live session asks, sends the fds, takes the journal and says nothing more: the daemon
        ends the connection after its deadline, with no fd of it left (the journal's neither)."""
        daemon = gateway({"echo": ECHO})
        before = psutil.Process(daemon.pid).num_fds()
        read_end, write_end = os.pipe()
        out_read, out_write = os.pipe()
        with live_session(daemon) as (sock, replies):
            sock.sendall(handoff_line(switch=True))
            assert json.loads(replies.readline())["result"] == {"ready": True}
            socket.send_fds(sock, [b"F"], [read_end, out_write])
            answer, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
            assert b'"handoff": true' in answer and len(fds) == 1
            os.close(fds[0])
            sock.settimeout(20)
            assert sock.recv(1) == b""  # ended after its deadline
        until(lambda: psutil.Process(daemon.pid).num_fds() <= before, within=WAIT)
        for fd in (read_end, write_end, out_read, out_write):
            os.close(fd)
