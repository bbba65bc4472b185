"""The field types and validators the settings are made of: names, durations, sizes, paths, ``${...}``.

``${VAR}`` and ``${VAR:-default}`` expand at load time from the environment of the load in
progress (:data:`LOADING`); ``${file:PATH}`` and ``${credential:NAME}`` in env values stay
references (:mod:`.secrets`), read at spawn. Every text that reaches the OS is checked to be
encodable and free of NUL; durations are bounded by a day, sizes by what makes sense.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)
from pydantic_core import PydanticCustomError

from supervisor.config.secrets import EnvTemplate, Reference

__all__ = (
    "LOADING",
    "MIN_MEMORY_MAX",
    "Delay",
    "EnvValue",
    "Expanded",
    "Frozen",
    "Loading",
    "MemorySize",
    "Name",
    "OnChange",
    "Timeout",
    "absolute",
    "check_name",
    "directory",
    "env_name",
    "expand",
    "expand_env",
    "expand_parts",
    "header_name",
    "loading_environ",
    "memory_size",
    "non_empty",
    "non_empty_path",
    "os_text",
    "reference",
    "remote_url",
    "socket_path",
)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_VAR = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{(file|credential):([^}]*)\}|\$\{"
)  # ${VAR:-x} before ${file:...}: `${file:-x}` stays the variable `file` with a default
_CREDENTIAL = re.compile(r"[A-Za-z0-9_.@-]{1,255}")  # a file name in $CREDENTIALS_DIRECTORY
OnChange = Literal[
    "allow", "warn", "hold"
]  # what a changed tool definition does (see supervisor.extension.pins)
_DAY = 86_400.0  # upper bound of every duration: a longer one is a typo, and huge ones overflow timers
_SOCKET_PATH_MAX = 107  # bytes: sun_path is 108 on Linux, one for the terminating NUL


@dataclass
class Loading:  # what the load() in progress reads; env_data records what MCP_SUPERVISOR_* supplied
    file_data: dict[str, Any]
    environ: Mapping[str, str]
    env_data: dict[str, Any] = field(default_factory=dict)


LOADING: ContextVar[Loading | None] = ContextVar("mcp_supervisor_config", default=None)


def loading_environ() -> Mapping[str, str]:  # outside load() (models built directly): the process environment
    ctx = LOADING.get()
    return os.environ if ctx is None else ctx.environ


def expand(value: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (default when unset or empty); ``$$`` is a literal ``$``."""
    parts = expand_parts(value)
    if any(isinstance(part, Reference) for part in parts):
        reference = next(str(part) for part in parts if isinstance(part, Reference))
        raise PydanticCustomError(
            "secret_outside_env",
            "'{reference}' is allowed in env values only (a secret is read when the extension starts)",
            {"reference": reference},
        )
    return os_text("".join(parts))  # type: ignore[arg-type]  # only text


def expand_env(value: str) -> str | EnvTemplate:
    """:func:`expand`, and ``${file:PATH}``/``${credential:NAME}`` kept as references for the spawn."""
    parts = expand_parts(value)
    if not any(isinstance(part, Reference) for part in parts):
        return os_text("".join(parts))  # type: ignore[arg-type]  # only text
    merged: list[str | Reference] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    return EnvTemplate(tuple(os_text(p) if isinstance(p, str) else p for p in merged))


def expand_parts(value: str) -> list[str | Reference]:
    """*value* as literal text (variables expanded) and secret references, in order."""
    env = loading_environ()
    parts: list[str | Reference] = []
    end = 0
    for match in _VAR.finditer(value):
        parts.append(value[end : match.start()])
        end = match.end()
        name, default, kind, target = match.group(1, 2, 3, 4)
        if match.group(0) == "$$":
            parts.append("$")
        elif kind is not None:
            parts.append(reference(kind, target, env))
        elif name is None:
            raise PydanticCustomError(
                "bad_variable",
                "malformed '${' (use ${NAME}, ${NAME:-default}, ${file:PATH}, ${credential:NAME} or $$)",
            )
        elif env.get(name):
            parts.append(env[name])
        elif default is not None:
            parts.append(default)
        elif name in env:
            parts.append("")
        else:
            message = "environment variable {name} is not set (write $$ for a literal $)"
            raise PydanticCustomError("unset_variable", message, {"name": name})
    parts.append(value[end:])
    return parts


def reference(kind: str, target: str, env: Mapping[str, str]) -> Reference:
    """A checked secret reference: an absolute (or ``~/``) path, or a credential's file name."""
    shown = f"${{{kind}:{target}}}"
    if kind == "credential":
        if not _CREDENTIAL.fullmatch(target) or target in (".", ".."):
            raise PydanticCustomError(
                "bad_credential",
                "'{reference}': a credential name is 1-255 letters, digits, '_', '.', '@' or '-'",
                {"reference": shown},
            )
        return Reference("credential", target)
    if target.startswith("~/") and env.get("HOME"):
        target = os.path.join(env["HOME"], target[2:])
    if not os.path.isabs(target):
        message = "'{reference}': the path must be absolute (or start with ~/)"
        raise PydanticCustomError("relative_secret", message, {"reference": shown})
    return Reference("file", os.path.normpath(os_text(target)))


