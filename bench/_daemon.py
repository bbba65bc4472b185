"""A real daemon for the benchmarks: a config in a private directory, started and stopped."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], bool], what: str, within: float = 60.0, interval: float = 0.05) -> float:
    """Poll *predicate*; return the seconds it took, or exit with a message after *within*."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > within:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - started


def fixture(script: str, **settings: Any) -> dict[str, Any]:
    """The config entry of a fixture server in tests/servers/."""
    return {"command": sys.executable, "args": [str(SERVERS / script)], **settings}


HTTP_TOKEN = "bench-token-" + "0" * 32  # the HTTP listener's bearer token (a bench's daemon is its own)


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    socket: str
    directory: Path
    http_url: str | None
    http_token: str = HTTP_TOKEN

    @property
    def http_headers(self) -> dict[str, str]:
        """What every request to the HTTP listener carries: it always authenticates."""
        return {"Authorization": f"Bearer {self.http_token}"}

    def status(self) -> dict[str, dict[str, Any]]:
        out = subprocess.run(
            [str(BIN / "mcp-supervisor"), "status", "--json", "--socket", self.socket],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            return {}
        return {record["name"]: record for record in json.loads(out.stdout)["extensions"]}

    def all_running(self, names: list[str]) -> bool:
        status = self.status()
        return all(status.get(name, {}).get("state") == "running" for name in names)


@contextlib.contextmanager
def daemon(extensions: dict[str, Any], *, http: bool = False, **settings: Any) -> Iterator[Running]:
    """A daemon on *extensions* (not waited for: see ``Running.all_running``); SIGTERMed after."""
    with tempfile.TemporaryDirectory(prefix="mcps-bench-", dir="/tmp") as tmp:
        directory = Path(tmp)
        port = free_port() if http else None
        config = {
            "socket": str(directory / "control.sock"),
            "spool": {"dir": str(directory / "spool")},
            **({"gateway": {"http": {"enabled": True, "port": port, "token": HTTP_TOKEN}}} if http else {}),
            **settings,
            "extensions": extensions,
        }
        (directory / "config.json").write_text(json.dumps(config))
        with open(directory / "daemon.log", "wb") as log:
            command = [str(BIN / "mcp-supervisor"), "daemon", "-c", str(directory / "config.json")]
            proc = subprocess.Popen(command, stdout=log, stderr=log)
        running = Running(proc, config["socket"], directory, f"http://127.0.0.1:{port}/mcp" if http else None)
        try:
            wait_for(lambda: Path(config["socket"]).exists() or proc.poll() is not None, "the control socket")
            yield running
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
