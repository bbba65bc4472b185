"""Broken configs, table-driven: each one is exit 2 with lines that name the field (or the file and
line), and never a traceback. Most run through ``cli.main`` in-process; a handful through a real
``mcp-supervisor`` process, for ``check-config`` and for ``daemon``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor import cli
from tests.harness import CLI, zygote
from tests.harness.timing import patience

X = "extensions:\n  x:\n    command: x\n"  # an entry to add one broken line to (line 4)

# A header line ("PATH is not valid:") followed by indented "FIELD (line N): ..." lines, or one line
# naming the file: "PATH: ..." / "PATH (line N): ...".
_FIELD_LINE = re.compile(r"^  \S.*?( \(line \d+\))?: \S")


def _file(data: bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / "config.yaml"
        path.write_bytes(data)
        return path

    return make


def _yaml(text: str) -> Callable[[Path], Path]:
    return _file(text.encode())


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo.yaml")
    return tmp / "fifo.yaml"


def _cwd_is_a_file(tmp: Path) -> Path:
    (tmp / "a-file").write_text("")
    return _yaml(f"{X}    cwd: {tmp / 'a-file'}\n")(tmp)


# (id, how to make the file, what stderr must contain: the field and line, or the file and line)
CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    # unreadable files
    (
        "invalid-utf8",
        _file(b'extensions:\n  x: {command: "\xc3\x28"}\n'),
        "(line 2): not valid UTF-8 (byte 0xc3)",
    ),
    ("utf16", _file("extensions: {}\n".encode("utf-16")), "(line 1): not valid UTF-8 (byte 0xff)"),
    ("nul-byte", _file(b"extensions:\n  x: {command: x\x00}\n"), "(line 2): control character U+0000"),
    ("escape-char", _file(b"extensions: {}\n\n# \x1b[31m\n"), "(line 3): control character U+001B"),
    ("5000-brackets", _yaml("[" * 5000), "(line 1): nested deeper than 64 levels"),
    ("5000-braces", _yaml("x: " + "{a: " * 5000), "(line 1): nested deeper than 64 levels"),
    ("directory", lambda tmp: tmp, ": is a directory, not a config file"),
    ("dev-zero", lambda tmp: Path("/dev/zero"), "/dev/zero: is a device, not a regular file"),
    ("fifo", _fifo, "fifo.yaml: is a FIFO, not a regular file"),
    ("missing", lambda tmp: tmp / "nope.yaml", "nope.yaml: No such file or directory"),
    ("too-big", _file(b"#" * (1 << 20) + b"\n"), ": larger than 1048576 bytes"),
    # YAML syntax and construction
    ("unclosed-flow", _yaml("extensions: [\n"), "(line 2): "),
    ("unclosed-quote", _yaml('extensions:\n  x: {command: "x}\n'), "(line 3): "),
    ("tab-indent", _yaml("extensions:\n\tx: {command: x}\n"), "(line 2): found character '\\t'"),
    ("bad-indent", _yaml("extensions:\n  x:\n    command: x\n   args: []\n"), "(line 4): "),
    ("two-documents", _yaml("extensions: {}\n---\nextensions: {}\n"), "(line 2): but found another document"),
    ("python-tag", _yaml(f"{X}    args: [!!python/object/apply:os.system [id]]\n"), "(line 4): could not"),
    (
        "5000-digits",
        _yaml(f"{X}    max_restarts: {'1' * 5000}\n"),
        "(line 4): an integer of more than 100 digits",
    ),
    ("bad-date", _yaml(f"{X}    args: [2024-13-01]\n"), "(line 4): cannot read this value: month"),
    ("top-level-list", _yaml("- a\n- b\n"), "(line 1): the top level must be a mapping, not a list"),
    ("top-level-scalar", _yaml("hello\n"), "(line 1): the top level must be a mapping, not a str"),
    (
        "duplicate-extension",
        _yaml("extensions:\n  x: {command: a}\n  x: {command: b}\n"),
        "extensions.x (line 3)",
    ),
    # types
    (
        "command-int",
        _yaml("extensions:\n  x: {command: 5}\n"),
        "extensions.x.command (line 2): Input should be",
    ),
    ("command-list", _yaml("extensions:\n  x: {command: [a]}\n"), "extensions.x.command (line 2)"),
    ("command-empty", _yaml("extensions:\n  x: {command: ' '}\n"), "extensions.x.command (line 2)"),
    (
        "command-missing",
        _yaml("extensions:\n  x: {args: []}\n"),
        "extensions.x.command (line 2): Field required",
    ),
    ("args-not-list", _yaml(f"{X}    args: 5\n"), "extensions.x.args (line 4)"),
    ("env-list", _yaml(f"{X}    env: [A=1]\n"), "extensions.x.env (line 4)"),
    ("env-name-equals", _yaml(f"{X}    env: {{A=B: 1}}\n"), "extensions.x.env.A=B (line 4)"),
    ("env-name-empty", _yaml(f'{X}    env: {{"": 1}}\n'), "extensions.x.env.'' (line 4)"),
    (
        "nul-command",
        _yaml('extensions:\n  x: {command: "a\\0"}\n'),
        "extensions.x.command (line 2): must not",
    ),
    (
        "nul-arg",
        _yaml(f'{X}    args: [ok, "\\x00"]\n'),
        "extensions.x.args.1 (line 4): must not contain a NUL",
    ),
    (
        "nul-env-value",
        _yaml(f'{X}    env: {{A: "\\0"}}\n'),
        "extensions.x.env.A (line 4): must not contain a NUL",
    ),
    ("nul-env-name", _yaml(f'{X}    env: {{"A\\0": b}}\n'), "extensions.x.env.'A\\x00' (line 4): must not"),
    ("nul-cwd", _yaml(f'{X}    cwd: "/\\0"\n'), "extensions.x.cwd (line 4): must not contain a NUL"),
    ("surrogate", _yaml(f'{X}    args: ["\\ud800"]\n'), "extensions.x.args.0 (line 4): contains a character"),
    ("cwd-is-a-file", _cwd_is_a_file, "extensions.x.cwd (line 4): "),
    ("autostart-maybe", _yaml(f"{X}    autostart: maybe\n"), "extensions.x.autostart (line 4)"),
    ("disabled-maybe", _yaml(f"{X}    disabled: maybe\n"), "extensions.x (line 2): 'disabled' should be"),
    ("restart-enum", _yaml(f"{X}    restart: sometimes\n"), "extensions.x.restart (line 4)"),
    ("tools-not-list", _yaml(f"{X}    tools: {{allow: 5}}\n"), "extensions.x.tools.allow (line 4)"),
    # numbers
    (
        "backoff-max-inf",
        _yaml(f"{X}    backoff: {{max: .inf}}\n"),
        "extensions.x.backoff.max (line 4): Input should be a finite",
    ),
    (
        "stop-timeout-inf",
        _yaml(f"{X}    stop_timeout: .inf\n"),
        "extensions.x.stop_timeout (line 4): Input should be a finite",
    ),
    (
        "start-timeout-nan",
        _yaml(f"{X}    start_timeout: .nan\n"),
        "extensions.x.start_timeout (line 4): Input should be a finite",
    ),
    (
        "call-timeout-1e999",
        _yaml(f"{X}    call_timeout: 1e999\n"),
        "extensions.x.call_timeout (line 4): Input should be a finite",
    ),
    ("jitter-nan", _yaml(f"{X}    backoff: {{jitter: .NaN}}\n"), "extensions.x.backoff.jitter (line 4)"),
    ("shutdown-timeout-negative", _yaml("shutdown_timeout: -1\n"), "shutdown_timeout (line 1)"),
    ("start-timeout-zero", _yaml(f"{X}    start_timeout: 0\n"), "extensions.x.start_timeout (line 4)"),
    ("stop-timeout-over-a-day", _yaml(f"{X}    stop_timeout: 86401\n"), "extensions.x.stop_timeout (line 4)"),
    ("max-restarts-negative", _yaml(f"{X}    max_restarts: -1\n"), "extensions.x.max_restarts (line 4)"),
    ("max-restarts-huge", _yaml(f"{X}    max_restarts: {10**30}\n"), "extensions.x.max_restarts (line 4)"),
    (
        "max-message-bytes-small",
        _yaml(f"{X}    max_message_bytes: 10\n"),
        "extensions.x.max_message_bytes (line 4)",
    ),
    ("log-lines-zero", _yaml(f"{X}    log_lines: 0\n"), "extensions.x.log_lines (line 4)"),
    ("spool-total-zero", _yaml("spool: {max_total_bytes: 0}\n"), "spool.max_total_bytes (line 1)"),
    ("http-port", _yaml("gateway: {http: {port: 70000}}\n"), "gateway.http.port (line 1)"),
    # structure and names
    (
        "unknown-key",
        _yaml(f"{X}    comand: y\n"),
        "extensions.x.comand (line 4): Extra inputs are not permitted",
    ),
    ("unknown-top-level", _yaml("extension: {}\n"), "extension (line 1): Extra inputs are not permitted"),
    ("extensions-list", _yaml("extensions: [a, b]\n"), "extensions (line 1)"),
    ("bad-name", _yaml("extensions:\n  a b: {command: x}\n"), "extensions.a b (line 2): invalid name"),
    ("bad-prefix", _yaml(f"{X}    prefix: a__b\n"), "extensions.x.prefix (line 4): invalid name"),
    (
        "plain-http",
        _yaml("extensions:\n  x: {url: 'http://h/mcp'}\n"),
        "extensions.x (line 2): 'http://h/mcp' is plain",
    ),
    (
        "url-and-command",
        _yaml("extensions:\n  x: {url: 'https://h/', command: x}\n"),
        "extensions.x (line 2): 'command' is for stdio",
    ),
    (
        "url-credentials",
        _yaml("extensions:\n  x: {url: 'https://u:p@h/'}\n"),
        "extensions.x.url (line 2): the URL holds credentials",
    ),
    ("both-keys", _yaml("extensions: {}\nmcpServers: {}\n"), "mcpServers (line 2): give 'extensions' or"),
    (
        "unset-variable",
        _yaml("extensions:\n  x: {command: '${NOPE_NOT_SET}'}\n"),
        "extensions.x.command (line 2)",
    ),
    (
        "malformed-variable",
        _yaml("extensions:\n  x: {command: '${'}\n"),
        "extensions.x.command (line 2): malformed",
    ),
    (
        "token-off-loopback",
        _yaml("gateway: {http: {enabled: true, host: 0.0.0.0}}\n"),
        "gateway.http (line 1)",
    ),
    ("socket-too-long", _yaml(f"socket: /{'s' * 110}/c.sock\n"), "socket (line 1): '/sss"),
    ("gateway-socket-too-long", _yaml(f"socket: /{'d' * 99}/c\n"), "mcp.sock' is over the 107 bytes"),
]


def check(result_code: int, stderr: str, expected: str) -> None:
    """Exit 2, no traceback, the expected text, and every line names a field or the file."""
    assert result_code == 2, stderr
    assert "Traceback" not in stderr
    assert expected in stderr, stderr
    first, *rest = stderr.rstrip("\n").split("\n")
    assert first.startswith("mcp-supervisor: ")
    if rest:
        assert first.endswith(" is not valid:"), first
        for line in rest:
            assert _FIELD_LINE.match(line), line
    assert len(stderr) < 10_000


def test_the_table_has_over_40_cases() -> None:
    assert len(CASES) >= 40
    assert len({name for name, _, _ in CASES}) == len(CASES)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("make", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_config_in_process(
    make: Callable[[Path], Path],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`check-config` exits 2 with the problem named, never a traceback."""
    for key in [key for key in os.environ if key.startswith("MCP_SUPERVISOR_")]:
        monkeypatch.delenv(key)
    code = cli.main(["check-config", str(make(tmp_path))])
    check(code, capsys.readouterr().err, expected)