def os_text(value: str) -> str:
    """Text that reaches the OS (argv, environment, paths): no NUL, and encodable."""
    if "\0" in value:
        raise PydanticCustomError("nul_character", "must not contain a NUL character")
    try:
        os.fsencode(value)
    except UnicodeError:
        raise PydanticCustomError("not_encodable", "contains a character the system cannot encode") from None
    return value


def env_name(value: str) -> str:
    if not value or "=" in value:
        raise PydanticCustomError(
            "bad_env_name", "an environment variable name must be non-empty, without '='"
        )
    return os_text(value)


def directory(value: str) -> str:
    """A missing directory may appear later (a mount); an existing non-directory never works."""
    if not value:
        raise PydanticCustomError("empty_cwd", "cwd must not be empty (null: the daemon's directory)")
    if os.path.exists(value) and not os.path.isdir(value):
        raise PydanticCustomError("not_a_directory", "'{cwd}' is not a directory", {"cwd": value})
    return value


def socket_path(value: str) -> str:
    """Both sockets must fit in ``sockaddr_un``: this one and the gateway's ``mcp.sock`` beside it."""
    for path in (os_text(value), os.path.join(os.path.dirname(value), "mcp.sock")):
        if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
            raise PydanticCustomError(
                "socket_too_long",
                "'{path}' is over the {limit} bytes a unix socket path can have; use a shorter directory",
                {"path": path, "limit": _SOCKET_PATH_MAX},
            )
    return value


def absolute(value: str) -> str:
    """A root is a directory the child may work in, named absolutely (it becomes a ``file://`` URI)."""
    if not os.path.isabs(value):
        raise PydanticCustomError("relative_root", "'{path}' is not an absolute path", {"path": value})
    return os.path.normpath(value)


def non_empty_path(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_path", "a sandbox path must not be empty")
    return value


def non_empty(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_command", "command must not be empty")
    return value


def remote_url(value: str) -> str:
    """An ``http://`` or ``https://`` URL with a host, and no credentials in it: a URL shows in
    ``status`` and logs, so a secret goes in ``headers`` (``${credential:NAME}``)."""
    try:
        parsed = urllib.parse.urlsplit(value)
        parsed.port  # noqa: B018 - raises on a port that is no number
    except ValueError as exc:
        raise PydanticCustomError(
            "bad_url", "'{url}' is not a URL ({reason})", {"url": value, "reason": str(exc)}
        ) from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PydanticCustomError(
            "bad_url", "'{url}' is not an http:// or https:// URL with a host", {"url": value}
        )
    if parsed.username is not None or parsed.password is not None:
        raise PydanticCustomError(
            "url_credentials",
            "the URL holds credentials (user:password@): give them in 'headers' with "
            "{reference}, which is never shown or logged",
            {"reference": "${credential:NAME}"},
        )
    if parsed.fragment:
        raise PydanticCustomError(
            "bad_url", "'{url}' has a fragment (#...), which no server sees", {"url": value}
        )
    return value


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")  # an HTTP field name (RFC 9110 5.1)
_TRANSPORT_HEADERS = frozenset(  # set by the transport itself: a config must not override them
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "accept",
     "mcp-session-id", "mcp-protocol-version", "last-event-id"}
)  # fmt: skip


def header_name(value: str) -> str:
    if not _TOKEN.fullmatch(value):
        raise PydanticCustomError("bad_header", "'{name}' is not an HTTP header name", {"name": value})
    if value.lower() in _TRANSPORT_HEADERS:
        raise PydanticCustomError(
            "transport_header", "header '{name}' is set by the MCP transport itself", {"name": value}
        )
    return value


def check_name(value: str) -> str:
    if not _NAME.fullmatch(value) or "__" in value:
        raise PydanticCustomError(
            "bad_name",
            "invalid name '{name}': use 1-64 letters, digits, '_' or '-', starting with a letter or digit, "
            "and no '__' (it separates extension and tool in the gateway)",
            {"name": value},
        )
    return value


Expanded = Annotated[str, AfterValidator(expand)]
EnvValue = Annotated[str, AfterValidator(expand_env)]  # str, or an EnvTemplate (secrets: read at spawn)
Name = Annotated[str, AfterValidator(check_name)]
Timeout = Annotated[float, Field(gt=0, le=_DAY)]  # seconds
Delay = Annotated[float, Field(ge=0, le=_DAY)]  # seconds; 0 allowed


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
MIN_MEMORY_MAX = 1024**2  # smaller is a typo (bytes meant as megabytes): no server starts in it


def memory_size(value: Any) -> int:
    """``512M``, ``1G``, ``1.5GiB`` or a number of bytes, as bytes (units are powers of 1024)."""
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif match:
        size = int(float(match[1]) * 1024 ** " kmgt".index(match[2].lower() or " "))
    else:
        raise PydanticCustomError(
            "memory_size", "invalid size '{value}': use bytes or a number with K, M, G or T (512M, 1G)",
            {"value": value},
        )  # fmt: skip
    if not MIN_MEMORY_MAX <= size <= 1024**5:
        raise PydanticCustomError(
            "memory_size",
            "size '{value}' is out of range: at least 1M, at most 1024T",
            {"value": value},
        )
    return size


MemorySize = Annotated[int, BeforeValidator(memory_size)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # .inf, .nan: errors
