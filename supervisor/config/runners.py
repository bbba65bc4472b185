"""Package runners: commands that fetch a server's package the first time they run it.

``npx -y PKG``, ``uvx PKG`` and their kind download (and unpack, often compile) the server on
a cold cache before it can answer ``initialize``, which can take minutes; later starts are
quick. ``import`` gives such entries ``first_start_timeout`` (see :func:`downloads_first`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ("FIRST_START_TIMEOUT", "downloads_first")

FIRST_START_TIMEOUT = 300  # seconds: a cold download of a big package on a slow link

_ALONE = {"npx": "npx", "pnpx": "pnpx", "bunx": "bunx", "uvx": "uvx"}  # the command is the runner
_WITH_VERB = {  # the command and its first argument
    ("pipx", "run"): "pipx run",
    ("pnpm", "dlx"): "pnpm dlx",
    ("yarn", "dlx"): "yarn dlx",
    ("bun", "x"): "bun x",
    ("docker", "run"): "docker run",  # pulls the image when it is not there
    ("podman", "run"): "podman run",
}


def downloads_first(command: str, args: Sequence[str]) -> str | None:
    """The runner that *command* with *args* is (``npx``, ``uvx``, ``pipx run``, ...), else None.

    Also ``uv tool run`` and ``deno run`` of an ``npm:`` or ``jsr:`` specifier. Pure: the
    command's name decides (a full path counts by its last part), nothing is run or looked up.
    """
    name = os.path.basename(command)
    first = str(args[0]) if args else ""
    if name in _ALONE:
        return _ALONE[name]
    if (name, first) in _WITH_VERB:
        return _WITH_VERB[name, first]
    if name == "uv" and [str(a) for a in args[:2]] == ["tool", "run"]:
        return "uv tool run"
    if name == "deno" and first == "run" and any(str(a).startswith(("npm:", "jsr:")) for a in args):
        return "deno run"
    return None
