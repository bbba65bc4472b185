"""A wrapper's first start (``npx -y``, ``uvx``): stderr progress for a while, then quick.py's tools.

It writes ``downloading N`` to stderr every 0.1 s, coloured the way npm colours its output
(ANSI escapes, a carriage return) and without reading stdin, until the file named by
``SLOW_START_GATE`` exists (at most 60 s), then serves like quick.py. Without the variable it
waits ``SLOW_START_SECONDS`` (default 2). Idle meanwhile (it sleeps), unless ``SLOW_START_BUSY=1``:
then it burns CPU between the lines, as a download that unpacks and compiles does (for the first
``SLOW_START_BUSY_FOR`` seconds only, when given; idle after).
"""

from __future__ import annotations

import os
import sys
import time

import _raw
import quick


def main() -> None:
    """Show progress until the gate opens (or the time is up), then serve."""
    gate = os.environ.get("SLOW_START_GATE")
    until = time.monotonic() + (60.0 if gate else float(os.environ.get("SLOW_START_SECONDS", "2")))
    busy = os.environ.get("SLOW_START_BUSY") == "1"
    busy_until = time.monotonic() + float(os.environ.get("SLOW_START_BUSY_FOR", "inf"))
    count = 0
    while time.monotonic() < until and not (gate and os.path.exists(gate)):
        count += 1
        sys.stderr.write(f"\x1b[32mdownloading\x1b[0m {count}\r\n")
        sys.stderr.flush()
        line_due = time.monotonic() + 0.1
        while busy and time.monotonic() < min(line_due, busy_until):
            pass  # a busy start: every CPU cycle it gets
        time.sleep(max(0.0, line_due - time.monotonic()))
    _raw.log("slow_start: ready")
    _raw.serve("slow_start", quick.TOOLS)


if __name__ == "__main__":
    main()
