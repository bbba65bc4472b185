"""The exec launcher and its two layers, each on its own: real processes, the real kernel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.process import sandbox
from supervisor.process.sandbox import landlock, launch

LAUNCH = [sys.executable, "-I", "-S", str(sandbox.LAUNCHER)]
# As the daemon gives them: real paths, and the symlinks that lead there (/bin -> usr/bin).
SYSTEM = [
    arg
    for path in ("/usr", "/bin", "/lib", "/lib64", "/etc")
    for arg in (["-r", os.path.realpath(path)] + (["-l", path] if os.path.islink(path) else []))
]
PROBE = "from supervisor.process import sandbox as s\nh = s.probe_host()\nprint({})"  # what the host has


def run(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **kwargs)  # type: ignore[call-overload]


class TestLandlock:
    def test_a_ruleset_alone_refuses_what_it_does_not_grant_even_to_root(self, tmp_path: Path) -> None:
        """Without the private root: a file outside the rules is EACCES, one inside is read."""
        (tmp_path / "granted").mkdir()
        (tmp_path / "granted" / "a").write_text("a")
        (tmp_path / "secret").write_text("s")
        script = textwrap.dedent(f"""
            import sys
            from supervisor.process.sandbox import landlock
            rules = landlock.Ruleset("all")
            for path in sys.path + ["/usr", "/lib", "/lib64", "/etc", "{tmp_path}/granted"]:
                try:
                    rules.allow(path, landlock.READ)
                except FileNotFoundError:
                    pass
            rules.restrict_self()
            print(open("{tmp_path}/granted/a").read())
            try:
                open("{tmp_path}/secret")
            except PermissionError as exc:
                print("refused", exc.errno)
        """)
        done = run(sys.executable, "-c", script)
        assert done.stdout.split() == ["a", "refused", "13"], done.stderr

    def test_this_kernel_has_every_layer_the_sandbox_asks_for(self) -> None:
        """The suite's own machine: older kernels are played by capping the ABI (-a N)."""
        assert landlock.abi() >= landlock.FULL_ABI


