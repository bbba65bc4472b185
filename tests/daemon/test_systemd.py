"""notify.py: sd_notify datagrams as a real systemd socket receives them, and the watchdog loop."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from supervisor.daemon.systemd import MAX_STATUS_CHARS, Notifier, keep_watchdog
from tests.harness.timing import fail_after

pytestmark = pytest.mark.timeout(30)


class Receiver:
    """A bound AF_UNIX datagram socket standing in for systemd's notify socket."""

    def __init__(self, address: str) -> None:
        self.address = address  # as NOTIFY_SOCKET spells it
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)

    async def receive(self, within: float = 2.0) -> str:
        """The next datagram, failing if none arrives within *within* seconds."""
        with fail_after(within):
            while True:
                await anyio.wait_readable(self.sock)
                try:
                    return self.sock.recv(65536).decode()
                except BlockingIOError:  # woken without data: wait again
                    continue

    def pending(self) -> list[str]:
        """Every datagram already queued, without waiting."""
        found = []
        while True:
            try:
                found.append(self.sock.recv(65536).decode())
            except BlockingIOError:
                return found

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def receiver(short_tmp: Path) -> Iterator[Receiver]:
    r = Receiver(str(short_tmp / "notify"))
    yield r
    r.close()


@pytest.fixture
def notifier(receiver: Receiver) -> Iterator[Notifier]:
    n = Notifier(receiver.address)
    yield n
    n.close()


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class TestDatagrams:
    @pytest.mark.anyio
    async def test_ready(self, notifier: Notifier, receiver: Receiver) -> None:
        """ready() sends READY=1 alone, or READY=1 and STATUS in one datagram."""
        notifier.ready()
        notifier.ready("2 running, 0 failed")
        assert await receiver.receive() == "READY=1"
        assert await receiver.receive() == "READY=1\nSTATUS=2 running, 0 failed"

    @pytest.mark.anyio
    async def test_status_is_one_line_and_bounded(self, notifier: Notifier, receiver: Receiver) -> None:
        """status() turns newlines into spaces and cuts the text to MAX_STATUS_CHARS."""
        notifier.status("starting\n3 extensions")
        notifier.status("x" * 5000)
        assert await receiver.receive() == "STATUS=starting 3 extensions"
        assert await receiver.receive() == "STATUS=" + "x" * MAX_STATUS_CHARS

    @pytest.mark.anyio
    async def test_reloading_carries_monotonic_usec(self, notifier: Notifier, receiver: Receiver) -> None:
        """reloading() sends RELOADING=1 and MONOTONIC_USEC read from CLOCK_MONOTONIC at send time."""
        before = monotonic_usec()
        notifier.reloading()
        after = monotonic_usec()
        first, second = (await receiver.receive()).split("\n")
        assert first == "RELOADING=1"
        key, _, value = second.partition("=")
        assert key == "MONOTONIC_USEC"
        assert before <= int(value) <= after

    @pytest.mark.anyio
    async def test_stopping_and_watchdog(self, notifier: Notifier, receiver: Receiver) -> None:
        """stopping() and watchdog() each send their one field."""
        notifier.stopping()
        notifier.watchdog()
        assert await receiver.receive() == "STOPPING=1"
        assert await receiver.receive() == "WATCHDOG=1"

    @pytest.mark.anyio
    async def test_send_joins_fields_in_order(self, notifier: Notifier, receiver: Receiver) -> None:
        """send() returns True and writes one KEY=value line per field, newlines in values flattened."""
        assert notifier.send(READY=1, STATUS="a\nb", MAINPID=42) is True
        assert await receiver.receive() == "READY=1\nSTATUS=a b\nMAINPID=42"

    @pytest.mark.anyio
    async def test_abstract_address(self) -> None:
        """An address starting with @ reaches the abstract socket of that name."""
        receiver = Receiver(f"@mcps-test-{uuid.uuid4().hex}")
        notifier = Notifier(receiver.address)
        try:
            assert notifier.send(READY=1) is True
            assert await receiver.receive() == "READY=1"
        finally:
            notifier.close()
            receiver.close()

    def test_socket_is_close_on_exec(self, notifier: Notifier) -> None:
        """The notify socket is not inherited by the extensions the daemon spawns."""
        notifier.watchdog()
        sock = notifier._sock
        assert sock is not None
        assert not os.get_inheritable(sock.fileno())
        notifier.close()
        notifier.close()  # idempotent
        assert sock.fileno() == -1


class TestDisabled:
    def test_no_address_sends_nothing(self, receiver: Receiver) -> None:
        """Without NOTIFY_SOCKET the notifier is disabled, send() returns False and nothing arrives."""
        notifier = Notifier.from_environ({})
        assert not notifier.enabled
        assert notifier.send(READY=1) is False
        notifier.ready("x")
        notifier.watchdog()
        notifier.close()
        assert receiver.pending() == []

    def test_empty_fields_send_nothing(self, notifier: Notifier, receiver: Receiver) -> None:
        """send() with no fields returns False and sends no empty datagram."""
        assert notifier.send() is False
        assert receiver.pending() == []

    def test_unsupported_address_is_refused(self) -> None:
        """The constructor refuses a relative address; from_environ logs it and disables itself."""
        with pytest.raises(ValueError):
            Notifier("relative/notify")
        with capture_logs() as logs:
            notifier = Notifier.from_environ({"NOTIFY_SOCKET": "vsock:2:1234"})
        assert not notifier.enabled
        assert [entry["event"] for entry in logs] == ["notify.bad_environ"]


