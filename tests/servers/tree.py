"""Server with a process tree that outlives it, for tree-kill and crash-detection tests.

Before serving it spawns a grandchild that inherits stdin/stdout/stderr (so it holds the
protocol stdout pipe) and that spawns a great-grandchild in a new session (setsid: it leaves
the process group, so ``killpg`` misses it). Both descendants sleep forever. Tools:
``pids()`` -> JSON ``{"server", "grandchild", "great_grandchild"}``; ``crash(code=3)`` exits
at once while the grandchild still holds stdout. Env ``TREE_SETSID_INHERITS_STDIO=1`` makes
the great-grandchild inherit the stdio pipes too (default: /dev/null).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import _raw

# argv: report fd, "1" if the great-grandchild inherits stdio. Prints nothing to stdout.
_GRANDCHILD = """
import os, subprocess, sys, time
report_fd, inherit = int(sys.argv[1]), sys.argv[2] == "1"
stdio = None if inherit else subprocess.DEVNULL
p = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(3600)"],
                     stdin=stdio, stdout=stdio, stderr=stdio, start_new_session=True)
os.write(report_fd, str(p.pid).encode())
os.close(report_fd)
while True:
    time.sleep(3600)
"""

PIDS: dict[str, int] = {}


def _spawn_descendants() -> dict[str, int]:
    """Start the grandchild and wait for it to report the great-grandchild's pid."""
    inherit = "1" if os.environ.get("TREE_SETSID_INHERITS_STDIO") == "1" else "0"
    read_fd, write_fd = os.pipe()
    grandchild = subprocess.Popen(
        [sys.executable, "-c", _GRANDCHILD, str(write_fd), inherit], pass_fds=(write_fd,)
    )
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as report:
        reported = report.read()  # EOF once the grandchild closed its end (or died)
    if not reported:
        raise RuntimeError(f"grandchild {grandchild.pid} did not report a pid")
    return {"server": os.getpid(), "grandchild": grandchild.pid, "great_grandchild": int(reported)}


def pids(args: _raw.Args) -> _raw.Content:
    """Return the pids of the whole tree as JSON text."""
    return [_raw.text(json.dumps(PIDS))]


def crash(args: _raw.Args) -> _raw.Content:
    """Exit at once with the given code; the grandchild keeps stdout open."""
    _raw.log("tree: crashing")
    os._exit(int(args.get("code", 3)))


TOOLS = {
    "pids": _raw.Tool(pids, "Pids of the server, grandchild and setsid great-grandchild."),
    "crash": _raw.Tool(crash, "Exit with a code.", {"code": {"type": "integer"}}),
}


def main() -> None:
    """Spawn the tree, then serve."""
    PIDS.update(_spawn_descendants())
    _raw.log(f"tree: pids {json.dumps(PIDS)}")
    _raw.serve("tree", TOOLS)


if __name__ == "__main__":
    main()
