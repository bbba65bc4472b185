"""Reading the config file: a bounded regular file, UTF-8, YAML with bounds; errors that name lines.

Also adding extensions to a config file's text, keeping its comments and order (``import``).
Only :mod:`supervisor.config.settings` and :mod:`supervisor.config.importer` import this module,
and nothing else reads or writes YAML.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping
from typing import Any

import yaml

from supervisor.errors import ConfigError

__all__ = (
    "MAX_BYTES",
    "add_extensions",
    "describe",
    "extension_names",
    "parse",
    "read_bytes",
    "yaml_error",
)

MAX_BYTES = 1 << 20  # a config file is a few KiB; 1 MiB leaves room and bounds memory
_MAX_DEPTH = 64  # YAML nesting levels; a config needs about 6, and composing recurses
_MAX_DIGITS = 100  # an integer literal longer than this is a mistake (Python refuses over 4300)


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounds (nesting depth, integer length); a value it cannot construct names its line."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:  # 5,000 `[` would otherwise end in RecursionError
                problem = f"nested deeper than {_MAX_DEPTH} levels"
                raise yaml.composer.ComposerError(None, None, problem, self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node.tag == "tag:yaml.org,2002:int" and len(node.value) > _MAX_DIGITS:
            problem = f"an integer of more than {_MAX_DIGITS} digits"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark)
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, ValueError, TypeError) as exc:  # `2024-13-01` is a date to YAML; `!!int x`
            problem = f"cannot read this value: {exc}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def parse(path: str | os.PathLike[str]) -> tuple[yaml.Node | None, dict[str, Any], list[str]]:
    """Parse the file keeping node marks; return the root node, its data (``mcpServers`` renamed), errors."""
    name = os.fspath(path)
    text = _decode(name, read_bytes(path))
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:  # a control character (NUL, ESC, ...) anywhere in the file
        line, code = text.count("\n", 0, exc.position) + 1, exc.character  # the character's code point
        raise ConfigError([f"{name} (line {line}): control character U+{code:04X} is not allowed"]) from None
    try:  # compose first and construct from the same nodes, so that errors can name lines
        root = loader.get_single_node()
        errors = _duplicate_keys(root, "")  # before construction flattens `<<` merges into the node
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError([f"{name}{where}: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{name}: {exc}"]) from None
    except RecursionError:  # aliases can chain nodes deeper than the text nests
        raise ConfigError([f"{name}: nested too deeply"]) from None
    finally:
        loader.dispose()
    if data is None:
        return None, {}, []
    if not isinstance(data, dict):
        line, found = root.start_mark.line + 1, type(data).__name__
        raise ConfigError([f"{name} (line {line}): the top level must be a mapping, not a {found}"])
    if "mcpServers" in data:
        if "extensions" in data:
            line = _locate(root, ("mcpServers",))[1]
            errors.append(f"mcpServers (line {line}): give 'extensions' or 'mcpServers', not both")
            del data["mcpServers"]
        else:
            data["extensions"] = data.pop("mcpServers")
    if "extensions" in data and data["extensions"] is None:  # every entry commented out
        data["extensions"] = {}
    return root, data, errors


def _decode(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")  # a leading BOM is fine, as in PyYAML
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        problem = f"not valid UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        raise ConfigError([f"{name} (line {line}): {problem}"]) from None


def _duplicate_keys(node: yaml.Node | None, path: str, seen: set[int] | None = None) -> list[str]:
    """YAML silently keeps the last of two equal keys (say, two blocks for one extension): report it."""
    seen = set() if seen is None else seen
    if not isinstance(node, yaml.MappingNode) or id(node) in seen:  # seen: aliases can make cycles
        return []
    seen.add(id(node))
    errors: list[str] = []
    first: dict[str, int] = {}
    for key, value in node.value:
        line = key.start_mark.line + 1
        if isinstance(key, yaml.ScalarNode) and key.value in first:
            errors.append(f"{path}{key.value} (line {line}): duplicate key, first on line {first[key.value]}")
        elif isinstance(key, yaml.ScalarNode):
            first[key.value] = line
        errors += _duplicate_keys(value, f"{path}{key.value}.", seen)
    return errors


def _is_tag(part: Any) -> bool:
    """A tagged union's tag in an error's location, "(stdio)" or "(remote)" (the extension kinds
    of :mod:`.extension`): no name or key the file holds looks like that."""
    return isinstance(part, str) and part.startswith("(") and part.endswith(")")


def _locate(root: yaml.Node | None, loc: tuple[Any, ...]) -> tuple[int, int | None]:
    """How many parts of *loc* exist in the file, and the line of the deepest one (its key, for mappings)."""
    node, line, depth = root, None if root is None else root.start_mark.line + 1, 0
    for part in loc:
        names = ("extensions", "mcpServers") if depth == 0 and part == "extensions" else (str(part),)
        if isinstance(node, yaml.MappingNode):
            pairs = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value in names]
            if not pairs:
                break
            key, node = pairs[-1]  # the last of equal keys wins, as in PyYAML
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
        depth += 1
    return depth, line


def _depth(data: Any, loc: tuple[Any, ...]) -> int:
    """How many parts of *loc* exist in plain data (the overrides or the environment's contribution)."""
    depth = 0
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            break
        depth += 1
    return depth


def describe(error: Any, root: yaml.Node | None, higher: tuple[Mapping[str, Any], ...]) -> str:
    """``path (line N): msg``; no line when the value came from the overrides or the environment."""
    loc = tuple(part for part in error["loc"] if part != "[key]" and not _is_tag(part))
    path = ".".join(_shown(part) for part in loc) or "<top level>"
    file_depth, line = _locate(root, loc)
    from_higher = max(_depth(data, loc) for data in higher)
    where = f" (line {line})" if line is not None and (from_higher == 0 or file_depth > from_higher) else ""
    return f"{path}{where}: {_escaped(error['msg'])}"


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_BYTES) -> bytes:
    """The bytes of the config file at *path*, a regular file of at most *limit* bytes.

    Error handling: raises :class:`ConfigError` naming the file for a missing or unreadable file,
    a directory, a FIFO or device (never blocks on one), or a file over *limit*.
    Resource handling: reads at most *limit* + 1 bytes, whatever the file's size.
    """
    name = os.fspath(path)
    try:
        _check_regular(name, os.stat(name))  # a device is refused before open(), which may act on it
        # O_NONBLOCK: a FIFO swapped in after stat() must not block open() waiting for a writer.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            _check_regular(name, os.fstat(fd))  # what was opened, not what stat() saw
            chunks: list[bytes] = []
            size = 0
            while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError([f"{name}: {exc.strerror or exc}"]) from None
    except ValueError:  # an embedded NUL in the path
        raise ConfigError([f"{name!r}: not a valid file name"]) from None
    if size > limit:
        raise ConfigError([f"{name}: larger than {limit} bytes; a config file is a few KiB"])
    return b"".join(chunks)


