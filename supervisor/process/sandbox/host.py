"""What this host can enforce: the sandbox's layers, found once by running the launcher.

The sandbox is best effort: each layer the host has is applied by itself (see
:mod:`.launch`), and what it lacks is said in plain words, at the daemon's start, in
``status``/``health`` and in ``check-config --explain``. ``require: full`` turns a lack into a
refusal to start; ``network: none`` without a network namespace is always refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from supervisor.process.sandbox import pidsgroup
from supervisor.process.sandbox.landlock import SCOPE_ABI, TCP_ABI

__all__ = ("Host", "probe_host", "probed")

LAUNCHER = Path(__file__).with_name("launch.py")
_PROBE_TIMEOUT = 20.0
_probed: dict[int | None, Host] = {}
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Host:
    """The layers this host offers the launcher.

    *landlock*: the Landlock ABI used (0: none); *namespaces*: user and mount namespaces (the
    private root); *network_namespace*: a network namespace besides; *failure*: why the
    launcher cannot confine anything here (then nothing runs confined), else None; *refused*:
    why namespaces are not there, as the kernel said; *root*: the daemon runs as root, whose
    processes ``RLIMIT_NPROC`` does not bind, so ``pids_max`` is a pids cgroup per run where
    *pids_cgroups* says the host has a hierarchy for them (:mod:`.pidsgroup`).
    """

    landlock: int
    namespaces: bool
    network_namespace: bool
    failure: str | None = None
    refused: str | None = None
    root: bool = False
    pids_cgroups: bool = False

    @property
    def tasks_limited(self) -> bool:
        """Whether ``pids_max`` binds: ``RLIMIT_NPROC`` counted in the run's own user namespace,
        or (root) a pids cgroup per run."""
        return self.pids_cgroups if self.root else self.namespaces

    def level(self) -> str:
        """``landlock 6, namespaces, seccomp``: the layers, as status shows them."""
        if self.failure is not None:
            return "none"
        files = f"landlock {self.landlock}" if self.landlock else "no landlock"
        return f"{files}, {'namespaces' if self.namespaces else 'no namespaces'}, seccomp"

    def unlimited(self) -> list[str]:
        """The resource limits an extension's config may set that do not bind here, in plain
        words. Not a lack of confinement: no ``sandbox.partial`` warning, no refusal under
        ``require: full``."""
        if self.tasks_limited:
            return []
        why = (
            "root's processes are exempt from RLIMIT_NPROC, and no cgroup v1 pids hierarchy is here"
            if self.root
            else "no user namespace"
        )
        return [f"pids_max is not enforced: {why}"]

    def lacks(self, network: str, *, seccomp: bool = True) -> list[str]:
        """What an extension with *network* (and *seccomp* on or off) is not confined in here, in
        plain words."""
        lacking: list[str] = []
        if not self.namespaces and not seccomp:
            lacking.append(
                "no private root and no seccomp filter: unix sockets are reachable by path (the "
                "daemon's control socket, an ssh agent, D-Bus)"
            )
        elif not self.namespaces:
            lacking.append(
                "no private root (user namespaces refused): hidden paths are cut out of the grants by "
                "Landlock instead, and unix sockets are refused altogether"
                if self.landlock
                else "no private root (user namespaces refused)"
            )
        if not self.namespaces:
            lacking.append(
                "TMPDIR on disk and the host's /dev/shm (shared with the user's other processes) are "
                "neither sized (tmp_max) nor counted in memory_max"
            )
        if not self.landlock:
            lacking.append(
                "no Landlock: files are confined by the private root only"
                if self.namespaces
                else "no Landlock: files are not confined, it reads and writes what the daemon's user can"
            )
        elif self.landlock < 3 and not self.namespaces:
            lacking.append("files it may only read can still be truncated (Landlock ABI 3)")
        if network == "outbound" and self.landlock < TCP_ABI:
            lacking.append(f"network outbound cannot refuse listening on TCP ports (Landlock ABI {TCP_ABI})")
        if self.landlock < SCOPE_ABI:
            lacking.append(
                "signals and abstract unix sockets not scoped: it can signal the user's other processes, "
                f"the daemon included (Landlock ABI {SCOPE_ABI})"
            )
        if not self.landlock:
            lacking.append("ptrace of the user's other processes is left to the kernel's ptrace_scope")
        return lacking


def probe_host(max_abi: int | None = None) -> Host:
    """The layers of this host, capped at Landlock ABI *max_abi*. Runs the launcher up to three
    times, once per process and cap. Blocking."""
    with _lock:
        if max_abi not in _probed:
            _probed[max_abi] = _probe(max_abi)
        return _probed[max_abi]


def probed(max_abi: int | None = None) -> Host | None:
    """What :func:`probe_host` found, if it ran already; never blocks."""
    return _probed.get(max_abi)


def _probe(max_abi: int | None) -> Host:
    cap = [] if max_abi is None else ["-a", str(max_abi)]
    refused: str | None = None
    for network, namespaces in (("none", True), ("all", True), ("all", False)):
        found, why = _run([*cap, "-n", network, *([] if namespaces else ["-N"])])
        if found is not None:
            root = os.getuid() == 0
            pids_cgroups = root and pidsgroup.available()
            return Host(
                found, namespaces, network == "none", refused=refused, root=root, pids_cgroups=pids_cgroups
            )
        refused = refused or why
    return Host(0, False, False, failure=refused)


def _run(options: list[str]) -> tuple[int | None, str]:
    """The launcher's probe with *options*: (the Landlock ABI it used, "") or (None, why not)."""
    with tempfile.TemporaryDirectory(prefix="mcps-probe-") as staging:
        argv = [sys.executable, "-I", "-S", str(LAUNCHER), *options, "-s", staging, "-r", "/usr", "--probe"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=_PROBE_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"the launcher did not run ({exc})"
    if done.returncode == 0:
        try:
            return int(json.loads(done.stdout)["landlock"]), ""
        except (ValueError, KeyError, TypeError):
            return None, "the launcher's probe said something else"
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    why = lines[-1].removeprefix("mcp-supervisor sandbox: ") if lines else f"exit code {done.returncode}"
    return None, why.removeprefix("cannot confine the extension: ")
