"""Published MCP servers and a third-party client, installed into ``.cache/interop`` by the tests.

Everything comes from the public registries at pinned versions, once per session, into a
project-local cache that git ignores (nothing lands in ``~/.npm`` or ``~/.cache/uv``): npm
packages with ``npm install --prefix``, and ``uvx`` (from the test venv) with its cache and
tool directories inside it, in a thread started when collection finds the group (other tests
run meanwhile). A later run finds the packages installed and the caches warm.
Tests skip, with the reason, only when a registry cannot be reached.

One daemon serves the whole group: every server as an installed binary, through ``npx -y``
and through ``uvx``, ``server-everything`` once more as a remote extension (its streamable HTTP
mode on loopback: ``remote-everything``), plus the HTTP listener, so the group pays for one start.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from supervisor.process import children as process
from tests.harness import Daemon, until
from tests.harness.timing import patience

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "interop"
NPM_PREFIX = CACHE / "npm"
BIN = NPM_PREFIX / "node_modules" / ".bin"
INSTALLED_BY = CACHE / "installed-by"  # the test run whose worker last installed: 2.6 CPU-s a worker

# Pinned, so that CI runs what passed here. Bump together and run `make test`.
NPM_PACKAGES = {
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
    "@modelcontextprotocol/server-memory": "2026.8.31",
    "@modelcontextprotocol/inspector": "2.12.0",  # the TypeScript SDK's client, `--cli` mode
}
MCP_SERVER_TIME = "2026.10.19"  # PyPI, run through uvx

NPM_REGISTRY = "https://registry.npmjs.org/@modelcontextprotocol%2fserver-memory"
PYPI = "https://pypi.org/simple/mcp-server-time/"
PROBE_TIMEOUT = 5.0
INSTALL_TIMEOUT = 600.0  # a cold cache on a slow link; a warm one installs nothing
START_TIMEOUT = 180  # the extensions' start_timeout: npx -y and uvx download on a cold cache

# The wrappers' settings, for the installs here and the daemon's children; the caches are the
# installs' alone: each confined extension has a private one (under the daemon's XDG_CACHE_HOME).
QUIET_ENV = {
    "npm_config_update_notifier": "false",
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "UV_NO_PROGRESS": "1",
}
CACHE_ENV = {
    "npm_config_cache": str(CACHE / "npm-cache"),
    "UV_CACHE_DIR": str(CACHE / "uv-cache"),
    "UV_TOOL_DIR": str(CACHE / "uv-tools"),
    "UV_PYTHON_INSTALL_DIR": str(CACHE / "uv-python"),
}
XDG_CACHE = CACHE / "xdg"  # the interop daemon's: the extensions' private caches, warm from run to run
UVX = Path(sys.executable).with_name("uvx")


def reachable(url: str) -> str | None:
    """None when *url* answers within PROBE_TIMEOUT, else why not."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=PROBE_TIMEOUT):
            return None
    except Exception as exc:  # URLError, TimeoutError, an HTTP error: all mean "cannot use it"
        return f"{url} cannot be reached ({exc})"


def _installed(package: str) -> str | None:
    manifest = NPM_PREFIX / "node_modules" / package / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def _run(argv: list[str], **kwargs: Any) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")


@dataclass(frozen=True)
class Toolchain:
    """Where the installed packages are, and the environment their wrappers need."""

    bin: Path
    uvx: Path
    env: dict[str, str]


def _prepare() -> str | None:
    """Install the pinned packages (a no-op on a warm cache); why the group must skip, or None."""
    if shutil.which("npm") is None or shutil.which("npx") is None:
        return "npm and npx are not installed"
    for url in (NPM_REGISTRY, PYPI):
        if (why := reachable(url)) is not None:
            return why
    env = {**os.environ, **QUIET_ENV, **CACHE_ENV}
    CACHE.mkdir(parents=True, exist_ok=True)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # every worker of a run starts this
    with open(CACHE / "install.lock", "w") as lock:  # one installer at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if run is not None and _read(INSTALLED_BY) == run:
            return None  # another worker of this run installed (or found) it all
        if any(_installed(name) != version for name, version in NPM_PACKAGES.items()):
            NPM_PREFIX.mkdir(parents=True, exist_ok=True)  # all at once: npm prunes what it was not given
            pinned = [f"{name}@{version}" for name, version in NPM_PACKAGES.items()]
            _run(["npm", "install", "--prefix", str(NPM_PREFIX), "--save-exact", *pinned], env=env)
        # uvx installs on first use: do it here, so the daemon's start is not the download.
        _run([str(UVX), f"mcp-server-time=={MCP_SERVER_TIME}", "--help"], env=env, stdin=subprocess.DEVNULL)
        if run is not None:
            INSTALLED_BY.write_text(run)
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


_installing: Future[str | None] | None = None


