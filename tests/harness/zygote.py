"""Daemons forked from a process that has already imported the daemon, instead of each importing it.

Importing ``mcp-supervisor daemon`` (the MCP SDK, pydantic, the config models) costs about a
second of CPU, and the suite starts some 500 daemons: a third of its CPU went to imports. Each
pytest worker starts one zygote (``python tests/harness/zygote.py FD``) that imports what a
daemon imports and then, asked over a socket, forks. The child becomes what ``python -m
supervisor daemon ...`` would be: its own pid, environment, working directory, fd limit, stdin
from /dev/null and stdout and stderr appended to the log, no other fd, then ``cli.main``. The
zygote reaps it and keeps its exit code for :class:`Forked`, which stands in for the
``subprocess.Popen`` of the harness (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``).

The same zygote forks what the tests themselves run of the package and the SDK: the CLI
(:func:`run`: ``mcp-supervisor status`` costs 0.25 s of CPU as a process of its own, most of it
imports) and the SDK fixture servers a test starts beside the daemon (:func:`popen`:
``remote.py``, ``oauth.py``, ``socket_server.py``: 1.4-1.7 s each). Their stdin, stdout and
stderr travel to the zygote as file descriptors. Not what reads its own ``/proc/PID/environ`` (a
marker), or must import little (``connect``): those stay processes of their own.

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
import runpy
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
from typing import IO, Any

__all__ = ("CLI", "Forked", "enabled", "popen", "run", "spawn")

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
    # What the SDK fixture servers a test starts import (tests/servers/remote.py, oauth.py,
    # socket_server.py).
    "uvicorn",
    "starlette.applications",
    "mcp.server.sse",
    "mcp.server.auth.provider",
    "mcp.server.auth.settings",
    "mcp.server.auth.middleware.auth_context",
    "mcp.server.mcpserver",
    "mcp.shared.auth",
)
CLI = [sys.executable, "-m", "supervisor"]
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

    def ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        """Send *message* (with *fds*, beside its first byte), return its answer. Requests are
        numbered: an answer left unread by an interrupted ask (a test's timeout) is skipped,
        never taken for the next one's."""
        with self.lock:
            number = next(self.numbers)
            data = json.dumps({**message, "n": number}).encode() + b"\n"
            sent = socket.send_fds(self.channel, [data], fds) if fds else 0
            self.channel.sendall(data[sent:])
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

    stdin: IO[Any] | None = None
    stdout: IO[Any] | None = None
    stderr: IO[Any] | None = None

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

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Its whole stdout and stderr (those that are pipes) once it has ended; killed after *timeout*."""
        outputs: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=name, f=stream: outputs.__setitem__(n, f.read()), daemon=True)
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.start()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        finally:
            for reader in readers:
                reader.join(None if self.returncode is not None else 5)
        return outputs.get("stdout"), outputs.get("stderr")

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()


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
    return Forked(zygote, zygote.ask({"spawn": request})["pid"], [*CLI, *args])


def popen(
    argv: list[str],
    *,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    env: dict[str, str] | None = None,
    text: bool = False,
) -> Forked | subprocess.Popen[Any]:
    """``subprocess.Popen(argv, ...)`` for ``[*CLI, ...]`` or ``[sys.executable, SCRIPT.py, ...]``,
    forked from the zygote; each stream None (the worker's own), ``PIPE`` or ``DEVNULL``."""
    if argv[:3] == CLI:
        target: dict[str, Any] = {"args": argv[3:]}
    elif len(argv) > 1 and argv[0] == sys.executable and argv[1].endswith(".py"):
        target = {"script": argv[1], "args": argv[2:]}
    else:
        target = {}
    if not target or not enabled():
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, text=text)
    theirs: list[int] = []
    ours: list[IO[Any] | None] = []
    for number, (choice, reading) in enumerate(((stdin, False), (stdout, True), (stderr, True))):
        if choice == subprocess.PIPE:
            read, write = os.pipe()
            mine, child = (read, write) if reading else (write, read)
            theirs.append(child)
            ours.append(os.fdopen(mine, ("r" if reading else "w") + ("" if text else "b")))
        elif choice == subprocess.DEVNULL:
            theirs.append(os.open(os.devnull, os.O_RDWR))
            ours.append(None)
        else:
            assert choice is None, choice
            theirs.append(os.dup(number))
            ours.append(None)
    zygote = _the_zygote()
    request = {**target, "env": dict(os.environ if env is None else env), "cwd": os.getcwd(), "stdio": True}
    try:
        pid = zygote.ask({"spawn": request}, theirs)["pid"]
    except BaseException:
        for stream in ours:
            if stream is not None:
                stream.close()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    forked = Forked(zygote, pid, argv)
    forked.stdin, forked.stdout, forked.stderr = ours
    return forked


def run(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, ...)``, forked as :func:`popen` is."""
    pipe = subprocess.PIPE
    with popen(argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, env=env, text=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        code = process.wait()
    return subprocess.CompletedProcess(argv, code, out, err)


# ---- the zygote's side ------------------------------------------------------------------------------


def _become(request: dict[str, Any], stdio: list[int]) -> None:
    """In the forked child: the process ``python -m supervisor ARGS`` (or ``python SCRIPT ARGS``)
    would be, its stdin, stdout and stderr *stdio*, or /dev/null and the log. Never returns."""
    code: object = 1
    try:
        if not stdio:
            stdin = os.open(os.devnull, os.O_RDONLY)
            log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            stdio = [stdin, log, log]
        for number, fd in enumerate(stdio):
            os.dup2(fd, number)
        os.closerange(3, 1 << 20)  # the zygote's socket among them, as close_fds does
        if request.get("nofile") is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["nofile"]))
        if request.get("no_user_namespaces"):  # what `seccomp.py --only-user-namespaces --` would do
            from supervisor.process.sandbox import seccomp

            seccomp.install(only_user_namespaces=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # read TMPDIR afresh, as a new interpreter would
        if "script" in request:
            sys.argv = [request["script"], *request["args"]]
            sys.path[0] = str(Path(request["script"]).parent)  # as ``python SCRIPT`` has it
            code = 0
            runpy.run_path(request["script"], run_name="__main__")
        else:
            sys.argv = [str(ROOT / "supervisor" / "__main__.py"), *request["args"]]
            from supervisor.cli.main import main

            code = main(request["args"])
    except SystemExit as exc:  # what the interpreter makes of sys.exit(code)
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
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

    received: list[int] = []  # file descriptors come beside the first byte of their request

    def answer(message: dict[str, Any]) -> dict[str, Any]:
        if "spawn" in message:
            stdio = [received.pop(0) for _ in range(3)] if message["spawn"].get("stdio") else []
            try:
                pid = os.fork()
                if pid == 0:
                    _become(message["spawn"], stdio)
            finally:
                for fd in stdio:
                    os.close(fd)
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
        data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 3)
        received.extend(fds)
        if not data:
            return  # the worker is gone; its daemons are its fixtures' to end
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            channel.sendall(json.dumps(answered(json.loads(line))).encode() + b"\n")


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # as ``python -m supervisor`` run there has it, not this folder
    serve(socket.socket(fileno=int(sys.argv[1])))
