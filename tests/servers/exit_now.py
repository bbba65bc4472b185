"""Server that exits before reading anything: ``exit_now.py [CODE]`` (default 1).

For spawn-failure and crash-loop tests: writes one stderr line, "exit_now: bye", then exits.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Say bye on stderr and return the exit code from argv."""
    sys.stderr.write("exit_now: bye\n")
    sys.stderr.flush()
    return int(sys.argv[1]) if len(sys.argv) > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
