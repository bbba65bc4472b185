"""Daemons forked from a process that has already imported the daemon, instead of each importing it.

Importing ``mcp-supervisor daemon`` (the MCP SDK, pydantic, the config models) costs about a
second of CPU, and the suite starts some 500 daemons: a third of its CPU went to imports. Each
pytest worker starts one zygote (``python tests/harness/zygote.py FD``) that imports what a
daemon imports and then, asked over a socket, forks. The child becomes what ``python -m
supervisor daemon ...`` would be: its own pid, environment, working directory, fd limit, stdin
from /dev/null and stdout and stderr appended to the log, no other fd, then ``cli.main``. The
zygote reaps it and keeps its exit code for :class:`Forked`, which stands in for the
``subprocess.Popen`` of the harness (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``).

What a fork keeps from the zygote is what a fresh interpreter would have: the zygote creates no
event loop, thread or logger before it forks. One difference, on purpose: the imported objects
sit in the collector's permanent generation (``gc.freeze``), so a daemon's first full collection
neither walks them nor copies every page they live on (0.27 s of CPU down to 0.12 to reach
"running" with one extension). ``MCP_TEST_FORK=0`` starts every daemon as a
process of its own again.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ("Forked", "enabled", "spawn")

ROOT = Path(__file__).resolve().parents[2]
# What a daemon imports: its entry point, and what it imports after its head start (the root,
# the gateway and its listeners, the MCP SDK): 1.7 s of CPU in each daemon when left out.
PRELOAD = (
    "supervisor.cli.main",
    "supervisor.cli.local",
    "supervisor.daemon.run",
    "supervisor.daemon.root",
    "supervisor.daemon.facade",
    "supervisor.daemon.reload",
    "supervisor.daemon.callers",
    "supervisor.gateway.http",
    "supervisor.gateway.unix",
    "uvloop",
    "anyio._backends._asyncio",  # imported by anyio.run, not at anyio's import: 0.15 s each
)
MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    return os.environ.get("MCP_TEST_FORK", "1") != "0"


# ---- the pytest worker's side ---------------------------------------------------------------------


class _Zygote:
    """The worker's zygote and the socket to it; one request and its answer at a time."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
        )
        theirs.close()
        self.channel = ours
        self.reader = ours.makefile("rb")
        self.lock = threading.Lock()
        self.numbers = itertools.count()

    def close(self) -> None:
        """End it with the worker: a closed socket is its signal to exit."""
        self.reader.close()
        self.channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send *message*, return its answer. Requests are numbered: an answer left unread by an
        interrupted ask (a test's timeout) is skipped, never taken for the next one's."""
        with self.lock:
            number = next(self.numbers)
            self.channel.sendall(json.dumps({**message, "n": number}).encode() + b"\n")
            while True:
                line = self.reader.readline(MAX_MESSAGE)
                if not line:
                    raise RuntimeError(f"the test zygote ended (exit {self.proc.poll()})")
                answer: dict[str, Any] = json.loads(line)
                if answer.get("n") == number:
                    break
        if "error" in answer:
            raise RuntimeError(f"the test zygote: {answer['error']}")
        return answer


_zygote: _Zygote | None = None
_started = threading.Lock()


def _the_zygote() -> _Zygote:
    global _zygote
    with _started:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
            atexit.register(_zygote.close)
        return _zygote


class Forked:
    """A forked daemon, as much of ``subprocess.Popen`` as the harness and the tests use.

    Signals go through a pidfd, so they reach this daemon or nothing, even once the zygote has
    reaped it; its exit code is asked of the zygote only once the pidfd says it has ended.
    """

    def __init__(self, zygote: _Zygote, pid: int, args: list[str]) -> None:
        self._zygote, self.pid, self.args = zygote, pid, args
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # it ended at once, and the zygote has reaped it already
            self._pidfd = None
        self._lock = threading.Lock()
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None and self._ended():
                code = self._zygote.ask({"poll": self.pid})["code"]
                if code is not None:  # the zygote reaps on every poll: it has it now
                    self.returncode = code
                    if self._pidfd is not None:
                        os.close(self._pidfd)
            return self.returncode

    def _ended(self) -> bool:
        return self._pidfd is None or bool(select.select([self._pidfd], [], [], 0)[0])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.005)
        return code

    def send_signal(self, signum: int) -> None:
        with self._lock:
            if self.returncode is None and self._pidfd is not None:
                with contextlib.suppress(ProcessLookupError):  # it has ended, not yet polled
                    signal.pidfd_send_signal(self._pidfd, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    args: list[str],
    *,
    env: dict[str, str],
    log: Path,
    nofile: tuple[int, int] | None = None,
    no_user_namespaces: bool = False,
) -> Forked:
    """``mcp-supervisor`` with *args* (``daemon -c ...``), forked from the worker's zygote;
    *no_user_namespaces*: under the seccomp filter that refuses them (a host that does)."""
    zygote = _the_zygote()
    log.touch()  # the harness reads it at once
    request = {"args": args, "env": env, "log": str(log), "nofile": nofile, "cwd": os.getcwd()}
    request["no_user_namespaces"] = no_user_namespaces
    return Forked(zygote, zygote.ask({"spawn": request})["pid"], [sys.executable, "-m", "supervisor", *args])


# ---- the zygote's side ------------------------------------------------------------------------------


def _become(request: dict[str, Any]) -> None:
    """In the forked child: the daemon process ``python -m supervisor ARGS`` would be. Never returns."""
    code = 1
    try:
        stdin = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(stdin, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 20)  # the zygote's socket among them, as close_fds does
        if request["nofile"] is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["nofile"]))
        if request["no_user_namespaces"]:  # what `seccomp.py --only-user-namespaces --` would do
            from supervisor.process.sandbox import seccomp

            seccomp.install(only_user_namespaces=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # read TMPDIR afresh, as a new interpreter would
        sys.argv = [str(ROOT / "supervisor" / "__main__.py"), *request["args"]]
        from supervisor.cli.main import main

        code = main(request["args"])
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code if isinstance(code, int) else 1)


def serve(channel: socket.socket) -> None:
    """Answer the worker's requests until it closes the socket: spawn a daemon, or poll one."""
    for module in PRELOAD:
        importlib.import_module(module)  # what a daemon imports, once for every fork
    gc.freeze()

    exited: dict[int, int] = {}

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            exited[pid] = os.waitstatus_to_exitcode(status)

    def answer(message: dict[str, Any]) -> dict[str, Any]:
        if "spawn" in message:
            pid = os.fork()
            if pid == 0:
                _become(message["spawn"])
            return {"pid": pid}
        reap()
        return {"code": exited.pop(message["poll"], None)}

    def answered(message: dict[str, Any]) -> dict[str, Any]:
        """The answer to *message*, numbered as it is; a failure (a fork refused) is an answer too."""
        try:
            return {**answer(message), "n": message.get("n")}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}", "n": message.get("n")}

    pending = b""
    while True:
        ready, _, _ = select.select([channel], [], [], 0.1)
        reap()
        if not ready:
            continue
        data = channel.recv(MAX_MESSAGE)
        if not data:
            return  # the worker is gone; its daemons are its fixtures' to end
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            channel.sendall(json.dumps(answered(json.loads(line))).encode() + b"\n")


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # as ``python -m supervisor`` run there has it, not this folder
    serve(socket.socket(fileno=int(sys.argv[1])))
