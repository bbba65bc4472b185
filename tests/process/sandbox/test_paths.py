"""Paths checked by name, used by fd (issue 32, §4).

What the review got past the grants: a `read:` grant of a symlink to `~/.ssh`; a glob (`~/.*`)
counting as naming the hidden paths it matches; a symlink planted by one extension where
another's glob grant looks (`~/projects/*` -> `~/.aws`); a path swapped for a symlink between
the daemon's check and the launcher's bind; and a script path walking through a directory
outside the grants (`tools/../bb/server.py`), which never started. At the full level and at
Landlock alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.process.sandbox import launch
from tests.harness import CLI, Daemon, extension_settings, zygote
from tests.harness.servers import SERVERS
from tests.harness.timing import patience
from tests.process.sandbox.test_launch import LAUNCH, SYSTEM
from tests.process.sandbox.test_levels import NO_USERNS
from tests.process.sandbox.test_sandbox import attempt

pytestmark = [pytest.mark.timeout(120), pytest.mark.anyio]

LEVELS = {"full": (None, False), "landlock 4 alone": (4, True)}


def hostile(**sandbox: Any) -> dict[str, Any]:
    return extension_settings("hostile.py", sandbox=sandbox)


@pytest.fixture
def home(short_tmp: Path) -> Path:
    """The daemon's home (see `sandboxed`), with cloud keys, a link to ~/.ssh and projects."""
    home = short_tmp / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = x\n")
    (home / "keys").symlink_to(home / ".ssh")
    (home / "projects" / "app").mkdir(parents=True)
    (home / "projects" / "app" / "README").write_text("readable\n")
    (home / ".profile").write_text("# a dotfile like any other\n")
    return home


@pytest.mark.parametrize("level", list(LEVELS))
async def test_a_symlink_or_a_glob_never_uncovers_a_hidden_path(
    sandboxed: Callable[..., Daemon], home: Path, short_tmp: Path, level: str
) -> None:
    work = short_tmp / "work"  # `python work/tools/../bb/quick.py`, with work/tools granted nothing
    (work / "tools").mkdir(parents=True)
    (work / "bb").mkdir()
    for name in ("quick.py", "_raw.py"):
        shutil.copy(SERVERS / name, work / "bb" / name)
    walker = extension_settings("quick.py")
    walker["args"] = [f"{work}/tools/../bb/quick.py"]
    extensions = {
        "linked": hostile(read=["~/keys"]),
        "dotglob": hostile(read=["~/.*"]),
        "planter": hostile(write=["~/projects"]),
        "globber": hostile(read=["~/projects/*"]),
        "walker": walker,
    }
    abi, no_userns = LEVELS[level]
    env = {} if abi is None else {"MCP_SUPERVISOR_SANDBOX_ABI": str(abi)}
    daemon = sandboxed({"extensions": extensions}, prefix=NO_USERNS if no_userns else None, env=env)
    daemon.wait_running(*extensions)
    key, aws = home / ".ssh" / "id_ed25519", home / ".aws" / "credentials"

    for target in (home / "keys" / "id_ed25519", key):
        assert attempt(daemon, "linked", "read", target).startswith("refused"), target
    for target in (key, aws):
        assert attempt(daemon, "dotglob", "read", target).startswith("refused"), target
    assert attempt(daemon, "dotglob", "read", home / ".profile") == "ok"  # what the glob grants

    assert attempt(daemon, "planter", "symlink", f"{home / 'projects' / 'evil'} {home / '.aws'}") == "ok"
    restarted = daemon.cli("restart", "globber")  # its grants are computed again: the link is there
    assert restarted.returncode == 0, restarted.stderr
    daemon.wait_running("globber")
    planted = home / "projects" / "evil" / "credentials"
    assert attempt(daemon, "globber", "read", planted).startswith("refused")
    assert attempt(daemon, "globber", "read", aws).startswith("refused")
    assert attempt(daemon, "globber", "read", home / "projects" / "app" / "README") == "ok"


def test_a_path_swapped_for_a_symlink_after_the_check_fails_the_start(tmp_path: Path) -> None:
    """The daemon checked a directory; by the launch it is a link to a secret: nothing runs."""
    staging, secret, checked = tmp_path / "r", tmp_path / "secret", tmp_path / "grant"
    staging.mkdir()
    secret.mkdir()
    (secret / "key").write_text("secret\n")
    checked.symlink_to(secret)  # swapped in after the daemon's check
    for namespaces in ([], ["-N"]):
        done = subprocess.run(
            [*LAUNCH, *namespaces, "-n", "all", "-s", str(staging), *SYSTEM, "-r", str(checked), "--",
             sys.executable, "-c", f"print(open({str(checked / 'key')!r}).read())"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == launch.EXIT_SANDBOX, (namespaces, done.stdout, done.stderr)
        assert "changed since the daemon checked it" in done.stderr and "secret" not in done.stdout


def test_a_path_argument_no_grant_covers_is_said_at_start_and_by_explain(
    daemons: Callable[..., Daemon], short_tmp: Path
) -> None:
    """A file server told to serve a directory it is not granted finds it missing: the daemon
    says so once at its start (not at each restart), and `check-config --explain` too."""
    served = short_tmp / "served"
    served.mkdir()
    server = extension_settings("quick.py", str(served), "--verbose")
    daemon = daemons({"fs": server}, end="exit 0")
    daemon.wait_running("fs")
    warned = daemon.find("sandbox.path_not_granted")
    assert [event["paths"] for event in warned] == [[str(served)]], warned
    assert warned[0]["extension"] == "fs"
    explained = zygote.run(
        [*CLI, "check-config", str(daemon.config), "--explain", "fs"], timeout=patience(60), env=daemon.env
    )
    assert explained.returncode == 0, explained.stderr
    assert f"not granted: {served} (an argument of it" in explained.stdout


@pytest.fixture
def root_only_file() -> Iterator[Path]:
    """A file in /etc that only root may read, as /etc/default/cacerts (0600) is."""
    path = Path(f"/etc/mcps-test-{uuid.uuid4().hex[:12]}.conf")
    path.write_text("password=hunter2\n")
    path.chmod(0o600)
    yield path
    path.unlink()


@pytest.mark.skipif(os.getuid() != 0, reason="a root daemon's view: only root reads a 0600 file of root's")
@pytest.mark.parametrize("level", list(LEVELS))
def test_a_root_daemons_extensions_read_in_etc_only_what_others_may(
    sandboxed: Callable[..., Daemon], root_only_file: Path, level: str
) -> None:
    """Beyond the named secrets (/etc/shadow, ...): what the daemon's user alone may read is hidden."""
    abi, no_userns = LEVELS[level]
    env = {} if abi is None else {"MCP_SUPERVISOR_SANDBOX_ABI": str(abi)}
    extensions = {"reader": hostile()}
    daemon = sandboxed({"extensions": extensions}, prefix=NO_USERNS if no_userns else None, env=env)
    daemon.wait_running("reader")
    assert attempt(daemon, "reader", "read", root_only_file).startswith("refused"), level
    assert attempt(daemon, "reader", "read", "/etc/passwd") == "ok"  # what anyone may read
    explain = [*CLI, "check-config", str(daemon.config), "--explain", "reader"]
    explained = subprocess.run(explain, capture_output=True, text=True, timeout=60, check=True).stdout
    hidden = next(line for line in explained.splitlines() if str(root_only_file) in line)
    assert hidden.split()[0] == "hidden" and "readable by the daemon's user, not by others" in hidden
