"""systemd/mcp-supervisor.service: systemd-analyze accepts it, and it keeps the DESIGN contract."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.settings import Settings
from supervisor.daemon import fdlimits
from tests.harness import ROOT

SYSTEMD = ROOT / "systemd"
UNIT = SYSTEMD / "mcp-supervisor.service"
README = SYSTEMD / "README.md"

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections to keys to every value given, in order (units may repeat a key)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):  # continues on the next line
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, f"not a setting: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def timespan(value: str) -> float:
    """Seconds in a systemd time span such as ``45``, ``45s`` or ``1min 30s``."""
    units = {"": 1.0, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == value.replace(" ", ""), value
    return sum(float(number) * units[unit] for number, unit in parts)


def find_systemd_analyze() -> str | None:
    found = shutil.which("systemd-analyze")
    if found:
        return found
    fallback = Path("/usr/bin/systemd-analyze")
    return str(fallback) if os.access(fallback, os.X_OK) else None


def install_systemd() -> str | None:
    """Try to install systemd-analyze with apt-get; the reason it cannot be had, or None."""
    apt = shutil.which("apt-get")
    if os.geteuid() != 0 or apt is None:
        return "systemd-analyze is not installed, and installing it needs root and apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", "systemd"]
    try:
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # maybe only the package lists are missing or stale
            subprocess.run([apt, "update"], env=env, capture_output=True, timeout=300)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemd-analyze is not installed, and apt-get could not install it: {exc}"
    # Judge by the binary, not the exit code: in a container systemd's postinst may fail after
    # unpacking, and systemd-analyze is then usable all the same.
    if find_systemd_analyze() is None:
        return f"systemd-analyze is not installed; apt-get install systemd said: {done.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    found = find_systemd_analyze()
    if found is None:
        reason = install_systemd()
        found = find_systemd_analyze()
        if found is None:
            pytest.skip(reason or "systemd-analyze is not available")
    return found


@pytest.fixture
def our_binary() -> str:
    """The mcp-supervisor console script of the environment running the tests."""
    beside = Path(sys.executable).parent / "mcp-supervisor"
    found = str(beside) if beside.exists() else shutil.which("mcp-supervisor")
    assert found, "mcp-supervisor is not installed in this environment"
    return found


@pytest.fixture
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


def service(unit: Unit, key: str) -> list[str]:
    return unit["Service"].get(key, [])


def verify(analyze: str, unit_file: Path, *options: str, env: dict[str, str] | None = None) -> None:
    """Run ``systemd-analyze verify``; fail on a non-zero exit or any complaint naming our unit."""
    done = subprocess.run(
        [analyze, *options, "verify", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    ours = [line for line in done.stderr.splitlines() if unit_file.name in line]
    assert done.returncode == 0, done.stderr
    assert ours == [], "\n".join(ours)


def user_unit_from_readme() -> str:
    """The user-unit example in systemd/README.md: the ini block of "As a user unit"."""
    section = README.read_text().split("## As a user unit", 1)[1]
    match = re.search(r"```ini\n(.*?)```", section, re.S)
    assert match, "systemd/README.md has no user unit example"
    return match.group(1)


def with_exec_start(text: str, binary: str) -> str:
    """*text* with ExecStart's program replaced by *binary*: verify checks that it exists."""
    return re.sub(r"^ExecStart=\S+", lambda _: f"ExecStart={binary}", text, count=1, flags=re.M)


@pytest.mark.timeout(900)  # the first use may install systemd
class TestVerify:
    def test_system_unit(self, systemd_analyze: str, our_binary: str, short_tmp: Path) -> None:
        """systemd-analyze verify accepts the unit, without a single warning about it."""
        copy = short_tmp / UNIT.name
        copy.write_text(with_exec_start(UNIT.read_text(), our_binary))
        verify(systemd_analyze, copy)

    def test_verify_catches_mistakes(self, systemd_analyze: str, our_binary: str, short_tmp: Path) -> None:
        """The check above has teeth: a misspelt key is reported as a warning naming the unit."""
        copy = short_tmp / UNIT.name
        copy.write_text(with_exec_start(UNIT.read_text(), our_binary).replace("UMask=", "UMsk="))
        with pytest.raises(AssertionError, match="Unknown key"):
            verify(systemd_analyze, copy)

    def test_the_commented_credential_example_verifies(
        self, systemd_analyze: str, our_binary: str, short_tmp: Path
    ) -> None:
        """The unit's commented LoadCredential= line, uncommented, is a valid setting."""
        text = with_exec_start(UNIT.read_text(), our_binary)
        example = re.search(r"^#\s+(LoadCredential=\S+)$", text, re.M)
        assert example, "the unit has no commented LoadCredential= example"
        copy = short_tmp / UNIT.name
        copy.write_text(text.replace(example.group(0), example.group(1)))
        verify(systemd_analyze, copy)

    def test_user_unit_in_readme(self, systemd_analyze: str, our_binary: str, short_tmp: Path) -> None:
        """The user-unit example in the README passes systemd-analyze --user verify."""
        copy = short_tmp / UNIT.name
        copy.write_text(with_exec_start(user_unit_from_readme(), our_binary))
        runtime = short_tmp / "runtime"
        runtime.mkdir(mode=0o700)
        verify(systemd_analyze, copy, "--user", env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})


