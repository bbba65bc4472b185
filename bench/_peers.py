"""Other MCP gateways in front of the echo fixture, for ``bench/gateway.py``: installed and started.

Each peer is installed from its registry, at a pinned version, into an ignored cache of this
checkout the first time it is asked for (PyPI peers into ``bench/.venv-NAME``, npm peers into
``.cache/bench-npm``), and serves the fixture command it is given (``tests/servers/echo.py``
run by this interpreter).

    proxy          mcp-proxy (PyPI): stdio -> streamable HTTP, one fixture for every session
    hub            mcp-hub (npm): its unified endpoint (SSE), one fixture for every session
    fastmcp        FastMCP's ``create_proxy`` on an ``mcpServers`` config, over stdio: a proxy
                   process and a fixture per session
    fastmcp-http   ``fastmcp run mcp.json --transport http``: FastMCP's proxy for an MCP config
    supergateway   supergateway (npm): stdio -> stateful streamable HTTP, a fixture per session
                   (its SSE mode sends every answer to every session, so 8 clients collide)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from _daemon import ROOT, free_port, wait_for

PYPI = {"mcp-proxy": "mcp-proxy==0.13.0", "fastmcp": "fastmcp==4.2.3"}
NPM = {"mcp-hub": "mcp-hub@4.2.1", "supergateway": "supergateway@4.0.0"}
NPM_PREFIX = ROOT / ".cache" / "bench-npm"
VERSIONS = {
    "proxy": PYPI["mcp-proxy"],
    "hub": NPM["mcp-hub"],
    "fastmcp": PYPI["fastmcp"],
    "fastmcp-http": PYPI["fastmcp"],
    "supergateway": NPM["supergateway"],
}
HTTP_PEERS = ("proxy", "hub", "fastmcp-http", "supergateway")  # a server to start; ``fastmcp`` is spawned


def pypi_venv(name: str) -> Path:
    """``bench/.venv-NAME`` with the pinned release of *name*; its bin directory."""
    venv = ROOT / "bench" / f".venv-{name}"
    done = venv / ".installed"
    if not done.exists() or done.read_text() != PYPI[name]:
        print(f"bench: installing {PYPI[name]} into {venv}", file=sys.stderr)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-qq", "--disable-pip-version-check", PYPI[name]]
        subprocess.run(pip, check=True)
        done.write_text(PYPI[name])
    return venv / "bin"


def npm_bin(name: str) -> Path:
    """The pinned release of the npm package *name* in ``.cache/bench-npm``; its script."""
    script = NPM_PREFIX / "node_modules" / ".bin" / name
    done = NPM_PREFIX / f".installed-{name}"
    if not script.exists() or not done.exists() or done.read_text() != NPM[name]:
        if shutil.which("npm") is None:
            raise SystemExit(f"bench: {name} needs npm (Node.js); leave it out with --skip")
        print(f"bench: installing {NPM[name]} into {NPM_PREFIX}", file=sys.stderr)
        NPM_PREFIX.mkdir(parents=True, exist_ok=True)
        command = ["npm", "install", "--prefix", str(NPM_PREFIX), "--no-audit", "--no-fund", "--silent"]
        subprocess.run(
            [*command, NPM[name]], check=True, env={**os.environ, "npm_config_update_notifier": "false"}
        )
        done.write_text(NPM[name])
    return script


def install(names: list[str]) -> None:
    """Install the peers in *names* (before any timing: the first install takes a minute)."""
    for name in names:
        if name == "proxy":
            pypi_venv("mcp-proxy")
        elif name in ("fastmcp", "fastmcp-http"):
            pypi_venv("fastmcp")
        elif name == "hub":
            npm_bin("mcp-hub")
        elif name == "supergateway":
            npm_bin("supergateway")


def fastmcp_stdio(fixture_cmd: list[str]) -> list[str]:
    """The command of FastMCP's stdio proxy (``_fastmcp_proxy.py``) spawning *fixture_cmd*."""
    return [str(pypi_venv("fastmcp") / "python"), str(ROOT / "bench" / "_fastmcp_proxy.py"), *fixture_cmd]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _hub_ready(port: int) -> bool:
    """mcp-hub listens before its servers are connected: wait for its own word."""
    if not _listening(port):
        return False
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5) as answer:
            health = json.load(answer)
        return health.get("state") == "ready" and all(
            server.get("status") == "connected" for server in health.get("servers", [])
        )
    return False


