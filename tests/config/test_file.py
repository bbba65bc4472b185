"""Tests for the config's bounds: the file read, YAML limits, finite and bounded numbers, strict types."""

from __future__ import annotations

import os
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest

from supervisor.config import file as configfile
from supervisor.config.settings import ConfigError, StdioConfig, load

SOCKET = {"MCP_SUPERVISOR_SOCKET": "/run/test/control.sock"}


def errors_of(path: Path, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        load(path, environ=SOCKET if environ is None else environ)
    return info.value.errors


def one_error(path: Path) -> str:
    errors = errors_of(path)
    assert len(errors) == 1, errors
    return errors[0]


@pytest.fixture
def write(tmp_path: Path):
    def write(text: str | bytes, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(textwrap.dedent(text))
        return path

    return write


def extension(write, **fields: str) -> Path:
    """A file with one extension `x` whose entry is `command: x` plus *fields* (YAML flow values)."""
    entry = ", ".join(f"{key}: {value}" for key, value in {"command": "x", **fields}.items())
    return write(f"extensions:\n  x: {{{entry}}}\n")


class TestTheFile:
    def test_a_file_at_the_size_bound_is_read(self, write) -> None:
        """A file of exactly MAX_BYTES is accepted; padding with comments keeps it valid."""
        body = b"extensions: {x: {command: x}}\n"
        path = write(body + b"#" * (configfile.MAX_BYTES - len(body) - 1) + b"\n")
        assert os.path.getsize(path) == configfile.MAX_BYTES
        assert list(load(path, environ=SOCKET).extensions) == ["x"]

    def test_one_byte_over_the_bound_is_an_error(self, write) -> None:
        """MAX_BYTES + 1 bytes is refused with the bound named."""
        path = write(b"#" * configfile.MAX_BYTES + b"\n")
        assert (
            one_error(path) == f"{path}: larger than {configfile.MAX_BYTES} bytes; a config file is a few KiB"
        )

    def test_a_huge_file_is_refused_without_reading_it(self, tmp_path: Path) -> None:
        """A 1 GiB file (sparse) is refused quickly, reading no more than the bound plus one byte."""
        path = tmp_path / "huge.yaml"
        with path.open("wb") as file:
            file.truncate(1 << 30)
        tracemalloc.start()
        try:
            started = time.monotonic()
            errors_of(path)
            elapsed = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * configfile.MAX_BYTES, peak
        assert elapsed < 2.0

    @pytest.mark.timeout(10)
    def test_a_fifo_is_refused_without_blocking(self, tmp_path: Path) -> None:
        """A FIFO with no writer would block open() and read(): it is refused at once."""
        path = tmp_path / "fifo.yaml"
        os.mkfifo(path)
        assert one_error(path) == f"{path}: is a FIFO, not a regular file"

    def test_a_device_is_refused(self) -> None:
        """/dev/zero never ends: it is refused before it is opened."""
        assert one_error(Path("/dev/zero")) == "/dev/zero: is a device, not a regular file"

    def test_a_directory_is_refused(self, tmp_path: Path) -> None:
        assert one_error(tmp_path) == f"{tmp_path}: is a directory, not a config file"

    def test_a_symlink_to_a_regular_file_is_fine(self, write, tmp_path: Path) -> None:
        target = write("extensions: {x: {command: x}}\n")
        (tmp_path / "link.yaml").symlink_to(target)
        assert list(load(tmp_path / "link.yaml", environ=SOCKET).extensions) == ["x"]

    def test_invalid_utf8_names_its_line(self, write) -> None:
        path = write(b'extensions:\n  x: {command: "\xff"}\n')
        assert one_error(path) == f"{path} (line 2): not valid UTF-8 (byte 0xff); save the file as UTF-8"

    def test_a_nul_byte_names_its_line(self, write) -> None:
        path = write(b'extensions:\n\n  x: {command: "a\x00"}\n')
        assert one_error(path) == f"{path} (line 3): control character U+0000 is not allowed"

    def test_a_byte_order_mark_is_accepted(self, write) -> None:
        path = write(b"\xef\xbb\xbfextensions: {x: {command: x}}\n")
        assert list(load(path, environ=SOCKET).extensions) == ["x"]


class TestYamlBounds:
    def test_nesting_up_to_the_bound_parses(self, write) -> None:
        """64 levels parse (and fail validation as a field error, not a parse error)."""
        path = write("extensions: {x: {command: x, args: " + "[" * 61 + "]" * 61 + "}}\n")
        (error,) = errors_of(path)
        assert error.startswith("extensions.x.args.0 (line 1): ")

    def test_deeper_nesting_is_an_error(self, write) -> None:
        """5,000 `[` used to end in RecursionError; now it is one line naming the bound."""
        path = write("[" * 5000 + "\n")
        assert one_error(path) == f"{path} (line 1): nested deeper than 64 levels"

    def test_aliases_nested_past_the_bound_are_an_error_not_a_crash(self, write) -> None:
        """A chain of aliases nests nodes deeper than the text does: still a clean error."""
        lines = ["a0: &a0 {k: 1}", *(f"a{i}: &a{i} {{k: *a{i - 1}}}" for i in range(1, 3000))]
        errors = errors_of(write("\n".join(lines) + "\n"))
        assert all("Extra inputs are not permitted" in e or "nested too deeply" in e for e in errors)

    def test_a_100_digit_integer_is_a_range_error(self, write) -> None:
        (error,) = errors_of(extension(write, max_restarts="9" * 100))
        assert error == "extensions.x.max_restarts (line 2): Input should be less than or equal to 1000000"

    def test_a_5000_digit_integer_is_a_clean_error(self, write) -> None:
        """Python refuses int() of over 4,300 digits with a ValueError: it must not escape."""
        path = extension(write, max_restarts="1" * 5000)
        assert one_error(path) == f"{path} (line 2): an integer of more than 100 digits"

    @pytest.mark.parametrize("value", ["2024-13-01", "!!int x", "!!float y", "!!timestamp 2024-02-30"])
    def test_a_value_yaml_cannot_construct_names_its_line(self, write, value: str) -> None:
        path = write(f"extensions:\n  x:\n    command: x\n    args: [{value}]\n")
        assert one_error(path).startswith(f"{path} (line 4): cannot read this value: ")

    def test_a_cyclic_alias_is_a_field_error(self, write) -> None:
        errors = errors_of(write("extensions: &a {x: *a}\n"))
        assert "extensions.x.command (line 1): Field required" in errors


class TestNumbers:
    @pytest.mark.parametrize(
        "field",
        [
            "start_timeout",
            "first_start_timeout",
            "stop_timeout",
            "call_timeout",
            "backoff.initial",
            "backoff.max",
            "backoff.multiplier",
            "backoff.jitter",
            "backoff.reset_after",
        ],
    )
    @pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999"])
    def test_every_float_is_finite(self, write, field: str, value: str) -> None:
        """.inf made `stop` never return and crashed the watcher; nan compares false with every bound."""
        outer, _, inner = field.rpartition(".")
        path = extension(write, **({outer: f"{{{inner}: {value}}}"} if outer else {field: value}))
        (error,) = errors_of(path)
        assert error == f"extensions.x.{field} (line 2): Input should be a finite number"

    def test_shutdown_timeout_is_finite(self, write) -> None:
        (error,) = errors_of(write("shutdown_timeout: .inf\n"))
        assert error == "shutdown_timeout (line 1): Input should be a finite number"

    def test_finite_from_the_environment_too(self, write) -> None:
        errors = errors_of(write("{}\n"), {**SOCKET, "MCP_SUPERVISOR_SHUTDOWN_TIMEOUT": "inf"})
        assert errors == ("shutdown_timeout: Input should be a finite number",)

    @pytest.mark.parametrize(
        ("field", "value", "bound"),
        [
            ("start_timeout", "86401", "86400"),
            ("first_start_timeout", "86401", "86400"),
            ("stop_timeout", "86401", "86400"),
            ("call_timeout", "86401", "86400"),
            ("max_restarts", "1000001", "1000000"),
            ("max_message_bytes", str(1024**3 + 1), str(1024**3)),
            ("log_lines", "100001", "100000"),
        ],
    )
    def test_upper_bounds(self, write, field: str, value: str, bound: str) -> None:
        (error,) = errors_of(extension(write, **{field: value}))
        assert error == f"extensions.x.{field} (line 2): Input should be less than or equal to {bound}"

    def test_a_day_is_allowed(self, write) -> None:
        ext = load(extension(write, stop_timeout="86400", call_timeout="86400"), environ=SOCKET).extensions[
            "x"
        ]
        assert (ext.stop_timeout, ext.call_timeout) == (86400.0, 86400.0)

    def test_start_slots_bounds(self, write) -> None:
        """At least one start at a time, at most 1024; null (the default) is about two per core."""
        assert load(write("{}\n"), environ=SOCKET).start_slots is None
        assert load(write("start_slots: 1024\n"), environ=SOCKET).start_slots == 1024
        assert errors_of(write("start_slots: 0\n")) == (
            "start_slots (line 1): Input should be greater than or equal to 1",
        )
        assert errors_of(write("start_slots: 1025\n")) == (
            "start_slots (line 1): Input should be less than or equal to 1024",
        )
        (error,) = errors_of(write("start_slots: two\n"))
        assert error.startswith("start_slots (line 1): Input should be a valid integer")

    def test_spool_bounds(self, write) -> None:
        path = write(f"spool: {{max_inline_bytes: {1024**3 + 1}, max_total_bytes: {1024**5 + 1}}}\n")
        assert errors_of(path) == (
            "spool.max_inline_bytes (line 1): Input should be less than or equal to 1073741824",
            "spool.max_total_bytes (line 1): Input should be less than or equal to 1125899906842624",
        )


class TestStrictTypes:
    @pytest.mark.parametrize("value", ["5", "5.5", "true", "[a]"])
    def test_command_must_be_a_string(self, write, value: str) -> None:
        """`command: 5` used to become "5"; a command is never a number."""
        (error,) = errors_of(extension(write, command=value))
        assert error == "extensions.x.command (line 2): Input should be a valid string"

    def test_numbers_in_args_stay_accepted(self, write) -> None:
        assert load(extension(write, args="[--port, 8080]"), environ=SOCKET).extensions["x"].args == [
            "--port",
            "8080",
        ]

    @pytest.mark.parametrize(
        ("fields", "field"),
        [
            ({"command": '"a\\0b"'}, "command"),
            ({"args": '[ok, "a\\x00"]'}, "args.1"),
            ({"env": '{V: "\\0"}'}, "env.V"),
            ({"env": '{"K\\0": v}'}, "env.'K\\x00'"),
            ({"cwd": '"/tmp\\0"'}, "cwd"),
        ],
    )
    def test_nul_characters_are_errors(self, write, fields: dict[str, str], field: str) -> None:
        """A NUL (written as a YAML escape) cannot reach argv, the environment or a path."""
        (error,) = errors_of(extension(write, **fields))
        assert error.startswith(f"extensions.x.{field} (line 2): ")
        assert "NUL" in error and "\0" not in error

    def test_a_lone_surrogate_is_an_error(self, write) -> None:
        (error,) = errors_of(extension(write, args='["\\ud800"]'))
        assert error == "extensions.x.args.0 (line 2): contains a character the system cannot encode"

    @pytest.mark.parametrize(("key", "shown"), [('"A=B"', "A=B"), ('""', "''")])
    def test_bad_env_names(self, write, key: str, shown: str) -> None:
        (error,) = errors_of(extension(write, env=f"{{{key}: v}}"))
        assert error == (
            f"extensions.x.env.{shown} (line 2): an environment variable name must be non-empty, without '='"
        )

    def test_cwd_that_is_a_file_is_an_error(self, write, tmp_path: Path) -> None:
        """It used to restart forever (NotADirectoryError at spawn is not permanent)."""
        (tmp_path / "file").write_text("")
        (error,) = errors_of(extension(write, cwd=str(tmp_path / "file")))
        assert error == f"extensions.x.cwd (line 2): '{tmp_path / 'file'}' is not a directory"

    def test_cwd_that_does_not_exist_yet_is_accepted(self, tmp_path: Path) -> None:
        """A directory may appear later (a mount); only an existing non-directory is certain to fail."""
        assert StdioConfig(command="x", cwd=str(tmp_path / "later")).cwd == str(tmp_path / "later")

    def test_empty_cwd_is_an_error(self, write) -> None:
        (error,) = errors_of(extension(write, cwd='""'))
        assert error.startswith("extensions.x.cwd (line 2): cwd must not be empty")


class TestSocketPath:
    def test_a_socket_path_over_107_bytes_is_an_error(self, write) -> None:
        """bind() fails for a path over sun_path; the daemon used to exit 1 at start."""
        socket = "/" + "s" * 100 + "/control.sock"
        (error,) = errors_of(write(f"socket: {socket}\n"), {})
        assert error == (
            f"socket (line 1): '{socket}' is over the 107 bytes a unix socket path can have; "
            "use a shorter directory"
        )

    def test_the_gateway_socket_beside_it_must_fit_too(self, write) -> None:
        """`c` fits in 107 bytes, `mcp.sock` beside it does not: an error naming the gateway socket."""
        directory = "/" + "d" * 99
        (error,) = errors_of(write(f"socket: {directory}/c\n"), {})
        assert error.startswith(f"socket (line 1): '{directory}/mcp.sock' is over the 107 bytes")

    def test_107_bytes_is_fine(self, write) -> None:
        socket = "/" + "d" * 97 + "/mcp.sock"
        assert len(socket) == 107
        assert load(write(f"socket: {socket}\n"), environ={}).socket == socket

    def test_from_the_environment(self) -> None:
        errors = errors_of(None, {"MCP_SUPERVISOR_SOCKET": "/" + "e" * 120})  # type: ignore[arg-type]
        assert len(errors) == 1 and errors[0].startswith("socket: '/eee")
