"""Many realistic tools (from ``toolbank``): ``many.py [GROUP ...] [--count N] [--copy SUFFIX]``.

Serves the bank's tools of the given groups (``dev``, ``cloud``, ``office``, ``data``; default all),
the first N of them, each answering ``called NAME {arguments}``. ``--copy SUFFIX`` renames every
tool ``NAME_SUFFIX`` (a second server of the same kind, for larger catalogs). Stdlib only: fast.
"""

from __future__ import annotations

import json
import sys

import _raw
import toolbank


def _answer(name: str) -> _raw.ToolFn:
    def call(args: _raw.Args) -> _raw.Content:
        return [_raw.text(f"called {name} {json.dumps(args, sort_keys=True)}")]

    return call


def main(argv: list[str]) -> None:
    count, suffix, groups = None, "", []
    while argv:
        arg = argv.pop(0)
        if arg == "--count":
            count = int(argv.pop(0))
        elif arg == "--copy":
            suffix = "_" + argv.pop(0)
        else:
            groups.append(arg)
    tools = {}
    for entry in toolbank.tools(count, tuple(groups) or None):
        name = entry["name"] + suffix
        properties = entry["inputSchema"]["properties"]
        tools[name] = _raw.Tool(_answer(name), entry["description"], properties)
    _raw.serve("many", tools)


if __name__ == "__main__":
    main(sys.argv[1:])
