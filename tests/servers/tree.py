"""Server with a process tree that outlives it, for tree-kill and crash-detection tests.

Before serving it spawns a grandchild that inherits stdin/stdout/stderr (so it holds the
protocol stdout pipe) and that spawns a great-grandchild in a new session (setsid: it leaves
the process group, so ``killpg`` misses it). Both descendants sleep forever. Tools:
``pids()`` -> JSON ``{"server", "grandchild", "great_grandchild"}``; ``crash(code=3)`` exits
at once while the grandchild still holds stdout. Env ``TREE_SETSID_INHERITS_STDIO=1`` makes
the great-grandchild inherit the stdio pipes too (default: /dev/null).

``--mode M`` picks another shape for the containment tests (``--tag T``: every descendant
carries ``T-<server pid>`` in its command line, which is how a test finds survivors):

* ``child``: no descendants at all;
* ``group``: one grandchild in the server's process group;
* ``double``: a double fork with setsid in between; the grandchild exits, so the survivor
  is an orphan in a session of its own;
* ``forkloop``: a grandchild in a session of its own that ignores SIGTERM and, once it gets
  one (or its parent dies), forks a child living 0.3 s every 2 ms for as long as it lives;
* ``clearenv``: a grandchild that starts a great-grandchild with setsid and an empty
  environment (no marker), and stays alive;
* ``scrub``: the worst case: a double fork with setsid and an empty environment (``scan``
  containment can attribute it only while the daemon lives).

In these modes the server reports ``tree: ready <mode>`` on stderr once its tree stands.
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

# argv: report fd, run tag. Each shape writes its final pid to the fd once it stands.
_SLEEP = "import time\nwhile True: time.sleep(3600)\n"
_REPORT = (
    "import os, sys\nos.write(int(sys.argv[1]), str(os.getpid()).encode()); os.close(int(sys.argv[1]))\n"
)
_SHAPES = {
    "group": _REPORT + _SLEEP,
    "double": (
        "import os, sys\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\n"
        + _REPORT
        + _SLEEP
    ),
    "forkloop": (
        "import os, signal, sys, time\nos.setsid()\nparent = os.getppid()\nstorm = []\n"
        "signal.signal(signal.SIGTERM, lambda *_: storm.append(1))\n"
        + _REPORT
        + "while not storm and os.getppid() == parent:\n    time.sleep(0.01)\n"
        "while True:\n"
        "    if os.fork() == 0:\n        time.sleep(0.3)\n        os._exit(0)\n"
        "    while True:\n"
        "        try:\n            if os.waitpid(-1, os.WNOHANG)[0] == 0: break\n"
        "        except ChildProcessError: break\n"
        "    time.sleep(0.002)\n"
    ),
    "clearenv": (
        "import os, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1], sys.argv[2]], env={},\n"
        "                 start_new_session=True, pass_fds=(int(sys.argv[1]),))\n"
        "os.close(int(sys.argv[1]))\n" + _SLEEP
    ),
    "scrub": (
        "import os, sys\nif os.fork(): os._exit(0)\nos.setsid()\n"
        "os.execve(sys.executable, [sys.executable, '-c', sys.argv[3], sys.argv[1], sys.argv[2]], {})\n"
    ),
}
_SECOND = {
    "clearenv": "import os\nif os.fork(): os._exit(0)\n",
    "scrub": "import os\nif os.fork(): os._exit(0)\n",
}

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


def _spawn_shape(mode: str, tag: str) -> None:
    """Start one of the containment shapes and wait until it stands."""
    if mode == "child":
        return
    read_fd, write_fd = os.pipe()
    second = _REPORT + _SLEEP  # what clearenv and scrub start with an empty environment
    child = subprocess.Popen(
        [sys.executable, "-c", _SHAPES[mode], str(write_fd), f"{tag}-{os.getpid()}", second],
        pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as report:
        if not report.read():
            raise RuntimeError(f"{mode}: the tree did not report")
    if mode in ("double", "scrub"):
        child.wait()  # the intermediate exited at once; no zombie left behind


def main() -> None:
    """Spawn the tree, then serve."""
    args = sys.argv[1:]
    mode = args[args.index("--mode") + 1] if "--mode" in args else None
    tag = args[args.index("--tag") + 1] if "--tag" in args else "tree"
    if mode is None:
        PIDS.update(_spawn_descendants())
        _raw.log(f"tree: pids {json.dumps(PIDS)}")
    else:
        PIDS["server"] = os.getpid()
        _spawn_shape(mode, tag)
        _raw.log(f"tree: ready {mode}")
    _raw.serve("tree", TOOLS)


if __name__ == "__main__":
    main()
