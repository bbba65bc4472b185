"""Fast raw-protocol echo server: the workhorse for restart-heavy supervisor tests.

Tools: ``echo(text)``, ``crash(code=3)``, ``pid()``, ``sleep(seconds)`` (blocking: one request
at a time). Env ``QUICK_STDERR_AT_START=N`` writes N numbered stderr lines at startup;
``QUICK_LINGER=S`` waits S seconds after stdin closes before exiting (a slow stop).
"""

from __future__ import annotations

import os
import time

import _raw


def echo(args: _raw.Args) -> _raw.Content:
    """Return the text unchanged."""
    return [_raw.text(str(args["text"]))]


def crash(args: _raw.Args) -> _raw.Content:
    """Exit at once with the given code, without answering."""
    _raw.log("quick: crashing")
    os._exit(int(args.get("code", 3)))


def pid(args: _raw.Args) -> _raw.Content:
    """Return this process's pid."""
    return [_raw.text(str(os.getpid()))]


def sleep(args: _raw.Args) -> _raw.Content:
    """Block for the given number of seconds, then answer "slept"."""
    time.sleep(float(args.get("seconds", 3600)))
    return [_raw.text("slept")]


TOOLS = {
    "echo": _raw.Tool(echo, "Echo text back.", {"text": {"type": "string"}}, ("text",)),
    "crash": _raw.Tool(crash, "Exit with a code.", {"code": {"type": "integer"}}),
    "pid": _raw.Tool(pid, "This server's pid."),
    "sleep": _raw.Tool(sleep, "Sleep, then answer.", {"seconds": {"type": "number"}}),
}


def main() -> None:
    """Write the requested startup stderr lines, then serve."""
    for i in range(int(os.environ.get("QUICK_STDERR_AT_START", "0"))):
        _raw.log(f"quick: start line {i + 1}")
    _raw.serve("quick", TOOLS)
    time.sleep(float(os.environ.get("QUICK_LINGER", "0")))


if __name__ == "__main__":
    main()
