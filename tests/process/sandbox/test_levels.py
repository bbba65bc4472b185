"""The sandbox at each level a host may offer, forced on this kernel: best effort, said in words.

Older kernels are played by capping the Landlock ABI the daemon's launcher uses
(``MCP_SUPERVISOR_SANDBOX_ABI``), a host that refuses user namespaces by starting the daemon
under a seccomp filter that refuses them (``seccomp.py --only-user-namespaces``), as AppArmor's
restriction on Ubuntu 24.04 or a container's profile would. At each level the hostile fixture
tries what a malicious server would; what the level cannot refuse is what ``status`` says it lacks.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.process.sandbox import Host
from tests.harness import CLI, ROOT, Daemon, extension_settings
from tests.harness.daemon import NO_USER_NAMESPACES
from tests.process.sandbox.test_sandbox import attempt

pytestmark = [pytest.mark.timeout(120), pytest.mark.anyio]

NO_USERNS = NO_USER_NAMESPACES
# name: (Landlock ABI cap, user namespaces refused)
LEVELS = {
    "abi 1": (1, False),
    "abi 4": (4, False),
    "abi 6": (6, False),
    "no user namespaces": (None, True),
    "abi 4, no user namespaces": (4, True),
    "abi 1, no user namespaces": (1, True),
}


def start_at(sandboxed: Callable[..., Daemon], level: str, extensions: dict[str, Any]) -> Daemon:
    abi, no_userns = LEVELS[level]
    env = {} if abi is None else {"MCP_SUPERVISOR_SANDBOX_ABI": str(abi)}
    return sandboxed({"extensions": extensions}, prefix=NO_USERNS if no_userns else None, env=env)


@pytest.mark.parametrize("level", list(LEVELS))
async def test_each_level_runs_confined_refuses_what_it_can_and_says_what_it_cannot(
    sandboxed: Callable[..., Daemon], abstract_listener: str, level: str
) -> None:
    abi, no_userns = LEVELS[level]
    effective = 7 if abi is None else abi  # this kernel's
    extensions = {
        "confined": extension_settings("hostile.py"),
        "outbound": extension_settings("hostile.py", sandbox={"network": "outbound"}),
        "sibling": extension_settings("quick.py"),
    }
    daemon = start_at(sandboxed, level, extensions)
    records = daemon.wait_running(*extensions)
    record = records["confined"]["sandbox"]
    assert record["confined"] == f"landlock {effective}, {'no ' if no_userns else ''}namespaces, seccomp"
    lacks = " ".join(record["lacks"])
    warned = daemon.find("sandbox.partial")
    assert bool(warned) == bool(record["lacks"]), warned

    always_refused = {
        "read ~/.ssh/id_ed25519": ("read", daemon.home / ".ssh" / "id_ed25519"),
        "write ~/.bashrc": ("write", daemon.home / ".bashrc"),
        "list the state directory": ("list", daemon.state),
        "read the daemon's config": ("read", daemon.config),
        "connect to the control socket": ("connect_unix", daemon.socket),
        "ptrace a sibling": ("ptrace", records["sibling"]["pid"]),
    }
    for what, (kind, target) in always_refused.items():
        assert attempt(daemon, "confined", kind, target).startswith("refused"), (level, what)

    scoped = effective >= 6
    assert attempt(daemon, "confined", "kill", daemon.pid).startswith("refused" if scoped else "ok")
    assert ("not scoped" in lacks) is not scoped
    abstract = attempt(daemon, "confined", "connect_abstract", abstract_listener)
    assert abstract.startswith("refused" if scoped or no_userns else "ok"), abstract
    binds = attempt(daemon, "outbound", "bind_tcp")
    assert binds.startswith("refused" if effective >= 4 else "ok"), binds
    outbound = daemon.status()["outbound"]["sandbox"]
    assert ("cannot refuse listening" in " ".join(outbound["lacks"])) is (effective < 4)
    assert ("no private root" in lacks) is no_userns
    assert (daemon.home / ".bashrc").read_text() == "# the user's\n"
    for call in ("unshare_user", "keyctl", "bpf", "userfaultfd"):  # the seccomp filter, at every level
        assert attempt(daemon, "confined", "syscall", call).startswith("refused: EPERM"), (level, call)


async def test_without_user_namespaces_network_none_and_require_full_refuse_to_start(
    sandboxed: Callable[..., Daemon],
) -> None:
    """Fail closed where asked: `network: none` cannot be enforced without a network namespace,
    and `require: full` names what is missing; each fails for good, alone."""
    extensions = {
        "offline": extension_settings("hostile.py", sandbox={"network": "none"}),
        "strict": extension_settings("hostile.py", sandbox={"require": "full"}),
        "best": extension_settings("hostile.py"),
    }
    daemon = start_at(sandboxed, "abi 4, no user namespaces", extensions)
    daemon.wait_running("best")
    offline, strict = daemon.wait_state("offline", "failed"), daemon.wait_state("strict", "failed")
    assert "network: none needs a network namespace" in offline["last_error"]
    assert "network: outbound" in offline["last_error"] and "sandbox: false" in offline["last_error"]
    assert strict["last_error"].startswith("sandbox require: full, and this host cannot enforce it all: ")
    assert "no private root" in strict["last_error"] and "not scoped" in strict["last_error"]
    assert offline["restarts"] == strict["restarts"] == 0 and offline["pid"] is None


def test_check_config_explain_says_the_level_and_what_is_not_enforced(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"extensions": {"fx": {"command": "/bin/true", "sandbox": {"network": "outbound"}}}}')
    explain = [*CLI, "check-config", str(config), "--explain", "fx"]
    done = subprocess.run(
        [*NO_USERNS, *explain],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MCP_SUPERVISOR_SANDBOX_ABI": "3"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "  confined by: landlock 3, no namespaces, seccomp" in done.stdout
    assert "  not enforced here: network outbound cannot refuse listening on TCP ports" in done.stdout
    assert "not scoped" in done.stdout


@pytest.mark.parametrize("level", list(LEVELS))
async def test_the_example_config_runs_at_each_level(sandboxed: Callable[..., Daemon], level: str) -> None:
    """configs/example.yaml as it is: both demo servers run confined and answer (the notes one
    writes its file) on an older kernel, and on a host without user namespaces."""
    abi, no_userns = LEVELS[level]
    env = {} if abi is None else {"MCP_SUPERVISOR_SANDBOX_ABI": str(abi)}
    daemon = sandboxed(ROOT / "configs" / "example.yaml", prefix=NO_USERNS if no_userns else None, env=env)
    records = daemon.wait_running("clock", "notes")
    shown = f"landlock {abi or 7}, {'no ' if no_userns else ''}namespaces, seccomp"
    assert records["clock"]["sandbox"]["confined"] == shown
    now = daemon.call("clock", "now", timezone="Europe/Paris")
    assert not now["isError"] and now["content"][0]["text"]
    added = daemon.call("notes", "add_note", text="confined")
    assert not added["isError"], added


def test_what_each_host_lacks_is_said_in_words() -> None:
    """The words status and the start warning use, per host and per extension."""
    assert Host(7, True, True).lacks("all") == [] and Host(6, True, True).lacks("outbound") == []
    ubuntu_24 = " ".join(Host(4, False, False).lacks("outbound"))
    assert "no private root" in ubuntu_24 and "not scoped" in ubuntu_24
    assert "cannot refuse listening" not in ubuntu_24
    ubuntu_22 = " ".join(Host(1, False, False).lacks("outbound"))
    assert "cannot refuse listening" in ubuntu_22 and "truncated" in ubuntu_22
    open_sockets = Host(6, False, False).lacks("all", seccomp=False)
    assert open_sockets == [
        "no private root and no seccomp filter: unix sockets are reachable by path (the daemon's "
        "control socket, an ssh agent, D-Bus)",
        "TMPDIR on disk and the host's /dev/shm (shared with the user's other processes) are neither "
        "sized (tmp_max) nor counted in memory_max",
    ]
    assert Host(6, False, False).unlimited() == ["pids_max is not enforced: no user namespace"]
    root = Host(7, True, True, root=True)  # not a lack of confinement: no warning, no require: full refusal
    assert root.lacks("all") == [] and root.unlimited() == [
        "pids_max is not enforced: root's processes are exempt from RLIMIT_NPROC, and no cgroup v1 "
        "pids hierarchy is here"
    ]
    assert Host(7, True, True, root=True, pids_cgroups=True).unlimited() == []  # a pids cgroup per run
    assert Host(6, False, False, root=True, pids_cgroups=True).unlimited() == []  # needs no namespace
    assert Host(7, True, True).unlimited() == []
    assert Host(0, True, True).lacks("all")[0] == "no Landlock: files are confined by the private root only"
    assert Host(0, False, False, failure="no seccomp").level() == "none"


def test_check_config_explain_asks_the_daemon_that_runs_it(daemons: Callable[..., Daemon]) -> None:
    """The daemon's environment decides what is hidden (a unit's STATE_DIRECTORY), not the shell's
    that asks: the running daemon explains; with none running, the shell's view, said as such."""
    extensions = {"fx": extension_settings("quick.py", sandbox={"read": ["${HERE}"]})}
    daemon = daemons(extensions, state=True, env={"HERE": "/tmp"}, end="exit 0")
    daemon.extra_env.pop("HERE")
    shell = {k: v for k, v in daemon.env.items() if k != "STATE_DIRECTORY"} | {"HERE": "/tmp"}
    explain = [*CLI, "check-config", str(daemon.config), "--explain", "fx"]
    running = subprocess.run(explain, capture_output=True, text=True, timeout=60, env=shell, check=True)
    assert f"as the daemon on {daemon.socket} confines it" in running.stdout
    assert f"hidden  {daemon.state}" in running.stdout  # its state, inside the /tmp it may read
    assert daemon.terminate() == 0
    alone = subprocess.run(explain, capture_output=True, text=True, timeout=60, env=shell, check=True)
    assert "no daemon runs it" in alone.stdout and f"hidden  {daemon.state}" not in alone.stdout
