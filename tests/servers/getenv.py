"""Fixture: a server that tells its environment.

Tool: ``getenv(name)``: the variable's value, or "(unset)".
"""

from __future__ import annotations

import os

import _raw


def getenv(args: _raw.Args) -> _raw.Content:
    """The value of the environment variable *name*."""
    return [_raw.text(os.environ.get(str(args["name"]), "(unset)"))]


if __name__ == "__main__":
    _raw.serve(
        "getenv",
        {
            "getenv": _raw.Tool(
                getenv, "An environment variable's value.", {"name": {"type": "string"}}, ("name",)
            )
        },
    )
