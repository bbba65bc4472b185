"""What a confined extension may consume: tasks (``pids_max``), its TMPDIR and /dev/shm (each a
tmpfs of ``tmp_max``), and ``memory_max`` counting what those hold.

Each limit is tried by the hostile fixture beside a sibling that must not notice. Where a limit
cannot be set (``pids_max`` for a root daemon or without user namespaces), ``status`` says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon.identity import instance_key
from supervisor.process import sandbox
from supervisor.process.sandbox import pidsgroup
from tests.harness import CLI, SERVERS, Daemon, extension_settings
from tests.harness.daemon import until
from tests.process.sandbox.test_levels import start_at
from tests.process.sandbox.test_sandbox import attempt

pytestmark = pytest.mark.timeout(120)

MIB = 1024**2
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # one that user can run: ours may live in root's home
SYSTEM = ("/usr", "/etc", "/bin", "/lib", "/lib64")


BOMB = """import sys, hostile
try:
    hostile._fork("100")
except OSError as exc:
    sys.exit(str(exc))
"""

ROOT_UNLIMITED = (
    "pids_max is not enforced: root's processes are exempt from RLIMIT_NPROC, and no cgroup v1 "
    "pids hierarchy is here"
)


@pytest.fixture
def world_readable() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="mcps-nobody-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.getuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="needs root to be nobody")
def test_pids_max_stops_a_fork_bomb_in_its_own_user_namespace_only(world_readable: Path) -> None:
    """The launcher's -p, as a daemon that is not root runs it: the bomb's 20th fork is refused
    (the server itself is the 20th task); the same bomb without -p forks all 100."""
    here = world_readable / "launcher"
    shutil.copytree(Path(sandbox.LAUNCHER).parent, here, ignore=shutil.ignore_patterns("__*"))
    for server in ("hostile.py", "_raw.py"):
        shutil.copy(SERVERS / server, here)
    (here / "bomb.py").write_text(BOMB)
    staging = world_readable / "staging"
    staging.mkdir()
    os.chown(staging, NOBODY, NOBODY)
    system = [arg for p in SYSTEM for arg in ("-l" if os.path.islink(p) else "-r", p)]
    launch = [
        SYSTEM_PYTHON,
        "-I",
        "-S",
        str(here / "launch.py"),
        "-s",
        str(staging),
        *system,
        "-r",
        str(here),
    ]
    command = ["--", SYSTEM_PYTHON, str(here / "bomb.py")]
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*nobody, *argv], capture_output=True, text=True, timeout=60, check=False)

    limited = run(*launch, "-p", "20", *command)
    assert limited.returncode == 1 and "after 19 processes" in limited.stderr, limited
    free = run(*launch, *command)
    assert free.returncode == 0, free


@pytest.mark.skipif(not pidsgroup.available(), reason="needs root and a cgroup v1 pids hierarchy")
def test_a_root_daemon_limits_each_run_in_a_pids_cgroup_of_its_own(sandboxed: Callable[..., Daemon]) -> None:
    """Root is exempt from RLIMIT_NPROC: each run joins a pids cgroup with its pids_max before
    it starts anything, so the bomb's 32nd task is refused; the cgroup goes with the run."""
    daemon = sandboxed({"extensions": {"bomb": extension_settings("hostile.py", sandbox={"pids_max": 32})}})
    record = daemon.wait_running("bomb")["bomb"]
    assert record["sandbox"]["unlimited"] == [] and record["sandbox"]["lacks"] == [], record
    mine = os.path.basename(sandbox.tmp_base(instance_key(daemon.socket)))  # this daemon's runs
    (leaf,) = [
        p for p in pidsgroup._pids_hierarchies()[0].glob(f"mcp-supervisor-{mine}/bomb-*") if p.is_dir()
    ]
    assert (leaf / "pids.max").read_text().strip() == "32"
    assert record["pid"] in {int(pid) for pid in (leaf / "cgroup.procs").read_text().split()}
    assert attempt(daemon, "bomb", "fork", 64).startswith("refused: EAGAIN")
    daemon.request("stop", {"name": "bomb"})
    until(lambda: not leaf.exists(), 10)


def test_a_daemon_says_where_pids_max_is_not_enforced(sandboxed: Callable[..., Daemon]) -> None:
    """Said in status and by explain; not a sandbox.partial warning (the confinement is whole)."""
    daemon = sandboxed({"extensions": {"bomb": extension_settings("hostile.py", sandbox={"pids_max": 32})}})
    record = daemon.wait_running("bomb")["bomb"]["sandbox"]
    unlimited = os.getuid() == 0 and not pidsgroup.available()
    said = ROOT_UNLIMITED
    assert record["unlimited"] == ([said] if unlimited else []) and record["lacks"] == [], record
    assert not daemon.find("sandbox.partial")
    explain = [*CLI, "check-config", str(daemon.config), "--explain", "bomb"]
    explained = subprocess.run(explain, capture_output=True, text=True, timeout=60, check=True).stdout
    assert (f"  not enforced here: {said}" in explained) is unlimited, explained
    outcome = attempt(daemon, "bomb", "fork", 64)
    assert outcome == "ok" if unlimited else outcome.startswith("refused: EAGAIN"), outcome