class TestFromEnviron:
    def test_socket_and_watchdog(self) -> None:
        """NOTIFY_SOCKET enables it; WATCHDOG_USEC without WATCHDOG_PID gives half of it as the interval."""
        notifier = Notifier.from_environ(
            {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000"}
        )
        assert notifier.enabled
        assert notifier.watchdog_interval == 15.0

    def test_watchdog_for_this_pid(self) -> None:
        """WATCHDOG_PID equal to our pid keeps the watchdog."""
        environ = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": str(os.getpid())}
        assert Notifier.from_environ(environ).watchdog_interval == 0.05

    def test_watchdog_for_another_pid_is_ignored(self) -> None:
        """WATCHDOG_PID naming another process (we inherited it) means no watchdog, but notify still works."""
        environ = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": str(os.getpid() + 1)}
        notifier = Notifier.from_environ(environ)
        assert notifier.enabled
        assert notifier.watchdog_interval is None

    @pytest.mark.parametrize(
        "environ",
        [
            {"WATCHDOG_USEC": "100000"},  # no socket to ping
            {"NOTIFY_SOCKET": "@x"},
            {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "0"},
            {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "soon"},
            {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "me"},
        ],
    )
    def test_no_watchdog(self, environ: dict[str, str]) -> None:
        """Missing, zero or malformed watchdog variables, or no socket, mean no watchdog."""
        assert Notifier.from_environ(environ).watchdog_interval is None


class TestFailures:
    def test_vanished_socket_is_logged_once_per_errno(self, notifier: Notifier, receiver: Receiver) -> None:
        """Sends to a gone socket return False; each distinct errno is logged once, never raised."""
        assert notifier.send(READY=1) is True
        path = receiver.address
        receiver.close()
        os.unlink(path)
        with capture_logs() as logs:
            assert notifier.send(WATCHDOG=1) is False  # ENOENT
            assert notifier.send(WATCHDOG=1) is False
            notifier.stopping()
            stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            stale.bind(path)
            stale.close()  # the file stays, nobody listens: ECONNREFUSED
            assert notifier.send(WATCHDOG=1) is False
            assert notifier.send(WATCHDOG=1) is False
        failures = [entry for entry in logs if entry["event"] == "notify.send_failed"]
        assert [entry["errno"] for entry in failures] == ["ENOENT", "ECONNREFUSED"]
        assert all(entry["log_level"] == "warning" for entry in failures)

    def test_a_status_systemd_had_no_room_for_goes_with_the_next_ping(
        self, notifier: Notifier, receiver: Receiver
    ) -> None:
        """systemd's queue full (``net.unix.max_dgram_qlen``, 10 here): the status sent then is
        not lost, it rides on the next datagram, and only the last one counts."""
        while notifier.send(WATCHDOG=1):  # fill the queue
            pass
        notifier.status("2 running")
        notifier.status("1 running, 1 stopped")
        assert receiver.pending()  # systemd reads its queue
        notifier.watchdog()
        assert receiver.pending() == ["WATCHDOG=1\nSTATUS=1 running, 1 stopped"]
        notifier.watchdog()
        assert receiver.pending() == ["WATCHDOG=1"]  # once delivered, not again


class TestKeepWatchdog:
    @pytest.mark.anyio
    async def test_pings_at_half_the_watchdog_period(self, receiver: Receiver) -> None:
        """With WATCHDOG_USEC=100000 it pings every 0.05 s: four pings arrive well within 0.3 s."""
        notifier = Notifier(receiver.address, watchdog_usec=100_000)
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_watchdog, notifier)
            started = time.monotonic()
            with fail_after(0.3):
                pings = [await receiver.receive() for _ in range(4)]
            elapsed = time.monotonic() - started
            tg.cancel_scope.cancel()
        notifier.close()
        assert pings == ["WATCHDOG=1"] * 4
        assert elapsed >= 3 * 0.05 * 0.9, "pinged faster than the interval"

    @pytest.mark.anyio
    async def test_unhealthy_withholds_pings(self, receiver: Receiver) -> None:
        """While healthy() is false no ping is sent; pings resume when it is true again."""
        notifier = Notifier(receiver.address, watchdog_usec=100_000)
        ok = True
        refusals = 0
        refused_enough = anyio.Event()

        def healthy() -> bool:
            nonlocal refusals
            if not ok:
                refusals += 1
                if refusals == 3:
                    refused_enough.set()
            return ok

        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_watchdog, notifier, healthy)
                assert await receiver.receive() == "WATCHDOG=1"
                ok = False
                receiver.pending()  # pings sent before the flip; the loop runs in this thread
                with fail_after(2):
                    await refused_enough.wait()
                withheld = receiver.pending()
                ok = True
                resumed = await receiver.receive()
                tg.cancel_scope.cancel()
        notifier.close()
        assert withheld == []
        assert resumed == "WATCHDOG=1"
        events = [entry["event"] for entry in logs]
        assert events == ["notify.watchdog_withheld", "notify.watchdog_resumed"]

    @pytest.mark.anyio
    async def test_returns_at_once_without_watchdog(self, receiver: Receiver) -> None:
        """Without a watchdog (or without a socket) it returns immediately and sends nothing."""
        with fail_after(1):
            await keep_watchdog(Notifier(receiver.address))
            await keep_watchdog(Notifier(None, watchdog_usec=100_000))
        assert receiver.pending() == []
