"""One harness for a real daemon: an `mcp-supervisor daemon` subprocess on a config of its own.

Tests wait on the daemon through its control socket, in this process (a JSON-RPC line each way),
never by spawning the CLI: :meth:`Daemon.status`, :meth:`Daemon.wait_state` and :func:`until`
cost a connection each, not an interpreter. Tests of the CLI itself use :meth:`Daemon.cli`.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import psutil

from supervisor.control.client import DaemonUnreachable, RemoteError
from supervisor.daemon.identity import instance_key
from supervisor.errors import SupervisorError
from supervisor.process.sandbox import seccomp

from . import zygote
from .timing import patience

__all__ = ("CLI", "Daemon", "accepts", "alive", "rpc", "until")

CLI = zygote.CLI
# A host that refuses user namespaces (AppArmor's restriction on Ubuntu 24.04, a container's
# profile): the daemon under a seccomp filter that refuses them; the zygote applies it itself.
NO_USER_NAMESPACES = [sys.executable, "-I", "-S", seccomp.__file__, "--only-user-namespaces", "--"]
TOKEN = "test-token-0123456789abcdef"  # the HTTP listener's, unless a test gives its own (or None)
START_WITHIN = 45.0  # seconds a daemon may take to listen, on a loaded machine (imports take seconds)
_IDS = itertools.count(1)
ANNOUNCE_WINDOW = timedelta(seconds=0.5)  # the gateway's 0.1 s coalescing, and a loaded machine


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def memory(pid: int, field: str = "VmRSS") -> int:
    """A figure of the process's memory from /proc (``VmRSS`` now, ``VmHWM`` its peak), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


_FIRST_PAUSE = 0.005


def until(predicate: Callable[[], bool], within: float = 30.0, interval: float = 0.05) -> None:
    """Poll with a deadline (*within*, scaled by :data:`~.timing.SLOWDOWN`); for conditions in
    another process that send us no event. The default bounds a hang, generously: with a second
    suite beside this one a SIGHUP's reload once took more than 10 s to be logged.

    The first checks come 5 ms apart, then half as often again each time up to *interval*: most
    conditions hold within milliseconds, and a long wait (a daemon's start) polls a few times a
    second, not fifty. Polls were 19,000 in a run of the suite, each a status request the
    daemon answers (about 1 ms of CPU on both sides) or a read of its log."""
    deadline = time.monotonic() + patience(within)
    pause = min(_FIRST_PAUSE, interval)
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(pause)
        pause = min(pause * 1.5, interval)


def accepts(path: str) -> bool:
    """Whether a listener accepts on the unix socket *path* (the file exists a moment before)."""
    with socket.socket(socket.AF_UNIX) as probe:
        return probe.connect_ex(path) == 0