def _check_regular(name: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError([f"{name}: is a directory, not a config file"])
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        )
        raise ConfigError([f"{name}: is {kind}, not a regular file"])


def _shown(part: Any) -> str:
    """A path part as text; a key with control characters (or none at all) is quoted, never printed raw."""
    text = str(part)
    return text if text.isprintable() and text else repr(text)


def _escaped(text: str) -> str:
    """Messages can quote a value: its control characters are shown escaped, not sent to the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _Dumper(yaml.SafeDumper):
    """Lists in flow style (``args: [-y, pkg]``), mappings in block style: how people write configs."""


_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def _dump(data: Any) -> str:
    return yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096
    )


def _compose(text: str) -> yaml.Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def _table_node(root: yaml.Node | None) -> tuple[yaml.Node, yaml.Node] | None:
    """The ``extensions`` (or ``mcpServers``) key and value nodes of a parsed config."""
    if not isinstance(root, yaml.MappingNode):
        return None
    for key, value in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value in ("extensions", "mcpServers"):
            return key, value
    return None


def yaml_error() -> type[Exception]:
    """The exception class of YAML syntax errors, for callers that do not import YAML themselves."""
    return yaml.YAMLError


def extension_names(text: str) -> list[str]:
    """The extension names a config file's text defines (under ``extensions`` or ``mcpServers``).

    Error handling: raises ``yaml.YAMLError`` for text that is not YAML.
    """
    found = _table_node(_compose(text))
    if found is None or not isinstance(found[1], yaml.MappingNode):
        return []
    return [key.value for key, _ in found[1].value if isinstance(key, yaml.ScalarNode)]


def _last_line(node: yaml.Node) -> int:
    """The 0-based line of the last character of *node*'s content (not of the comments after it)."""
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and not node.flow_style and node.value:
        last = node.value[-1]
        return _last_line(last[1] if isinstance(last, tuple) else last)
    end = node.end_mark
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line


def add_extensions(
    text: str | None, entries: Mapping[str, Any], *, replace: Collection[str] = (), comment: str = ""
) -> tuple[str, bool]:
    """*text* with *entries* added under ``extensions``, replacing the *replace* ones; comments kept?

    Block-style files keep every line they had but the replaced entries: the new entries go after
    the last one, indented like it, under a ``# comment`` line. A file in flow style (a JSON config)
    is written anew from its data, which loses its comments (the second value is then False).
    Error handling: raises ``yaml.YAMLError`` for text that is not YAML.
    """
    note = f"# {comment}\n" if comment else ""
    if not text or not text.strip():
        return f"{note}extensions:\n{_indented(_dump(dict(entries)), 2)}", True
    lines = text.splitlines(keepends=True)
    if not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    root = _compose(text)
    found = _table_node(root)
    if root is None or (found is None and isinstance(root, yaml.MappingNode) and not root.flow_style):
        return "".join(lines) + f"\n{note}extensions:\n{_indented(_dump(dict(entries)), 2)}", True
    if found is not None:
        key, value = found
        if (
            isinstance(value, yaml.ScalarNode) and value.value == "" and not value.style
        ):  # `extensions:` alone
            at = key.start_mark.line + 1
            block = _indented(note + _dump(dict(entries)), key.start_mark.column + 2)
            return "".join(lines[:at]) + block + "".join(lines[at:]), True
        if isinstance(value, yaml.MappingNode) and not value.flow_style and value.value:
            column = value.value[0][0].start_mark.column
            gone = {
                line
                for k, v in value.value
                if k.value in replace
                for line in range(k.start_mark.line, _last_line(v) + 1)
            }
            at = _last_line(value) + 1
            block = _indented(note + _dump(dict(entries)), column)
            kept = [line for i, line in enumerate(lines) if i not in gone and i < at]
            return "".join(kept) + block + "".join(lines[at:]), True
    data = yaml.load(text, Loader=_Loader) or {}  # flow style: JSON, or `extensions: {}`
    if not isinstance(data, dict):
        raise yaml.YAMLError("the top level must be a mapping")
    table = "mcpServers" if "mcpServers" in data and "extensions" not in data else "extensions"
    servers = {k: v for k, v in (data.get(table) or {}).items() if k not in replace}
    data[table] = {**servers, **entries}
    return note + _dump(data), False


def _indented(text: str, column: int) -> str:
    pad = " " * column
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))
