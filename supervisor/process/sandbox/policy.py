"""What one extension may touch: its config and the daemon's layout in, the grants out.

A base that lets commands run (system directories, the command's installation, a private
package cache, the scripts it is given), plus the config's ``read:`` and ``write:`` (``~`` and
globs expanded here; ``${VAR}`` was expanded when the config loaded), minus what must stay
hidden even inside a grant: the daemon's config, state, sockets, spool, sandboxes and the other
extensions' caches, the host's password and key files, and the credential stores in a home
(unless a grant names them); and never writable, even inside a write grant, what someone else
executes: the daemon's installation and Python, the directories on ``PATH``, the user's
shared package caches (an ``npx -y`` or ``uvx`` runs what it finds there) and uv's interpreters.

Reads the file system (stats, symlinks, ``#!`` lines, globs) but changes nothing: the
daemon creates missing package caches and the private temporary directory itself.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from supervisor.process.sandbox.install import installation, is_broad
from supervisor.process.sandbox.system import (
    HOME_SECRETS,
    SSH_HOST_KEYS,
    SYSTEM,
    SYSTEM_SECRETS,
    private_to_the_daemon,
    system_links,
    within,
)

__all__ = (
    "CACHE",
    "CACHE_VARIABLES",
    "MAX_GRANTS",
    "Context",
    "Grant",
    "Grants",
    "Spec",
    "explain",
    "grants_for",
    "package_caches",
    "ungranted_paths",
)

CACHE = "package cache"  # the reason of a cache grant: the daemon creates these when missing
MAX_GRANTS = 1000  # paths in one sandbox: a glob matching more is a mistake (and they pass on argv)


@dataclass(frozen=True, slots=True)
class Spec:
    """The config's ``sandbox:`` with ``sandbox_defaults:`` merged in."""

    network: str = "all"  # none | outbound | all
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    require: str | None = None  # full: no layer may be missing
    seccomp: bool = True
    tmp_max: int = 0  # bytes of TMPDIR and of /dev/shm, each a tmpfs where there is a private root
    pids_max: int | None = None  # tasks of its tree, counted in its user namespace
    cache_max: int | None = None  # bytes its private package cache may hold on disk


@dataclass(frozen=True, slots=True)
class Context:
    """The daemon's side: its environment and the paths no extension may see.

    *protected*: the daemon's config file, state, socket directory and spool root; hidden even
    inside a grant, as is *tmp*, where the runs' private temporary directories are made.
    """

    environ: Mapping[str, str]
    protected: tuple[str, ...] = ()
    cwd: str = field(default_factory=os.getcwd)  # the daemon's: children start there without `cwd:`
    tmp: str = field(default_factory=lambda: os.path.join(tempfile.gettempdir(), f"mcps-{os.getuid()}"))
    max_abi: int | None = None  # the Landlock ABI used at most (None: the kernel's)
    caches: str | None = None  # where each extension's private package cache is made (None: none)

    @property
    def home(self) -> str:
        return self.environ.get("HOME") or os.path.expanduser("~")


@dataclass(frozen=True, slots=True)
class Grant:
    path: str
    access: str  # read | write | hidden
    reason: str


@dataclass(frozen=True, slots=True)
class Grants:
    """The effective sandbox of one run (the private temporary directory aside)."""

    network: str
    entries: tuple[Grant, ...]
    environ: Mapping[str, str] = field(default_factory=dict)  # the private caches' variables, for the run

    def paths(self, access: str) -> list[str]:
        return [g.path for g in self.entries if g.access == access]

    @property
    def digest(self) -> str:
        """12 hex digits that change when anything granted or hidden changes."""
        text = "\n".join([self.network, *sorted(f"{g.access} {g.path}" for g in self.entries)])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _expand(pattern: str, home: str, base: str) -> list[str]:
    """``~`` and globs; a relative path is relative to *base*. A pattern matching nothing is
    kept as given (the launcher skips it while it does not exist)."""
    path = os.path.join(base, home + pattern[1:] if pattern == "~" or pattern.startswith("~/") else pattern)
    path = os.path.normpath(path)
    if glob.has_magic(path):
        return sorted(glob.glob(path))
    return [path]


NODE_TOOLS = frozenset({"node", "nodejs", "npx", "npm", "pnpm", "pnpx", "yarn", "bun", "bunx", "corepack"})
UV_TOOLS = frozenset({"uv", "uvx"})
PIP_TOOLS = frozenset({"pip", "pip3", "pipx"})