class TestContract:
    def test_notify_and_reload(self, unit: Unit) -> None:
        """Type=notify with only the main process notifying, and reload by SIGHUP to the main pid."""
        assert service(unit, "Type") == ["notify"]
        assert service(unit, "NotifyAccess") == ["main"]
        assert service(unit, "ExecReload") == ["/bin/kill -HUP $MAINPID"]

    def test_exec_start_runs_the_daemon(self, unit: Unit) -> None:
        """ExecStart runs `mcp-supervisor daemon -c /etc/mcp-supervisor/config.yaml`."""
        (exec_start,) = service(unit, "ExecStart")
        assert shlex.split(exec_start) == [
            "/usr/local/bin/mcp-supervisor",
            "daemon",
            "-c",
            "/etc/mcp-supervisor/config.yaml",
        ]

    def test_directories(self, unit: Unit) -> None:
        """Sockets in a private RuntimeDirectory, the spool under CacheDirectory (listed first), catalogs in
        StateDirectory."""
        assert service(unit, "RuntimeDirectory") == ["mcp-supervisor"]
        assert service(unit, "RuntimeDirectoryMode") == ["0700"]
        (cache,) = service(unit, "CacheDirectory")
        assert cache.split()[0] == "mcp-supervisor"  # $CACHE_DIRECTORY's first entry holds the spool
        assert service(unit, "StateDirectory") == ["mcp-supervisor"]  # saved catalogs of on_demand extensions
        assert service(unit, "StateDirectoryMode") == ["0700"]

    def test_lifecycle(self, unit: Unit) -> None:
        """Restarted on failure, watched by the watchdog, and its whole cgroup killed as a backstop."""
        assert service(unit, "Restart") == ["on-failure"]
        assert service(unit, "KillMode") == ["control-group"]
        (watchdog,) = service(unit, "WatchdogSec")
        assert timespan(watchdog) > 0
        assert "PYTHONUNBUFFERED=1" in service(unit, "Environment")
        assert unit["Install"]["WantedBy"] == ["multi-user.target"]

    def test_cgroup_is_delegated_and_writable(self, unit: Unit) -> None:
        """Delegate=yes, and a writable cgroup file system: each extension gets a cgroup of its own."""
        assert service(unit, "Delegate") == ["yes"]
        assert service(unit, "ProtectControlGroups") in ([], ["no"])
        assert "MCP_SUPERVISOR_CONTAINMENT=cgroup" in service(unit, "Environment")

    def test_stop_timeout_exceeds_shutdown_timeout(self, unit: Unit) -> None:
        """systemd waits longer than the daemon's default shutdown_timeout before it SIGKILLs."""
        (stop,) = service(unit, "TimeoutStopSec")
        assert timespan(stop) > Settings.model_fields["shutdown_timeout"].default

    def test_file_descriptors_for_every_listener(self, unit: Unit) -> None:
        """LimitNOFILE leaves every listener its full connection cap beside a reserve for children."""
        (limit,) = service(unit, "LimitNOFILE")
        fds = fdlimits.plan(int(limit), children=200)
        assert (fds.control, fds.unix, fds.http) == (64, 256, 256)

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "read-only"),
            ("PrivateTmp", "yes"),
            ("UMask", "0077"),
            ("CapabilityBoundingSet", "CAP_SETFCAP"),  # the sandbox maps root into a user namespace
            ("RestrictNamespaces", "user mnt net"),  # the sandbox's, and no other kind
            ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
        ],
    )
    def test_hardening(self, unit: Unit, key: str, value: str) -> None:
        """The hardening the contract names is set exactly as intended."""
        assert service(unit, key) == [value]

    def test_nothing_that_breaks_jits(self, unit: Unit) -> None:
        """MemoryDenyWriteExecute stays off: node (npx servers) and other JITs need W+X memory."""
        assert service(unit, "MemoryDenyWriteExecute") == []


class TestParser:
    def test_duplicates_comments_and_continuations(self) -> None:
        """Repeated keys keep every value, comments are skipped, backslash lines are joined."""
        text = "# c\n[Service]\n; c\nEnvironment=A=1\nEnvironment=B=2 \\\n  C=3\nType=notify\n"
        assert parse_unit(text) == {"Service": {"Environment": ["A=1", "B=2  C=3"], "Type": ["notify"]}}

    @pytest.mark.parametrize(("text", "seconds"), [("45", 45), ("45s", 45), ("1min 30s", 90), ("500ms", 0.5)])
    def test_timespan(self, text: str, seconds: float) -> None:
        """Time spans are read the way systemd reads them."""
        assert timespan(text) == seconds
