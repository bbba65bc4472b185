"""``quick.py`` that first appends its pid to ``$COUNTED_PID_FILE``: a test counts the spawns."""

from __future__ import annotations

import os

import quick

if __name__ == "__main__":
    with open(os.environ["COUNTED_PID_FILE"], "a") as file:
        file.write(f"{os.getpid()}\n")
    quick.main()