def _hub_home(directory: Path) -> dict[str, str]:
    """A private XDG home for mcp-hub, its marketplace cache filled so that it tries no download."""
    cache = directory / "data" / "mcp-hub" / "cache"
    cache.mkdir(parents=True)
    registry = {"version": "bench", "generatedAt": 0, "totalServers": 1, "servers": [{"id": "none"}]}
    record = {"registry": registry, "lastFetchedAt": int(time.time() * 1000), "serverDocumentation": {}}
    (cache / "registry.json").write_text(json.dumps(record))
    return {
        "XDG_DATA_HOME": str(directory / "data"),
        "XDG_STATE_HOME": str(directory / "state"),
        "XDG_CONFIG_HOME": str(directory / "config"),
    }


def _command(
    name: str, fixture_cmd: list[str], port: int, directory: Path
) -> tuple[list[str], str, dict[str, str]]:
    """The command line of the HTTP peer *name*, its URL and extra environment."""
    url = f"http://127.0.0.1:{port}/mcp"
    mcp_json = directory / "mcp.json"
    mcp_json.write_text(
        json.dumps({"mcpServers": {"echo": {"command": fixture_cmd[0], "args": fixture_cmd[1:]}}})
    )
    if name == "proxy":
        return [str(pypi_venv("mcp-proxy") / "mcp-proxy"), "--port", str(port), "--", *fixture_cmd], url, {}
    if name == "hub":
        return (
            [str(npm_bin("mcp-hub")), "--port", str(port), "--config", str(mcp_json)],
            url,
            _hub_home(directory),
        )
    if name == "fastmcp-http":
        fastmcp = str(pypi_venv("fastmcp") / "fastmcp")
        options = [
            "--transport",
            "http",
            "--port",
            str(port),
            "--no-banner",
            "--skip-env",
            "--log-level",
            "WARNING",
        ]
        return [fastmcp, "run", str(mcp_json), *options], url, {}
    if name == "supergateway":
        options = [
            "--outputTransport",
            "streamableHttp",
            "--stateful",
            "--port",
            str(port),
            "--logLevel",
            "none",
        ]
        return [str(npm_bin("supergateway")), "--stdio", shlex.join(fixture_cmd), *options], url, {}
    raise ValueError(f"no HTTP peer named {name}")


@contextlib.contextmanager
def serve(name: str, fixture_cmd: list[str]) -> Iterator[tuple[str, int]]:
    """The HTTP peer *name* serving *fixture_cmd*, ready: its URL and pid; its process group killed after."""
    with tempfile.TemporaryDirectory(prefix=f"mcps-{name}-", dir="/tmp") as tmp:
        port = free_port()
        command, url, env = _command(name, fixture_cmd, port, Path(tmp))
        ready: Callable[[], bool] = (
            (lambda: _hub_ready(port)) if name == "hub" else (lambda: _listening(port))
        )
        with open(os.devnull, "wb") as quiet:
            proc = subprocess.Popen(
                command,
                stdout=quiet,
                stderr=quiet,
                env={**os.environ, **env},
                cwd=tmp,
                start_new_session=True,
            )
        try:
            wait_for(lambda: ready() or proc.poll() is not None, f"{name} to listen", within=120)
            if proc.poll() is not None:
                raise SystemExit(
                    f"bench: {name} exited at start ({proc.returncode}); leave it out with --skip {name}"
                )
            yield url, proc.pid
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it spawned and left behind
            proc.wait(timeout=15)