# Where the package managers among a command's executables keep what they download and later
# run: each confined extension gets these in a private cache of its own (the subdirectory
# named), never the user's shared one, which the user and every other extension execute from.
CACHE_VARIABLES: dict[str, tuple[frozenset[str], str]] = {
    "npm_config_cache": (NODE_TOOLS, "npm"),  # npx -y installs into its _npx
    "YARN_CACHE_FOLDER": (NODE_TOOLS, "yarn"),
    "BUN_INSTALL_CACHE_DIR": (NODE_TOOLS, "bun"),
    "UV_CACHE_DIR": (UV_TOOLS, "uv"),  # uvx's environments
    "UV_TOOL_DIR": (UV_TOOLS, "uv-tools"),
    "UV_TOOL_BIN_DIR": (UV_TOOLS, "uv-tools/bin"),
    "UV_PYTHON_INSTALL_DIR": (UV_TOOLS, "uv-python"),
    "PIP_CACHE_DIR": (PIP_TOOLS, "pip"),
    "PIPX_HOME": (PIP_TOOLS, "pipx"),
}


def _private_caches(executables: Iterable[str], directory: str, own: Mapping[str, str]) -> dict[str, str]:
    """The variables that point the package managers among *executables* into *directory*;
    none that the extension's own ``env`` sets (its cache is the one it names)."""
    names = {os.path.basename(path) for path in executables}
    return {
        variable: os.path.join(directory, sub)
        for variable, (tools, sub) in CACHE_VARIABLES.items()
        if names & tools and variable not in own
    }


