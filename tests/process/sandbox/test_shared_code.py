"""No extension writes what another one, the daemon or the user executes (issue 32, §2).

The poisonings a review found, each tried by the hostile fixture run as ``npx`` or ``uvx`` (a
script of that name, so the sandbox sees the package manager): a payload left in the user's
``~/.npm/_npx`` or uv's cache or tools directory, which the next ``npx -y``/``uvx`` (another
extension's, or the user's in a shell) runs unconfined; the daemon's own launcher rewritten
through a write grant that covers it. Each at the full level and at Landlock alone (where the
write grants are split around what stays read-only).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Daemon, extension_settings
from tests.harness.servers import SERVERS
from tests.process.sandbox.test_levels import NO_USERNS
from tests.process.sandbox.test_sandbox import attempt

pytestmark = [pytest.mark.timeout(120), pytest.mark.anyio]

LEVELS = {"full": (None, False), "landlock 4 alone": (4, True)}


def wrapper(directory: Path, name: str) -> Path:
    """The hostile fixture as an executable called *name* (``npx``, ``uvx``)."""
    path = directory / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    hostile = SERVERS / "hostile.py"
    path.write_text(
        f"#!{sys.executable}\nimport runpy, sys\nsys.path.insert(0, {str(SERVERS)!r})\n"
        f"runpy.run_path({str(hostile)!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


def as_tool(command: Path, **sandbox: Any) -> dict[str, Any]:
    settings = extension_settings("hostile.py", sandbox={"read": [str(SERVERS)], **sandbox})
    return {**settings, "command": str(command), "args": []}


@pytest.fixture
def user(short_tmp: Path) -> Path:
    """The daemon's home (its `sandboxed` fixture puts it here) as a user of npx and uv left it."""
    home = short_tmp / "home"
    for directory in (
        ".npm/_npx/0a1b/node_modules/server",
        ".cache/uv/archive-v0/x/bin",
        ".local/share/uv/tools/mcp-supervisor/bin",
        ".local/bin",
        "notes",
    ):
        (home / directory).mkdir(parents=True)
    (home / ".local/share/uv/tools/mcp-supervisor/bin/mcp-supervisor").write_text("#!/bin/sh\n")
    return home


@pytest.mark.parametrize("level", list(LEVELS))
async def test_no_extension_writes_what_another_the_daemon_or_the_user_executes(
    sandboxed: Callable[..., Daemon], short_tmp: Path, user: Path, level: str
) -> None:
    npx, uvx = wrapper(short_tmp / "tools", "npx"), wrapper(short_tmp / "tools", "uvx")
    extensions = {
        "npx-a": as_tool(npx),
        "npx-b": as_tool(npx),
        "uvx-a": as_tool(uvx),
        "writer": as_tool(npx, write=["~"]),
    }
    abi, no_userns = LEVELS[level]
    env = {"PATH": f"{user / '.local' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env |= {} if abi is None else {"MCP_SUPERVISOR_SANDBOX_ABI": str(abi)}
    daemon = sandboxed({"extensions": extensions}, prefix=NO_USERNS if no_userns else None, env=env)
    daemon.wait_running(*extensions)
    caches = user / ".cache" / "mcp-supervisor" / "extensions"

    # Its own cache: npx -y works, confined; the payload stays its own.
    planted = "$npm_config_cache/_npx/evil/node_modules/x/index.js"
    assert attempt(daemon, "npx-a", "plant", planted) == "ok"
    own = caches / "npx-a" / "npm" / "_npx" / "evil" / "node_modules" / "x" / "index.js"
    assert own.is_file()
    for kind, target in (("read", own), ("list", caches / "npx-a"), ("plant", own)):
        assert attempt(daemon, "npx-b", kind, target).startswith("refused"), (kind, target)

    shared = {
        "npm's _npx": user / ".npm/_npx/0a1b/node_modules/server/index.js",
        "uv's cache": user / ".cache/uv/archive-v0/x/bin/tool",
        "uv's tools": user / ".local/share/uv/tools/mcp-supervisor/bin/mcp-supervisor",
        "a directory on PATH": user / ".local/bin/npx",
        "the daemon's Python": Path(sys.prefix) / "poisoned-by-a-test",
    }
    try:
        for name in ("npx-a", "uvx-a", "writer"):
            for what, target in shared.items():
                done = attempt(daemon, name, "plant", target)
                assert done.startswith("refused"), (level, name, what, done)
        assert attempt(daemon, "writer", "plant", user / "notes" / "todo.txt") == "ok"  # its grant holds
    finally:
        (Path(sys.prefix) / "poisoned-by-a-test").unlink(missing_ok=True)
    assert (user / ".local/share/uv/tools/mcp-supervisor/bin/mcp-supervisor").read_text() == "#!/bin/sh\n"
    assert not (user / ".npm/_npx/0a1b/node_modules/server/index.js").exists()
    assert not (user / ".local/bin/npx").exists()
