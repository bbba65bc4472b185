"""Where a command is installed: what it must be able to read to run at all.

Given the resolved executable, follow its symlinks, its ``#!`` interpreter (through ``env``
and ``PATH``), a Python virtual environment's base interpreter and the source directories its
``.pth`` files name (editable installs). Each executable found grants its installation prefix:
the directory above ``bin/`` (``~/.nvm/versions/node/v22``, a venv, ``~/.pyenv/versions/3.12``),
or its own directory when that prefix would be too broad (``/``, a home, ``~/.local``); inside
a ``node_modules`` tree, the outermost ``node_modules`` (a package needs its dependencies).
Reads a few small files; creates nothing.
"""

from __future__ import annotations

import glob
import os

__all__ = ("installation", "is_broad")

_MAX_DEPTH = 4  # interpreter of an interpreter of ...: a loop or a silly chain stops here
_MAX_PTH_LINES = 64
_SHEBANG_BYTES = 256


def is_broad(path: str, home: str) -> bool:
    """Too much to grant as somebody's installation: ``/``, a home or its parents, ``~/.local``."""
    path = os.path.normpath(path)
    homes = {os.path.normpath(home), "/root", "/home"} if home else {"/root", "/home"}
    if path == "/" or path in homes or path == os.path.join(home, ".local"):
        return True
    return any(h.startswith(path.rstrip("/") + "/") for h in homes) or os.path.dirname(path) == "/home"


def _chain(path: str) -> list[str]:
    """*path*, every symlink hop, and the real path at the end."""
    hops, seen = [path], {path}
    current = path
    for _ in range(40):
        if not os.path.islink(current):
            break
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
        if current in seen:
            break
        seen.add(current)
        hops.append(current)
    real = os.path.realpath(path)
    return hops if real in seen else [*hops, real]


def _prefix(executable: str, home: str) -> str:
    parts = executable.split("/")
    if "node_modules" in parts[:-1]:  # a package's entry point needs its dependencies beside it
        return "/".join(parts[: parts.index("node_modules") + 1])
    directory = os.path.dirname(executable)
    if os.path.basename(directory) in ("bin", "sbin"):
        prefix = os.path.dirname(directory)
        if not is_broad(prefix, home):
            return prefix
    return directory


def _interpreter(path: str, path_env: str) -> str | None:
    """The absolute interpreter a ``#!`` line names (``env NAME`` looked up on *path_env*)."""
    try:
        with open(path, "rb") as file:
            head = file.read(_SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if not names:
            return None
        for directory in path_env.split(os.pathsep):
            candidate = os.path.join(directory or ".", names[0])
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return os.path.abspath(candidate)
        return None
    return words[0]


def _venv(root: str) -> tuple[list[str], str | None]:
    """A venv's editable source directories and its base interpreter's directory."""
    home = None
    try:
        with open(os.path.join(root, "pyvenv.cfg")) as file:
            for line in file:
                key, _, value = line.partition("=")
                if key.strip() == "home":
                    home = value.strip()
    except OSError:
        return [], None
    sources = []
    for pth in sorted(glob.glob(os.path.join(glob.escape(root), "lib", "python*", "site-packages", "*.pth"))):
        try:
            with open(pth) as file:
                lines = file.read().splitlines()[:_MAX_PTH_LINES]
        except OSError:
            continue
        sources += [line for line in lines if os.path.isabs(line) and os.path.isdir(line)]
    return sources, home


def installation(command: str, *, path_env: str, home: str) -> tuple[dict[str, str], list[str]]:
    """Directories to read for *command* (absolute) to run, each with why (``{path: reason}``),
    and the executables involved (the command, its interpreters), in the order found."""
    found: dict[str, str] = {}
    executables: list[str] = []

    def visit(executable: str, why: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        for hop in _chain(executable):
            executables.append(hop)
            found.setdefault(_prefix(hop, home), why)
            root = os.path.dirname(os.path.dirname(hop))
            if os.path.isfile(os.path.join(root, "pyvenv.cfg")):
                found.setdefault(root, f"{why}: its virtual environment")
                sources, base = _venv(root)
                for source in sources:
                    found.setdefault(source, f"{why}: an editable install in its environment")
                if base:
                    visit(os.path.join(base, "python3"), f"{why}: its environment's interpreter", depth + 1)
        interpreter = _interpreter(os.path.realpath(executable), path_env)
        if interpreter:
            visit(interpreter, f"the interpreter of {os.path.basename(executable)}", depth + 1)

    visit(command, "the command", 0)
    return found, executables