def _install_in_background() -> Future[str | None]:
    global _installing
    if _installing is None:
        future: Future[str | None] = Future()

        def run() -> None:
            try:
                future.set_result(_prepare())
            except BaseException as exc:  # the fixture raises it in the test that needs the packages
                future.set_exception(exc)

        threading.Thread(target=run, name="interop-install", daemon=True).start()
        _installing = future
    return _installing


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the installs once the group is known to run, beside the other tests: on a fresh
    clone they download for a minute or more, and each worker that reached the group used to
    wait for them instead of running anything else."""
    if any(item.nodeid.startswith("tests/interop/") for item in session.items):
        _install_in_background()


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    """The pinned packages, installed once per session (a no-op on a warm cache), or skip if offline."""
    if (why := _install_in_background().result(timeout=2 * INSTALL_TIMEOUT)) is not None:
        pytest.skip(why)
    return Toolchain(BIN, UVX, dict(QUIET_ENV))


def npx(package: str) -> list[str]:
    return ["-y", f"{package}@{NPM_PACKAGES[package]}"]


def extensions(chain: Toolchain, work: Path) -> dict[str, dict[str, Any]]:
    """The published servers, each as an installed binary and through its wrapper."""
    files = work / "files"
    files.mkdir()
    (files / "hello.txt").write_text("hello from the interop test\n")
    common = {"start_timeout": START_TIMEOUT, "stop_timeout": 5, "call_timeout": 30, "env": chain.env}

    memory = work / "memory"  # the sandbox grants the servers these directories, nothing else of work/
    memory.mkdir()

    def memory_env(name: str) -> dict[str, str]:  # its default file is inside its package
        return {**chain.env, "MEMORY_FILE_PATH": str(memory / f"{name}.jsonl")}

    outside = work / "outside"  # given to a server-filesystem that the sandbox does not grant it
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the confined server\n")
    cold_cache = work / "npm-cold"  # an empty npm cache: `npx -y` downloads everything, confined

    files_granted = {"sandbox": {"write": [str(files)]}}
    memory_granted = {"sandbox": {"write": [str(memory)]}}

    # npx runs outside the npm prefix, so it resolves the package itself instead of the local bin.
    wrapped = {"command": "npx", "cwd": str(work)}
    return {
        "everything": {**common, "command": str(chain.bin / "mcp-server-everything")},
        "filesystem": {
            **common,
            **files_granted,
            "command": str(chain.bin / "mcp-server-filesystem"),
            "args": [str(files)],
        },
        "memory": {
            **common,
            **memory_granted,
            "command": str(chain.bin / "mcp-server-memory"),
            "env": memory_env("memory"),
        },
        "npx-everything": {**common, **wrapped, "args": npx("@modelcontextprotocol/server-everything")},
        "npx-filesystem": {
            **common,
            **wrapped,
            **files_granted,
            "args": [*npx("@modelcontextprotocol/server-filesystem"), str(files)],
        },
        "npx-memory": {
            **common,
            **wrapped,
            **memory_granted,
            "args": npx("@modelcontextprotocol/server-memory"),
            "env": memory_env("npx-memory"),
        },
        "npx-cold": {
            **common,
            **wrapped,
            **memory_granted,
            "args": npx("@modelcontextprotocol/server-memory"),
            "env": {**memory_env("npx-cold"), "npm_config_cache": str(cold_cache)},  # granted as its cache
            "sandbox": {**memory_granted["sandbox"], "network": "outbound"},
        },
        "fs-confined": {
            **common,
            **files_granted,
            "command": str(chain.bin / "mcp-server-filesystem"),
            "args": [str(files), str(outside)],
        },
        "time": {
            **common,
            "command": str(chain.uvx),
            "args": [f"mcp-server-time=={MCP_SERVER_TIME}", "--local-timezone", "UTC"],
        },
    }


@dataclass
class Interop:
    daemon: Daemon
    work: Path
    http_url: str  # the gateway's streamable HTTP endpoint, .../mcp
    toolchain: Toolchain

    @property
    def mcp_sock(self) -> str:
        return str(Path(self.daemon.socket).parent / "mcp.sock")

    def ensure_running(self, name: str) -> dict[str, Any]:
        """Start *name* if a test stopped it; its status record once running."""
        if self.daemon.status()[name]["state"] in ("stopped", "failed"):
            started = self.daemon.cli("start", name)
            assert started.returncode == 0, started.stderr
        return wait_running(self.daemon, name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def serve_everything(chain: Toolchain, mode: str) -> tuple[subprocess.Popen[bytes], str]:
    """server-everything in *mode* (``streamableHttp``, ``sse``) on a free loopback port: the
    process, and its URL once it accepts connections."""
    port = free_port()
    env = {**os.environ, **chain.env, "PORT": str(port)}
    binary = chain.bin / "mcp-server-everything"
    proc = subprocess.Popen([str(binary), mode], env=env, stderr=subprocess.DEVNULL)
    until(lambda: accepts(port), within=patience(30))
    return proc, f"http://127.0.0.1:{port}{'/sse' if mode == 'sse' else '/mcp'}"


def wait_running(daemon: Daemon, name: str) -> dict[str, Any]:
    """*name*'s record once running; fails at once, with its stderr, if it fails or backs off."""
    settled = ("running", "failed", "backoff", "stopped")
    until(lambda: daemon.status()[name]["state"] in settled, within=START_TIMEOUT)
    record = daemon.status()[name]
    assert record["state"] == "running", (record, daemon.cli("logs", name, "-n", "20").stdout)
    return record


@pytest.fixture(scope="session")
def interop(toolchain: Toolchain) -> Iterator[Interop]:
    """One daemon supervising every published server, with the HTTP listener on a free port."""
    work = Path(tempfile.mkdtemp(prefix="mcpi-", dir="/tmp"))  # short: unix socket paths
    supervised = extensions(toolchain, work)
    remote, url = serve_everything(toolchain, "streamableHttp")
    supervised["remote-everything"] = {"url": url, "start_timeout": START_TIMEOUT, "stop_timeout": 2}
    settings = {"spool": {"dir": str(work / "spool")}}
    daemon = Daemon(work, supervised, settings=settings, http={}, env={"XDG_CACHE_HOME": str(XDG_CACHE)})
    daemon.start()
    try:
        for name in supervised:
            wait_running(daemon, name)
        yield Interop(daemon, work, daemon.url + "/mcp", toolchain)
        assert daemon.terminate() == 0, daemon.log.read_text()[-3000:]
    finally:
        remote.kill()
        remote.wait()
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait()
        leftovers = process.find_marked(daemon.instance)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
        assert not leftovers, f"processes outlived the daemon: {sorted(leftovers)}"
