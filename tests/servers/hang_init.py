"""Server that reads stdin but never answers anything, not even ``initialize``.

For start_timeout tests: the supervisor must give up on the handshake and kill it. Exits 0
on stdin EOF. No tools, no env knobs.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Swallow stdin until EOF."""
    sys.stderr.write("hang_init: reading, never answering\n")
    sys.stderr.flush()
    for _line in sys.stdin.buffer:
        pass


if __name__ == "__main__":
    main()