def rpc(path: str, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    """One control request on a connection of its own, synchronously; its ``result``.

    Raises what :func:`supervisor.control.client.request` raises: DaemonUnreachable, RemoteError,
    or SupervisorError. Notifications before the reply are skipped.
    """
    request_id = next(_IDS)
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(patience(timeout))
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            raise DaemonUnreachable(path) from None
        sock.sendall(json.dumps(message).encode() + b"\n")
        with sock.makefile("rb") as lines:
            for line in lines:
                reply = json.loads(line)
                if reply.get("id") != request_id:
                    continue  # a notification (progress) before the reply
                if "error" in reply:
                    error = reply["error"]
                    raise RemoteError(error["code"], error["message"], error.get("data"))
                return reply["result"]
    raise SupervisorError(f"the daemon closed the connection without replying to {method!r}")


class Daemon:
    """A daemon subprocess on a config of its own, and the control socket and the CLI pointed at it.

    Options, each what some tests need:
      settings: top-level config beside ``socket`` and ``extensions`` (spool, gateway, profiles...).
      http: the HTTP listener on 127.0.0.1 at a free port, with these extra settings; ``start``
        waits until it listens, then ``url`` is its base (``.../mcp`` is the endpoint).
      env: more environment for the daemon.
      state: a ``STATE_DIRECTORY`` of its own, ``self.state`` (pins, saved catalogs).
      home: a ``HOME`` of its own (``directory/home``), without the session's ``XDG_*``,
        ``MCP_SUPERVISOR_*`` and ``STATE_DIRECTORY`` (so ``self.state`` is in it), the venv first
        on ``PATH``.
      nofile: the daemon's RLIMIT_NOFILE (soft, hard).
      prefix: argv run before the daemon's own (``unshare ...``, a cgroup move).
      config: a config file used as it is, served on this harness's socket.
    """

    def __init__(
        self,
        directory: Path,
        extensions: dict[str, Any] | None = None,
        *,
        settings: dict[str, Any] | None = None,
        http: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        state: bool = False,
        home: bool = False,
        nofile: tuple[int, int] | None = None,
        prefix: list[str] | None = None,
        config: Path | None = None,
    ) -> None:
        self.directory = directory
        self.socket = str(directory / "control.sock")
        self.log = directory / "daemon.log"
        self._events: list[dict[str, Any]] = []  # parsed from the log's first _events_read bytes
        self._events_read = 0
        self._events_lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | zygote.Forked | None = None
        self.http = http
        self.settings = dict(settings or {})
        self.url = ""  # the HTTP listener's base URL, once started with http
        self.nofile, self.prefix = nofile, prefix or []
        self.extra_env = dict(env or {})
        self.state = directory / "state"
        if state:
            self.extra_env["STATE_DIRECTORY"] = str(self.state)
        self.home = directory / "home"
        self.own_home = home
        if home:  # where a daemon keeps its state by default, then
            self.home.mkdir(parents=True, exist_ok=True)
            self.state = self.home / ".local" / "state" / "mcp-supervisor"
        if config is not None:
            self.config = config
            self.extra_env["MCP_SUPERVISOR_SOCKET"] = self.socket
        else:
            self.config = directory / "config.json"
            self.write(extensions or {})

    # ---- config and process -----------------------------------------------------------------

    def write(self, extensions: dict[str, Any], **settings: Any) -> None:
        """Write the config: our socket, the settings given at construction updated with *settings*,
        the HTTP listener if asked, and *extensions*."""
        config: dict[str, Any] = {"socket": self.socket, **self.settings, **settings}
        if self.http is not None:
            listener = {"enabled": True, "host": "127.0.0.1", "port": 0, "token": TOKEN, **self.http}
            config["gateway"] = {**config.get("gateway", {}), "http": listener}
        self.config.write_text(json.dumps({**config, "extensions": extensions}))

    @property
    def env(self) -> dict[str, str]:
        if not self.own_home:
            return {**os.environ, **self.extra_env}
        kept = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("XDG_", "MCP_SUPERVISOR_")) and k != "STATE_DIRECTORY"
        }
        path = f"{Path(sys.executable).parent}:{kept.get('PATH', '')}"  # `make run` puts the venv first
        return {**kept, "HOME": str(self.home), "PATH": path, **self.extra_env}

    def start(self, env: dict[str, str] | None = None, within: float = START_WITHIN) -> Daemon:
        """Start the daemon (with *env* added); return once it is ready (or has exited: check ``proc``)."""
        self.extra_env.update(env or {})
        nofile = self.nofile

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        argv = [*self.prefix, *CLI, "daemon", "-c", str(self.config)]
        readies = len(self.find("daemon.ready")) if self.log.exists() else 0  # the log spans restarts
        forkable = not self.prefix or self.prefix == NO_USER_NAMESPACES  # the zygote does that one
        if forkable and zygote.enabled():  # the same process, without a second of imports
            self.proc = zygote.spawn(
                argv[len(self.prefix) + len(CLI) :],
                env=self.env,
                log=self.log,
                nofile=nofile,
                no_user_namespaces=bool(self.prefix),
            )
        else:
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    argv, stdout=log, stderr=log, env=self.env, preexec_fn=limit if nofile else None
                )
        proc = self.proc
        # Ready, as systemd would be told: autostart extensions are launched (not yet running).
        until(lambda: len(self.find("daemon.ready")) > readies or proc.poll() is not None, within)
        if self.http is not None and proc.poll() is None:
            until(lambda: bool(self.find("gateway.http_listening")) or proc.poll() is not None, within)
            if proc.poll() is None:  # the control socket comes first, then the HTTP listener
                self.url = self.find("gateway.http_listening")[0]["url"].removesuffix("/mcp")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def instance(self) -> str:
        """The marker prefix of this daemon's children."""
        return f"{instance_key(self.socket)}:"

    @property
    def mcp_sock(self) -> str:
        return str(Path(self.socket).parent / "mcp.sock")

    def terminate(self) -> int:
        """SIGTERM, then its exit code (20 s at most)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=patience(20))

    def kill(self) -> None:
        """SIGKILL if it still runs (the guardian then ends its children)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- the control socket, in this process -------------------------------------------------

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """:func:`rpc` on its socket; a daemon that is not there says why (its exit, its log's end)."""
        try:
            return rpc(self.socket, method, params, timeout)
        except DaemonUnreachable as exc:
            code = self.proc.poll() if self.proc is not None else None
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else "(no log)"
            raise DaemonUnreachable(
                self.socket, f"{exc} (exit status {code}); its log ends:\n{tail}"
            ) from None

    def status(self) -> dict[str, dict[str, Any]]:
        """Every extension's status record, by name."""
        return {record["name"]: record for record in self.request("status")["extensions"]}

    def wait_state(self, name: str, state: str, within: float = 60.0) -> dict[str, Any]:
        """*name*'s record once it is in *state* (60 s: an SDK server's start, two suites and more
        at once, took over 30 in pair 8)."""
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.status().get(name, {}))  # a reload may not have added it yet
            return found.get("state") == state

        until(reached, within)
        return found

    def wait_running(self, *names: str, within: float = 60.0) -> dict[str, dict[str, Any]]:
        """Every record once all *names* run; fails at once if one of them failed."""
        found: dict[str, dict[str, Any]] = {}

        def all_running() -> bool:
            found.update(self.status())
            failed = [found[n] for n in names if found[n]["state"] == "failed"]
            assert not failed, failed
            return all(found[n]["state"] == "running" for n in names)

        until(all_running, within)
        return found

    def wait_announced(self, within: float = 10.0) -> None:
        """Until the gateway has announced the last extension change to its clients.

        The gateway coalesces changes for 0.1 s before it sends list_changed: a client that
        connects within that window hears of a change it already sees. Done when a
        ``gateway.lists_changed`` follows the last ``extension.state``, or when the window is
        long over (a change of nothing listed is announced to nobody, and not logged).
        """

        def announced() -> bool:
            changes = [e["timestamp"] for e in self.events() if e.get("event") == "extension.state"]
            if not changes:
                return True
            last = datetime.fromisoformat(max(changes))
            told = [e["timestamp"] for e in self.find("gateway.lists_changed")]
            if told and datetime.fromisoformat(max(told)) >= last:
                return True
            return datetime.now(UTC) - last > ANNOUNCE_WINDOW

        until(announced, within)

    def call(self, name: str, tool: str, **arguments: Any) -> dict[str, Any]:
        """A tool call through the control socket; its wire result."""
        params = {"name": name, "tool": tool, "arguments": arguments}
        return self.request("call", params)  # type: ignore[no-any-return]

    # ---- the CLI, for tests of the CLI -------------------------------------------------------

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``mcp-supervisor ARGS --socket SOCKET`` run to its end (forked from the zygote)."""
        return zygote.run([*CLI, *args, "--socket", self.socket], timeout=patience(30))

    def ok(self, *args: str) -> str:
        """The CLI's stdout, which must have exited 0."""
        result = self.cli(*args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # ---- the log and the process, from outside ----------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """The logged events; a last line still being written is not one yet.

        Tests poll this many times a second on logs of thousands of lines: each call parses
        only what was appended since the last (the log is only ever appended to)."""
        with self._events_lock:
            with self.log.open("rb") as log:
                log.seek(self._events_read)
                appended = log.read()
            complete = appended[: appended.rfind(b"\n") + 1]
            self._events_read += len(complete)
            lines = complete.decode(errors="replace").split("\n")
            self._events += [json.loads(line) for line in lines if line.startswith("{")]
            return list(self._events)

    def find(self, event: str) -> list[dict[str, Any]]:
        """The logged events named *event*."""
        return [e for e in self.events() if e.get("event") == event]

    def problems(self) -> list[str]:
        """Log lines that mean the daemon hit a bug: a crash, a traceback."""
        bad = ("crashed", "Traceback", "internal error", "unhandled")
        return [line for line in self.log.read_text().splitlines() if any(word in line for word in bad)]

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    # ---- the HTTP listener -------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def token(self) -> str:
        """The listener's bearer token: the one this harness configured, else the one it made."""
        configured = (self.http or {}).get("token", TOKEN)
        if configured is not None:
            return str(configured)
        return (self.state / "http-token").read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        """What every request to the listener needs: its bearer token."""
        return {"Authorization": f"Bearer {self.token}"}

    def mcp(self, path: str = "/mcp") -> AbstractAsyncContextManager[Any]:
        """A streamable-HTTP transport to *path* with the token, for ``mcp.client.Client``."""
        return _transport(self.url + path, self.headers)

    def get(self, path: str, **headers: str) -> httpx2.Response:
        return httpx2.get(self.url + path, headers={**self.headers, **headers}, timeout=10)

    # ---- what a daemon with its own state keeps ----------------------------------------------

    def pin_file(self, name: str) -> Path:
        return self.state / "pins" / self.instance.rstrip(":") / f"{name}.json"

    def catalog_file(self, name: str) -> Path:
        return self.state / "catalogs" / self.instance.rstrip(":") / f"{name}.json"


@asynccontextmanager
async def _transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams
