"""The sd_notify protocol, spoken directly: readiness, status and watchdog pings to systemd.

No libsystemd: a notification is one ``KEY=value`` line per field in a single AF_UNIX datagram
sent to ``$NOTIFY_SOCKET`` (see sd_notify(3)). Without that variable every call is a no-op, so
the daemon calls these unconditionally. Library code here never reads ``os.environ``: the
caller passes the environment to :meth:`Notifier.from_environ`.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable, Mapping

import anyio
import structlog

__all__ = ("MAX_STATUS_CHARS", "Notifier", "keep_watchdog")

log = structlog.get_logger(__name__)

MAX_STATUS_CHARS = 1000  # keeps every datagram far below any socket buffer limit


class Notifier:
    """Sends sd_notify datagrams to $NOTIFY_SOCKET; does nothing when there is none.

    *address* is a socket path (``/run/systemd/notify``) or an abstract socket name written
    with a leading ``@``; ``None`` (or ``""``) disables the notifier. *watchdog_usec* is
    systemd's ``WATCHDOG_USEC``: the daemon must send ``WATCHDOG=1`` more often than that.

    Resource handling: the socket is opened on the first :meth:`send` (close-on-exec and
    non-blocking, so children never inherit it and a full systemd queue never blocks the event
    loop) and released by :meth:`close`; a later send opens a new one.

    Error handling: sending never raises. A failure is logged as ``notify.send_failed`` once
    per distinct errno for the notifier's lifetime, so a vanished systemd cannot flood the log.
    A ``STATUS`` that could not be sent (systemd's queue full: ``EAGAIN``) goes with the next
    datagram that carries none, the watchdog's ping say, so the last status is never lost.

    Not thread-safe: use it from the event loop's thread.
    """

    def __init__(self, address: str | None, *, watchdog_usec: int | None = None) -> None:
        if address and address[0] not in "/@":
            raise ValueError(f"unsupported NOTIFY_SOCKET address {address!r}: need a path or @name")
        if watchdog_usec is not None and watchdog_usec <= 0:
            raise ValueError(f"watchdog_usec must be positive, got {watchdog_usec}")
        self._address = address or None
        self._target = "\0" + address[1:] if address and address[0] == "@" else address
        self._watchdog_usec = watchdog_usec if self._address else None
        self._sock: socket.socket | None = None
        self._reported: set[int | None] = set()  # errnos already logged
        self._unsent_status: str | None = None  # the last STATUS a send failed to deliver

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Notifier:
        """A notifier for ``NOTIFY_SOCKET``, with the watchdog of ``WATCHDOG_USEC`` if it is ours.

        ``WATCHDOG_USEC`` counts only when ``WATCHDOG_PID`` is unset or is this process's pid
        (systemd sets it for the main process; a child that inherited it must not ping).
        Malformed values are logged (``notify.bad_environ``) and ignored; never raises.
        """
        address = environ.get("NOTIFY_SOCKET") or None
        if address and address[0] not in "/@":
            log.warning("notify.bad_environ", variable="NOTIFY_SOCKET", value=address)
            address = None
        return cls(address, watchdog_usec=_watchdog_usec(environ) if address else None)

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half of ``WATCHDOG_USEC``); None without a watchdog."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 2_000_000

    def send(self, **fields: str | int) -> bool:
        """Send *fields* as one datagram, e.g. ``send(READY=1, STATUS="3 running")``.

        Keys are sent as given (systemd's are upper case). Newlines in values become spaces
        (a newline would start a new field) and ``STATUS`` is cut to :data:`MAX_STATUS_CHARS`.

        Returns:
            True when the datagram was sent; False when disabled, *fields* is empty, or the
            send failed (logged as ``notify.send_failed``).
        """
        if self._target is None or not fields:
            return False
        if self._unsent_status is not None and "STATUS" not in fields:
            fields = {**fields, "STATUS": self._unsent_status}
        status = fields.get("STATUS")
        payload = "\n".join(f"{key}={_clean(key, value)}" for key, value in fields.items())
        try:
            if self._sock is None:
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto(payload.encode(), self._target)
        except OSError as exc:
            if status is not None:
                self._unsent_status = str(status)
            if exc.errno not in self._reported:
                self._reported.add(exc.errno)
                log.warning(
                    "notify.send_failed",
                    address=self._address,
                    error=exc.strerror or str(exc),
                    errno=errno.errorcode.get(exc.errno, exc.errno) if exc.errno else None,
                    fields=sorted(fields),
                )
            return False
        self._unsent_status = None
        return True

    def ready(self, status: str | None = None) -> None:
        """Tell systemd startup is complete (``READY=1``), with an optional status line."""
        if status is None:
            self.send(READY=1)
        else:
            self.send(READY=1, STATUS=status)

    def reloading(self) -> None:
        """Tell systemd a reload began; follow with :meth:`ready` when it is done.

        Carries ``MONOTONIC_USEC``, which ``Type=notify-reload`` (systemd 253+) requires.
        """
        self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self) -> None:
        """Tell systemd the daemon is shutting down (``STOPPING=1``)."""
        self.send(STOPPING=1)

    def status(self, text: str) -> None:
        """Set the one-line status ``systemctl status`` shows."""
        self.send(STATUS=text)

    def watchdog(self) -> None:
        """Ping the watchdog (``WATCHDOG=1``)."""
        self.send(WATCHDOG=1)

    def close(self) -> None:
        """Release the socket. Idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


async def keep_watchdog(notifier: Notifier, healthy: Callable[[], bool] = lambda: True) -> None:
    """Send ``WATCHDOG=1`` every ``watchdog_interval`` seconds while *healthy()* is true.

    Returns at once when *notifier* has no watchdog; otherwise runs until cancelled. It runs
    on the event loop on purpose: a blocked loop stops the pings, and systemd then kills and
    restarts the daemon. While *healthy()* is false no pings are sent (logged once per
    unhealthy spell as ``notify.watchdog_withheld``); they resume when it is true again.
    """
    interval = notifier.watchdog_interval
    if interval is None:
        return
    withholding = False
    while True:
        if healthy():
            if withholding:
                log.info("notify.watchdog_resumed")
                withholding = False
            notifier.watchdog()
        elif not withholding:
            log.warning("notify.watchdog_withheld", interval=interval)
            withholding = True
        await anyio.sleep(interval)


def _watchdog_usec(environ: Mapping[str, str]) -> int | None:
    """``WATCHDOG_USEC`` if it is meant for this process and well-formed, else None."""
    raw_usec, raw_pid = environ.get("WATCHDOG_USEC"), environ.get("WATCHDOG_PID")
    if not raw_usec:
        return None
    try:
        usec, pid = int(raw_usec), int(raw_pid) if raw_pid else None
    except ValueError:
        log.warning("notify.bad_environ", variable="WATCHDOG_USEC/WATCHDOG_PID", value=[raw_usec, raw_pid])
        return None
    if pid is not None and pid != os.getpid():
        return None  # inherited from a parent that systemd watches, not us
    if usec <= 0:
        log.warning("notify.bad_environ", variable="WATCHDOG_USEC", value=raw_usec)
        return None
    return usec


def _clean(key: str, value: str | int) -> str:
    text = str(int(value)) if isinstance(value, int) else value.replace("\n", " ")
    return text[:MAX_STATUS_CHARS] if key == "STATUS" else text
