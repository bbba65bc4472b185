"""Run a command with CPU load beside it: the suite's deadlines must hold on a busy machine.

    python bench/cpuload.py [--workers N] -- COMMAND...

Starts N busy processes (default: one per core), runs COMMAND, stops them, and exits with
COMMAND's code. ``make test-loaded`` runs ``make test`` this way. Each worker spins on
arithmetic, as a compiler or a second test suite would, and ends with this process (a parent
death signal), so nothing is left spinning when the command is interrupted.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _spin() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    n = 0
    while True:
        n = (n * 1103515245 + 12345) & 0xFFFFFFFF


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")
    workers = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.workers)]
    for worker in workers:
        worker.start()
    print(f"cpuload: {args.workers} busy processes beside: {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        return subprocess.call(command)
    finally:
        for worker in workers:
            worker.kill()
            worker.join()


if __name__ == "__main__":
    sys.exit(main())