def test_tmpdir_and_dev_shm_are_memory_of_tmp_max_each(sandboxed: Callable[..., Daemon]) -> None:
    writer = extension_settings("hostile.py", sandbox={"tmp_max": "8M"})
    daemon = sandboxed({"extensions": {"writer": writer}})
    daemon.wait_running("writer")
    for path in ("$TMPDIR/big", "/dev/shm/big"):
        assert attempt(daemon, "writer", "fill", f"{path} {6 * MIB}") == "ok"
        full = attempt(daemon, "writer", "fill", f"{path}2 {4 * MIB}")
        assert full.startswith("refused: ENOSPC"), (path, full)
    tmp = next(Path(sandbox.tmp_base(instance_key(daemon.socket))).glob("writer-*/t"))
    assert list(tmp.iterdir()) == [], "TMPDIR is a tmpfs inside: nothing reaches the host's disk"


def test_memory_max_counts_files_in_tmpdir_and_dev_shm(sandboxed: Callable[..., Daemon]) -> None:
    """Files in a tmpfs are memory no process's RSS shows: 1 GiB of them once held a host while
    `memory_max: 200M` never fired."""
    settings = extension_settings("hostile.py", memory_max="96M")
    daemon = sandboxed({"extensions": {"hoarder": settings, "sibling": extension_settings("quick.py")}})
    first = daemon.wait_running("hoarder")["hoarder"]
    assert attempt(daemon, "hoarder", "fill", f"/dev/shm/hoard {112 * MIB}") == "ok"
    record: dict[str, Any] = {}

    def restarted() -> bool:
        record.update(daemon.status()["hoarder"])
        return bool(record["restarts"] > first["restarts"])

    until(restarted, 30)
    assert "memory_max 96 MiB exceeded" in record["last_error"], record
    assert "of it files in its TMPDIR and /dev/shm" in record["last_error"], record
    assert daemon.status()["sibling"]["state"] == "running"


def test_a_package_cache_past_cache_max_ends_the_run_and_is_emptied(
    sandboxed: Callable[..., Daemon], short_tmp: Path
) -> None:
    """The private cache is on disk, out of tmp_max's reach: measured instead. Past cache_max the
    run ends with the reason, and the next start empties the cache before it runs. (The server
    runs as `pip`, a link to the interpreter: a command that gets a private pip cache.)"""
    pip = short_tmp / "bin" / "pip"
    pip.parent.mkdir()
    pip.symlink_to(sys.executable)
    settings = {**extension_settings("hostile.py", sandbox={"cache_max": "4M"}), "command": str(pip)}
    daemon = sandboxed({"extensions": {"filler": settings}})
    first = daemon.wait_running("filler")["filler"]
    assert attempt(daemon, "filler", "mkdir", "$PIP_CACHE_DIR") == "ok"  # as pip makes it
    assert attempt(daemon, "filler", "fill", f"$PIP_CACHE_DIR/big {6 * MIB}") == "ok"
    record: dict[str, Any] = {}

    def restarted() -> bool:
        record.update(daemon.status()["filler"])
        return bool(record["restarts"] > first["restarts"])

    until(restarted, 30)
    assert "package cache grew past cache_max (4 MiB)" in record["last_error"], record
    daemon.wait_running("filler")
    assert attempt(daemon, "filler", "read", "$PIP_CACHE_DIR/big").startswith("refused: ENOENT")
    assert daemon.find("sandbox.cache_cleared")


def test_without_user_namespaces_the_limits_are_said_missing(sandboxed: Callable[..., Daemon]) -> None:
    daemon = start_at(sandboxed, "no user namespaces", {"plain": extension_settings("hostile.py")})
    record = daemon.wait_running("plain")["plain"]["sandbox"]
    if os.getuid() != 0:
        assert record["unlimited"] == ["pids_max is not enforced: no user namespace"]
    else:  # a pids cgroup needs no namespace
        assert record["unlimited"] == ([] if pidsgroup.available() else [ROOT_UNLIMITED]), record
    assert "neither sized (tmp_max) nor counted in memory_max" in " ".join(record["lacks"])
    assert attempt(daemon, "plain", "fork", 40) == "ok"  # the user's own RLIMIT_NPROC is left alone
