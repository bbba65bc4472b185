"""Server that only SIGKILL can end: ignores SIGTERM (and INT, HUP) and outlives stdin EOF.

For stop_timeout / escalation tests. Tool: ``pid()``. Writes "stubborn: ready ..." to stderr
once the signals are ignored (safe to signal from then on), and on stdin EOF writes
"stubborn: stdin closed, staying alive" and sleeps forever.
"""

from __future__ import annotations

import os
import signal
import time

import _raw


def pid(args: _raw.Args) -> _raw.Content:
    """Return this process's pid."""
    return [_raw.text(str(os.getpid()))]


TOOLS = {"pid": _raw.Tool(pid, "This server's pid.")}


def main() -> None:
    """Ignore polite signals, serve, then outlive stdin."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _raw.log("stubborn: ready (ignoring SIGTERM, SIGINT, SIGHUP)")
    _raw.serve("stubborn", TOOLS)
    _raw.log("stubborn: stdin closed, staying alive")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