CHECKED = ["invalid-utf8", "nul-byte", "5000-brackets", "fifo", "dev-zero", "5000-digits", "backoff-max-inf"]
STARTED = ["invalid-utf8", "5000-brackets", "fifo", "dev-zero"]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SUPERVISOR_")}
    return zygote.run(args, timeout=patience(60), env=env)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("command", "name"), [("check-config", name) for name in CHECKED] + [("daemon", name) for name in STARTED]
)
def test_a_real_process(name: str, command: str, short_tmp: Path) -> None:
    """The CLI as a process (forked as the suite's daemons are), for check-config and for a daemon
    start: exit 2, never a hang."""
    make, expected = {c[0]: c[1:] for c in CASES}[name]
    path = str(make(short_tmp))
    args = [*CLI, "check-config", path] if command == "check-config" else [*CLI, "daemon", "-c", path]
    result = _run(args)
    check(result.returncode, result.stderr, expected)
    assert not (short_tmp / "control.sock").exists()


@pytest.mark.timeout(30)
def test_no_permission(short_tmp: Path) -> None:
    """A file the user may not read: exit 2, "Permission denied" (as root: without CAP_DAC_*)."""
    path = short_tmp / "config.yaml"
    path.write_text("extensions: {}\n")
    path.chmod(0)
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root reads any file, and setpriv is not here to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    result = _run([*prefix, *CLI, "check-config", str(path)])
    check(result.returncode, result.stderr, f"{path}: Permission denied")
