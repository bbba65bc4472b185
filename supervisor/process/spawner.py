"""fork+exec without Python in the child and without blocking the event loop.

``subprocess.Popen`` without ``preexec_fn`` forks in C (``vfork`` on Linux) and runs no
Python code before exec. What the child must do before the extension runs is done by a
small exec shim instead, all in the child's own process:

``setpriv --pdeathsig KILL`` (util-linux)
    the child dies with the daemon;
``/bin/sh -c '[ "$PPID" = <daemon> ] || exit 125; echo 0 > <cgroup>/cgroup.procs; exec ...'``
    exits if the daemon died before the death signal was armed, and moves itself into the
    extension's cgroup before exec, so nothing of the extension runs outside it.

Without ``setpriv`` there is no death signal (the guardian still covers a dead daemon).
The command is resolved here first, with the child's ``PATH`` and ``cwd``, so that "command
not found" stays an immediate, permanent error and is not a shim's exit code.

Forking happens on one long-lived thread, never on the event loop (``Popen`` waits for
exec) nor on a pooled worker thread: Linux sends the parent-death signal when the *thread*
that forked the child exits, so that thread lives as long as the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from supervisor.errors import SpawnError
from supervisor.process import reaper

__all__ = ("popen", "resolve", "shim_argv", "submit")

_SHIM = (
    '[ "$PPID" = "$1" ] || exit 125; '  # the daemon died before the death signal was armed
    '[ -z "$2" ] || echo 0 >"$2" || exit 125; '  # into the cgroup, before any of the extension runs
    'shift 2; exec "$@"'
)


def _setpriv() -> str | None:
    return shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")


_SETPRIV = _setpriv()


def resolve(command: str, *, env: dict[str, str], cwd: str | None) -> str:
    """The executable *command* names, looked up as ``execvpe`` would with the child's ``PATH``.

    Error handling: raises a permanent :class:`SpawnError` naming the missing working
    directory, the missing command, or the command that is not executable.
    """
    if cwd is not None and not os.path.isdir(cwd):
        problem = "is not a directory" if os.path.exists(cwd) else "not found"
        raise SpawnError(f"working directory {cwd!r} {problem}", permanent=True)
    base = cwd or os.getcwd()
    if "/" in command:
        candidates = [os.path.join(base, command)]
    else:
        candidates = [os.path.join(base, directory, command) for directory in os.get_exec_path(env)]
    not_executable = None
    for candidate in candidates:
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            not_executable = not_executable or candidate
    if not_executable:
        raise SpawnError(f"command {command!r} is not executable: permission denied", permanent=True)
    raise SpawnError(f"command {command!r} not found", permanent=True)


def shim_argv(argv: Sequence[str], *, cgroup: Path | None, setpriv: str | None = _SETPRIV) -> list[str]:
    """*argv* (resolved) wrapped in the exec shim: death signal, parent check, cgroup join."""
    if setpriv is None and cgroup is None:
        return list(argv)
    procs = str(cgroup / "cgroup.procs") if cgroup else ""
    shell = ["/bin/sh", "-c", _SHIM, "mcp-supervisor-shim", str(os.getpid()), procs, *argv]
    return [setpriv, "--pdeathsig", "KILL", "--", *shell] if setpriv else shell


def _pipe_popen(argv: list[str], env: dict[str, str], cwd: str | None) -> subprocess.Popen[bytes]:
    with reaper.lock:  # a reaping between fork and track() must not see a stranger
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
        reaper.track(popen.pid)
    return popen


async def popen(
    argv: Sequence[str], *, env: dict[str, str], cwd: str | None, cgroup: Path | None
) -> subprocess.Popen[bytes]:
    """Start *argv* (``argv[0]`` resolved) through the shim, on the spawning thread.

    The caller must shield this call: a child whose Popen is lost cannot be watched.
    Error handling: raises :class:`SpawnError` (``permanent`` when retrying cannot help).
    """
    full = shim_argv(argv, cgroup=cgroup)
    try:
        return await asyncio.wrap_future(submit(lambda: _pipe_popen(full, env, cwd)))
    except PermissionError as exc:
        raise SpawnError(f"command {argv[0]!r} is not executable: {exc.strerror}", permanent=True) from exc
    except FileNotFoundError as exc:
        raise SpawnError(f"command {argv[0]!r} not found", permanent=True) from exc
    except OSError as exc:
        raise SpawnError(f"cannot start {argv[0]!r}: {exc.strerror or exc}", permanent=False) from exc


class _Thread:
    """The one thread that forks. Started on first use; lives as long as the process."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._started = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        with self._started:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mcp-supervisor-spawn", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((job, future))
        return future

    def _run(self) -> None:
        while True:
            job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)


_thread = _Thread()


def submit(job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """Run *job* on the spawning thread (anything that forks a child meant to die with us)."""
    return _thread.submit(job)