def package_caches(executables: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The shared caches of the package managers among *executables* (npx, uvx, pip) in
    *environ*: the user's, which no confined extension may write."""
    home = environ.get("HOME") or os.path.expanduser("~")
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    data = environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    names = {os.path.basename(path) for path in executables}
    found: dict[str, str] = {}
    if names & NODE_TOOLS:
        found[environ.get("npm_config_cache") or os.path.join(home, ".npm")] = f"{CACHE} (npm)"
    if names & UV_TOOLS:
        found[environ.get("UV_CACHE_DIR") or os.path.join(cache, "uv")] = f"{CACHE} (uv)"
        for variable, default in (("UV_PYTHON_INSTALL_DIR", "python"), ("UV_TOOL_DIR", "tools")):
            found[environ.get(variable) or os.path.join(data, "uv", default)] = f"{CACHE} (uv's {default})"
    if names & UV_TOOLS or any(n.startswith(("python", "pip")) for n in names):
        found[environ.get("PIP_CACHE_DIR") or os.path.join(cache, "pip")] = f"{CACHE} (pip)"
    return found


def _executed_by_others(interpreters: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """What the daemon, the user or another extension executes (the daemon's *environ* says
    where): never writable by an extension, whatever its write grants cover (a rewritten
    launcher would run unconfined next time). *interpreters*: those uv may run its tools on."""
    found = {path: "the daemon's installation" for path in (sys.prefix, _SUPERVISOR_SOURCE)}
    found.setdefault(sys.base_prefix, "the daemon's Python")
    for directory in environ.get("PATH", "").split(":"):
        if os.path.isabs(directory):
            found.setdefault(os.path.normpath(directory), "a directory on PATH")
    everything = NODE_TOOLS | UV_TOOLS | PIP_TOOLS | {"python3"}
    for path, reason in package_caches(everything, environ).items():
        found.setdefault(path, f"the user's shared {reason}")
    for path, reason in interpreters.items():
        found.setdefault(path, reason)
    return found


_SUPERVISOR_SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _uv_interpreters(executables: Iterable[str], environ: Mapping[str, str], home: str) -> dict[str, str]:
    """uv runs its tools on a Python it finds: the first ``python3`` on ``PATH`` and the daemon's own."""
    if not {os.path.basename(path) for path in executables} & UV_TOOLS:
        return {}
    found: dict[str, str] = {}
    python = shutil.which("python3", path=environ.get("PATH", ""))
    if python:
        found |= installation(python, path_env=environ.get("PATH", ""), home=home)[0]
    found.setdefault(sys.base_prefix, "uv's interpreter: the daemon's Python")
    return {path: reason.replace("the command", "python3 on PATH") for path, reason in found.items()}


def _script_grants(args: Sequence[str], base: str, home: str, protected: Sequence[str]) -> dict[str, str]:
    """An argument naming an existing file (``server.py``, ``--config=x.json``): its directory
    readable (its modules beside it), or the file alone when the directory is too broad."""
    found: dict[str, str] = {}
    for arg in args:
        value = _value(arg)
        if not value or value.startswith("-"):
            continue
        path = os.path.normpath(os.path.join(base, os.path.expanduser(value) if value[0] == "~" else value))
        if not os.path.isfile(path):
            continue
        directory = os.path.dirname(path)
        covers = any(within(p, directory) for p in protected)
        if is_broad(directory, home) or covers or directory in SYSTEM:
            found[path] = f"the file argument {arg!r}"
        else:
            found[directory] = f"the directory of the file argument {arg!r}"
    return found


def _value(arg: str) -> str:
    """What an argument names: ``--config=x.json`` names ``x.json``."""
    return arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg


def _ways_through(args: Sequence[str], base: str) -> list[str]:
    """The directories a file argument walks through before a ``..`` (``tools`` of
    ``tools/../bb/server.py``): the kernel looks each up, so each must exist inside (empty)."""
    found: list[str] = []
    for arg in args:
        value = _value(arg)
        parts = value.split("/")
        if ".." not in parts or value.startswith("-") or not os.path.isfile(os.path.join(base, value)):
            continue
        for n, part in enumerate(parts):
            if part == ".." and n > 0:
                way = os.path.normpath(os.path.join(base, "/".join(parts[:n])))
                if os.path.isdir(way):
                    found.append(way)
    return found


def _outermost(grants: dict[str, str], covering: dict[str, str], hidden: Iterable[str]) -> dict[str, str]:
    """*grants* without those inside another of *covering* (unless a hidden path lies between)."""

    def between(path: str, outer: str) -> bool:
        return any(within(path, h) and within(h, outer) and h != outer for h in hidden)

    def covered(path: str) -> bool:
        return any(outer != path and within(path, outer) and not between(path, outer) for outer in covering)

    return {path: reason for path, reason in grants.items() if not covered(path)}


def _resolved(grants: dict[str, str], hidden: Mapping[str, str], links: dict[str, str]) -> dict[str, str]:
    """*grants* by their real paths: what the launcher binds, refusing a symlink on the way then (a
    swap after this check fails the start). A grant that reaches a *hidden* path only through a
    symlink (one a server planted where a glob of the grants looks, a link to ``~/.ssh``) is
    dropped; the other symlinks go to *links*, to be made again inside."""
    found: dict[str, str] = {}
    for path, reason in grants.items():
        real = os.path.realpath(path)
        if real != path:
            if any(within(real, h) and not within(path, h) for h in hidden):
                continue
            links[path] = real
        found.setdefault(real, reason)
    return found


def grants_for(
    spec: Spec,
    *,
    command: str,
    args: Sequence[str],
    cwd: str | None,
    roots: Sequence[str],
    context: Context,
    env: Mapping[str, str] | None = None,
    own_env: Mapping[str, str] | None = None,
    cache: str | None = None,
) -> Grants:
    """The effective grants of one extension whose resolved executable is *command*.

    *env* is its complete environment (default: the daemon's with *own_env* over it), *own_env*
    the part its config gives (a cache it names there is its choice, unless someone else
    executes from it); *cache* is its private package cache.
    """
    own = dict(own_env or {})
    env = {**context.environ, **own} if env is None else env
    home = env.get("HOME") or context.home
    base = cwd or context.cwd
    protected = [os.path.normpath(p) for p in context.protected]
    read: dict[str, str] = {path: "system" for path in SYSTEM if os.path.lexists(path)}
    if spec.network != "none":  # /etc/resolv.conf's target: systemd-resolved's sockets beside it
        read |= system_links()
    installed, executables = installation(command, path_env=env.get("PATH", ""), home=home)
    uv = _uv_interpreters(executables, env, home)
    links: dict[str, str] = {}
    for way in _ways_through(args, base):  # `tools/../x/server.py`: `tools` must exist to walk through
        links[way] = os.path.realpath(way)
    for extra in (installed, uv, _script_grants(args, base, home, protected)):
        read |= {p: r for p, r in extra.items() if p not in read}  # first reason wins: "system"
    if cwd and not is_broad(cwd, home):  # a home as cwd: its files are no more readable than named
        read[os.path.normpath(cwd)] = "cwd"
    read |= {os.path.normpath(root): "roots" for root in roots}
    private = _private_caches(executables, cache, own) if cache else {}
    named = [v for v in CACHE_VARIABLES if v in own and os.path.isabs(str(own[v]))]
    write: dict[str, str] = {str(own[v]): f"{CACHE} named by its env ({v})" for v in named}
    for pattern in spec.read:
        read |= {path: "sandbox.read" for path in _expand(pattern, home, base)}
    for pattern in spec.write:
        write |= {path: "sandbox.write" for path in _expand(pattern, home, base)}
    hidden = {p: "the daemon's own" for p in protected}
    hidden[os.path.normpath(context.tmp)] = "the sandboxes' temporary directories"
    hidden |= {p: "the host's secrets" for p in (*SYSTEM_SECRETS, *sorted(glob.glob(SSH_HOST_KEYS)))}
    for path in private_to_the_daemon():
        hidden.setdefault(path, "readable by the daemon's user, not by others")
    if context.caches:
        hidden[os.path.normpath(context.caches)] = "the extensions' private package caches"
    # Named plainly (no glob), a hidden path or one inside it is the user's choice to show.
    given = [pattern for pattern in (*spec.read, *spec.write) if not glob.has_magic(pattern)]
    named = [path for pattern in given for path in _expand(pattern, home, base)]
    for secret in HOME_SECRETS:
        path = os.path.join(home, secret)
        if not any(within(n, path) for n in named):
            hidden[path] = "credentials"
    hidden = {os.path.realpath(p): r for p, r in hidden.items()} | hidden
    read, write = _resolved(read, hidden, links), _resolved(write, hidden, links)
    frozen = {os.path.realpath(p): r for p, r in _executed_by_others(uv, context.environ).items()}
    for path in [p for p in write if any(within(p, f) for f in frozen)]:
        outer = next(f for f in frozen if within(path, f))
        read.setdefault(path, f"read-only: inside {frozen[outer]} ({write.pop(path)})")
    if private:  # made by the daemon in its own caches, for this extension alone: wherever they are
        reason = f"{CACHE}, private to it ({', '.join(sorted(private))})"
        write |= _resolved({os.path.normpath(cache or ""): reason}, {}, links)
    write = _outermost(write, write, hidden)
    read = _outermost(read, {**read, **write}, hidden)  # a write grant covers reading
    # ... except what others execute: bound read-only over the write grant that holds it.
    inside = {
        p: f"read-only: {r}"
        for p, r in frozen.items()
        if os.path.lexists(p) and any(within(p, w) and p != w for w in write)
    }
    read |= _outermost(inside, inside, hidden)
    granted = [*read, *write]
    hidden = {p: r for p, r in hidden.items() if os.path.lexists(p) and any(within(p, g) for g in granted)}
    entries = [Grant(p, "read", r) for p, r in read.items()]
    entries += [Grant(p, "write", r) for p, r in write.items()]
    entries += [Grant(p, "hidden", r) for p, r in hidden.items()]
    for path, real in links.items():
        made = f"a symlink to {real}, made again inside" if path != real else "on a path's way, made empty"
        entries.append(Grant(path, "link", made))
    order = {"read": 0, "write": 1, "hidden": 2, "link": 3}
    entries.sort(key=lambda g: (order[g.access], g.path))
    return Grants(spec.network, tuple(entries), private)


def ungranted_paths(args: Sequence[str], grants: Grants, *, home: str, base: str) -> list[str]:
    """The paths among *args* (``/x``, ``~/x``, ``--dir=/x``) that exist and that *grants* neither
    grant nor hide: a directory a file server is told to serve, say, which it will find missing."""
    granted = [g.path for g in grants.entries if g.access in ("read", "write")]
    hidden = [g.path for g in grants.entries if g.access == "hidden"]
    found: list[str] = []
    for arg in args:
        value = _value(arg)
        if not value.startswith(("/", "~")):
            continue
        mine = value == "~" or value.startswith("~/")  # the extension's home; ~user is theirs
        path = os.path.realpath(os.path.join(base, home + value[1:] if mine else os.path.expanduser(value)))
        shown = any(within(path, g) for g in granted) and not any(within(path, h) for h in hidden)
        if os.path.exists(path) and not shown and path not in found:
            found.append(path)
    return found


def explain(name: str, grants: Grants) -> list[str]:
    """``check-config --explain``: the effective grants, one per line, with why."""
    lines = [f"{name}: sandbox, network {grants.network}, grants digest {grants.digest}"]
    private = Grant("<a private temporary directory>", "write", "TMPDIR, removed after each run")
    shown = [g for g in grants.entries if g.access != "hidden"] + [private]
    shown += [g for g in grants.entries if g.access == "hidden"]
    width = max(len(g.path) for g in shown)
    for grant in shown:
        lines.append(f"  {grant.access:<6}  {grant.path:<{width}}  {grant.reason}")
    lines.append("  everything else: not there for it (ENOENT), read-only (EROFS) or refused (EACCES)")
    return lines