class TestLauncher:
    def test_it_becomes_the_command(self, tmp_path: Path) -> None:
        """exec, not a child: the command runs with the launcher's pid, so nothing is left behind."""
        staging = tmp_path / "r"
        staging.mkdir()
        proc = subprocess.Popen(
            [*LAUNCH, "-n", "all", "-s", str(staging), *SYSTEM, "--", "/bin/sh", "-c", "echo $$"],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = proc.communicate(timeout=30)
        assert int(out) == proc.pid

    def test_a_bad_command_line_never_runs_the_command(self, tmp_path: Path) -> None:
        """An unknown option: exit EXIT_SANDBOX with one line saying so, and no command run."""
        marker = tmp_path / "ran"
        done = run(*LAUNCH, "-q", "x", "-s", str(tmp_path), "--", "/bin/touch", str(marker))
        assert done.returncode == launch.EXIT_SANDBOX
        assert done.stderr.startswith("mcp-supervisor sandbox: cannot confine the extension")
        assert not marker.exists()

    def test_what_is_not_granted_is_not_there_and_grants_are_as_given(self, tmp_path: Path) -> None:
        """Read grants are read-only, write grants writable, the rest missing; no capability."""
        staging, readable, writable, other = (tmp_path / n for n in ("r", "ro", "rw", "other"))
        for directory in (staging, readable, writable, other):
            directory.mkdir()
        script = (
            f"cat /proc/self/status | grep -E '^(CapEff|NoNewPrivs)'; ls {readable}; touch {writable}/x && "
            f"echo wrote; touch {readable}/x || echo read-only; ls {other} || echo missing"
        )
        done = run(
            *LAUNCH, "-n", "all", "-s", str(staging), *SYSTEM, "-r", str(readable), "-w", str(writable),
            "--", "/bin/sh", "-c", script,
        )  # fmt: skip
        assert done.stdout.split() == [
            "CapEff:",
            "0" * 16,
            "NoNewPrivs:",
            "1",
            "wrote",
            "read-only",
            "missing",
        ]
        assert "Read-only file system" in done.stderr and "No such file" in done.stderr
        assert (writable / "x").exists()

    def test_a_hidden_path_reached_through_a_symlink_covers_no_grant(self, tmp_path: Path) -> None:
        """As the daemon's private caches under an XDG_CACHE_HOME reached through a symlink in a
        read grant: the daemon hides them by both names and grants one by its real path, deeper.
        Hiding by the linked name used to mount over the host's directory, so the grant's source
        was gone and the extension's own cache read-only (every second start of a uvx server)."""
        staging, project, real = tmp_path / "r", tmp_path / "project", tmp_path / "disk" / "a" / "b" / "cache"
        private, secret = real / "extensions" / "mine", real / "extensions" / "theirs"
        for directory in (staging, project, private, secret):
            directory.mkdir(parents=True)
        (secret / "key").write_text("theirs")
        (project / "cache").symlink_to(real)
        linked = project / "cache" / "extensions"
        script = f"touch {linked}/mine/x && echo wrote; cat {linked}/theirs/key || echo hidden"
        done = run(
            *LAUNCH, "-n", "all", "-s", str(staging), *SYSTEM, "-r", str(project), "-w", str(private),
            "-x", str(linked), "-x", str(real / "extensions"), "-l", str(linked / "mine"),
            "--", "/bin/sh", "-c", script,
        )  # fmt: skip
        assert done.stdout.split() == ["wrote", "hidden"], done.stderr
        assert (private / "x").exists()

    def test_devices_are_the_harmless_ones_and_missing_grants_are_skipped(self, tmp_path: Path) -> None:
        """/dev/null works, a disk is not there; a granted path that does not exist is no error."""
        staging = tmp_path / "r"
        staging.mkdir()
        disk = next((d for d in ("/dev/vda", "/dev/sda", "/dev/nvme0n1") if os.path.exists(d)), "/dev/vda")
        script = f"echo x > /dev/null && echo null-ok; test -e {disk} || echo no-disk"
        done = run(
            *LAUNCH, "-n", "all", "-s", str(staging), *SYSTEM, "-r", str(tmp_path / "not-yet"),
            "--", "/bin/sh", "-c", script,
        )  # fmt: skip
        assert done.stdout.split() == ["null-ok", "no-disk"], done.stderr


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
class TestKernelWithout:
    def test_no_network_namespace_makes_network_none_fail_with_the_way_out(self, tmp_path: Path) -> None:
        """Where network namespaces cannot be made, the probe says so; the daemon turns it into a
        permanent error naming `network: outbound` and `sandbox: false` (see test_sandbox)."""
        limit = 'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"'  # in a user namespace of its own
        probe = PROBE.format("h.namespaces, h.network_namespace, h.refused")
        done = run("unshare", "-U", "-r", "sh", "-c", limit, "sh", sys.executable, "-c", probe)
        namespaces, network, refused = done.stdout.strip().split(" ", 2)
        assert (namespaces, network) == ("True", "False"), done.stderr
        assert "cannot create user, mount and network namespaces" in refused


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
class TestCredentials:
    """Who the daemon runs as: a regular user, root as the systemd unit has it, root bare."""

    PROBE = PROBE.format("h.namespaces, h.failure, h.refused")

    @pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs a system Python")
    def test_a_regular_user_is_confined_without_any_privilege(self, short_tmp: Path) -> None:
        """uid 65534, no capability: the launcher still makes the private root and the domain."""
        short_tmp.chmod(0o755)  # pytest's own tmp_path is in a root-only directory
        work = short_tmp / "work"
        (work / "r").mkdir(parents=True)
        os.chown(work, 65534, 65534)
        os.chown(work / "r", 65534, 65534)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        script = f"id -u; touch {work}/x && echo wrote; ls /root || echo no-root"
        done = run(
            *nobody, "/usr/bin/python3", "-I", "-S", str(sandbox.LAUNCHER), "-n", "none",
            "-s", str(work / "r"), *SYSTEM, "-w", str(work), "--", "/bin/sh", "-c", script,
        )  # fmt: skip
        assert done.stdout.split() == ["65534", "wrote", "no-root"], done.stderr

    def test_root_with_only_cap_setfcap_as_in_the_systemd_unit(self) -> None:
        """CapabilityBoundingSet=CAP_SETFCAP: enough to map root into the user namespace."""
        unit = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all,+setfcap", "--"]
        done = run(*unit, sys.executable, "-c", self.PROBE)
        assert done.stdout.strip() == "True None None", done.stderr

    def test_root_without_any_capability_is_told_what_is_missing(self) -> None:
        """It cannot map itself into a user namespace: confined without namespaces, and told why."""
        bare = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        done = run(*bare, sys.executable, "-c", self.PROBE)
        assert done.stdout.startswith("False None "), done.stderr
        assert "root without CAP_SETFCAP cannot map itself into a user namespace" in done.stdout
