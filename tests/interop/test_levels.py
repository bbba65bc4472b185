"""The published servers confined at each level a host may offer: they run, answer and write
what they are granted on Landlock ABI 1, 4 and 6 and on a host without user namespaces (the
levels of tests/process/sandbox/test_levels.py), and ``status`` shows the level.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.harness import Daemon
from tests.process.sandbox.test_levels import LEVELS, NO_USERNS

from .conftest import XDG_CACHE, Toolchain, extensions, wait_running
from .test_servers import CASES

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

SERVERS = ("everything", "filesystem", "memory", "time")  # the installed ones; npx is test_servers'
KERNEL_ABI = 7


@pytest.mark.parametrize("level", ["abi 1", "abi 4", "abi 6", "no user namespaces"])
def test_published_servers_run_confined_at_each_level(toolchain: Toolchain, level: str) -> None:
    abi, no_userns = LEVELS[level]
    work = Path(tempfile.mkdtemp(prefix="mcpl-", dir="/tmp"))  # short: unix socket paths
    chosen = {name: config for name, config in extensions(toolchain, work).items() if name in SERVERS}
    env = {"XDG_CACHE_HOME": str(XDG_CACHE)} | (
        {} if abi is None else {"MCP_SUPERVISOR_SANDBOX_ABI": str(abi)}
    )
    daemon = Daemon(work, chosen, env=env, prefix=NO_USERNS if no_userns else None)
    daemon.start()
    try:
        shown = f"landlock {abi or KERNEL_ABI}, {'no ' if no_userns else ''}namespaces, seccomp"
        for name in SERVERS:
            assert wait_running(daemon, name)["sandbox"]["confined"] == shown, level
        for case in (c for c in CASES if c.name in SERVERS):
            files = str(work / "files")
            arguments = json.loads(json.dumps(case.arguments).replace("{files}", files))
            result = daemon.call(case.name, case.call, **arguments)
            assert not result["isError"], (level, case.name, result)
            seen_from = SimpleNamespace(work=work)  # what the checks read of the session's Interop
            assert case.check(result["content"][0]["text"], seen_from), (level, case.name, result)  # type: ignore[arg-type]
        assert (work / "memory" / "memory.jsonl").exists()  # written where it was granted
        assert daemon.terminate() == 0
    finally:
        daemon.kill()
        shutil.rmtree(work, ignore_errors=True)
