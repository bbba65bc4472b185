"""Settings: frozen pydantic models, loaded from overrides > ``MCP_SUPERVISOR_*`` env > YAML file > defaults.

Only ``daemon`` and ``cli`` import this module; everything else receives plain model values.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from .errors import ConfigError
from .paths import ENV_PREFIX as _ENV
from .paths import default_config_path, default_socket_path

__all__ = (
    "BackoffConfig",
    "ConfigError",
    "ExtensionConfig",
    "GatewayConfig",
    "HttpConfig",
    "Settings",
    "SpoolConfig",
    "ToolFilter",
    "default_config_path",
    "default_socket_path",
    "load",
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


@dataclass
class _Context:  # what the load() in progress reads; env_data records what MCP_SUPERVISOR_* supplied
    file_data: dict[str, Any]
    environ: Mapping[str, str]
    env_data: dict[str, Any] = field(default_factory=dict)


_CONTEXT: ContextVar[_Context | None] = ContextVar("mcp_supervisor_config", default=None)


def _environ() -> Mapping[str, str]:  # outside load() (models built directly): the process environment
    ctx = _CONTEXT.get()
    return os.environ if ctx is None else ctx.environ


def _expand(value: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (default when unset or empty); ``$$`` is a literal ``$``."""
    env = _environ()

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1, 2)
        if match.group(0) == "$$":
            return "$"
        if name is None:
            raise PydanticCustomError("bad_variable", "malformed '${' (use ${NAME}, ${NAME:-default} or $$)")
        if env.get(name):
            return env[name]
        if default is not None:
            return default
        if name in env:
            return ""
        message = "environment variable {name} is not set (write $$ for a literal $)"
        raise PydanticCustomError("unset_variable", message, {"name": name})

    return _VAR.sub(replace, value)


def _non_empty(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_command", "command must not be empty")
    return value


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value) or "__" in value:
        raise PydanticCustomError(
            "bad_name",
            "invalid name '{name}': use 1-64 letters, digits, '_' or '-', starting with a letter or digit, "
            "and no '__' (it separates extension and tool in the gateway)",
            {"name": value},
        )
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_Expanded = Annotated[str, AfterValidator(_expand)]
_Name = Annotated[str, AfterValidator(_check_name)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackoffConfig(_Frozen):
    """Restart delays: ``initial * multiplier**n`` up to ``max``, +/- ``jitter``; reset after a stable run."""

    initial: float = Field(0.5, ge=0)
    max: float = Field(30.0, ge=0)
    multiplier: float = Field(2.0, ge=1)
    jitter: float = Field(0.1, ge=0, le=1)
    reset_after: float = Field(60.0, ge=0)


class ToolFilter(_Frozen):
    """Glob patterns on a tool's original name: shown when it matches ``allow`` and no ``deny``."""

    allow: list[str] = ["*"]
    deny: list[str] = []


class ExtensionConfig(_Frozen):
    """One stdio MCP server. ``${VAR}`` expands in command, args, env values and cwd at load time.

    Claude Desktop / Cursor entries load as is: ``type: stdio`` is accepted, ``disabled: true`` means
    ``autostart: false``; neither is kept as a field, so equal settings compare equal.
    """

    model_config = ConfigDict(coerce_numbers_to_str=True)  # `args: [--port, 8080]` is common in YAML

    command: Annotated[str, AfterValidator(_expand), AfterValidator(_non_empty)]
    args: list[_Expanded] = []
    env: dict[str, _Expanded] = {}
    cwd: _Expanded | None = None
    autostart: bool = True
    restart: Literal["always", "on-failure", "never"] = "on-failure"
    backoff: BackoffConfig = BackoffConfig()
    max_restarts: int | None = Field(None, ge=0)  # consecutive failures before `failed`; None: never give up
    start_timeout: float = Field(30.0, gt=0)  # spawn + initialize + tools/list
    stop_timeout: float = Field(5.0, ge=0)  # grace after stdin close, then SIGTERM, then SIGKILL
    call_timeout: float = Field(60.0, gt=0)  # inactivity budget per call; progress renews it
    call_timeout_max: float = Field(600.0, gt=0)  # absolute cap per call, progress or not
    prefix: _Name | None = None  # gateway tool prefix; None: the extension's name
    tools: ToolFilter = ToolFilter()  # what gateway clients see of this extension's tools
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024)  # cap on one stdout JSON-RPC line
    log_lines: int = Field(500, ge=1, le=100_000)  # stderr ring size

    @model_validator(mode="before")
    @classmethod
    def _compat(cls, data: Any) -> Any:
        """Fold the Claude Desktop / Cursor keys ``type`` and ``disabled`` into real settings."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        if "url" in data:
            raise PydanticCustomError(
                "not_stdio", "only stdio servers can be supervised; 'url' names a remote (HTTP/SSE) server"
            )
        kind = data.pop("type", "stdio")
        if kind != "stdio":
            raise PydanticCustomError(
                "not_stdio", "only stdio servers can be supervised, not type '{kind}'", {"kind": kind}
            )
        if "disabled" in data:
            disabled = data.pop("disabled")
            if "autostart" in data:
                raise PydanticCustomError("conflict", "give 'autostart' or 'disabled', not both")
            if not isinstance(disabled, bool):
                raise PydanticCustomError("bad_disabled", "'disabled' should be true or false")
            data["autostart"] = not disabled
        return data


class SpoolConfig(_Frozen):
    """Where large media from results goes. ``dir`` None: the daemon picks a cache directory."""

    dir: str | None = None
    max_inline_bytes: int = Field(262_144, ge=0)  # decoded bytes; a payload of exactly this size stays inline
    max_total_bytes: int = Field(1024**3, gt=0)


class HttpConfig(_Frozen):
    """The gateway's optional streamable-HTTP listener."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(
        8765, ge=0, le=65535
    )  # 0: any free port (the log line gateway.http_listening says which)
    token: SecretStr | None = None  # bearer token; required when host is not a loopback address

    @model_validator(mode="after")
    def _token_off_loopback(self) -> HttpConfig:
        if self.enabled and self.token is None and not _is_loopback(self.host):
            raise PydanticCustomError(
                "token_required",
                "a 'token' is required when the HTTP gateway listens on '{host}'",
                {"host": self.host},
            )
        return self


class GatewayConfig(_Frozen):
    """The MCP gateway; its unix socket is always on, beside the control socket."""

    http: HttpConfig = HttpConfig()
    max_name_length: int = Field(64, ge=16, le=64)  # exposed tool/prompt names; clients cap at 64


class _EnvSource(EnvSettingsSource):
    """``MCP_SUPERVISOR_*`` from the load's environ rather than ``os.environ``; records what it supplied."""

    def __init__(self, settings_cls: type[BaseSettings], ctx: _Context) -> None:
        super().__init__(settings_cls)
        self.env_vars = {key.lower(): value for key, value in ctx.environ.items()}
        self._ctx = ctx

    def __call__(self) -> dict[str, Any]:
        self._ctx.env_data = super().__call__()
        return self._ctx.env_data


class _DataSource(PydanticBaseSettingsSource):
    """The already-parsed YAML file."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        return self._data


class Settings(BaseSettings):
    """Everything the daemon runs with. Frozen: a reload builds a new value and diffs it with ``==``."""

    model_config = SettingsConfigDict(
        env_prefix=_ENV, env_nested_delimiter="__", frozen=True, extra="forbid", env_file=None
    )

    socket: str = Field(default_factory=lambda: default_socket_path(_environ()), min_length=1)
    shutdown_timeout: float = Field(30.0, gt=0)  # daemon stop: how long to wait for every extension
    spool: SpoolConfig = SpoolConfig()
    gateway: GatewayConfig = GatewayConfig()
    extensions: dict[_Name, ExtensionConfig] = {}  # the file may call it `mcpServers`

    @property
    def gateway_socket(self) -> str:
        """The gateway's unix socket, ``mcp.sock`` beside the control socket."""
        return os.path.join(os.path.dirname(self.socket), "mcp.sock")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Overrides, then environment, then the file being loaded; no dotenv, no secrets dir."""
        ctx = _CONTEXT.get() or _Context({}, os.environ)
        return init_settings, _EnvSource(settings_cls, ctx), _DataSource(settings_cls, ctx.file_data)


def load(
    path: str | os.PathLike[str] | None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read, merge and validate the settings; raise ConfigError listing every problem.

    *path* None means no file. *overrides* (the command line) win over ``MCP_SUPERVISOR_*`` in *environ*
    (default ``os.environ``), which wins over the file; top-level overrides that are None are ignored.
    ``${VAR}`` references and the default socket path are resolved from *environ* as well.
    """
    environ = os.environ if environ is None else environ
    root, data, errors = _read(path) if path is not None else (None, {}, [])
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    ctx = _Context(data, environ)
    token = _CONTEXT.set(ctx)
    try:  # validate even after file-level errors, so that every problem is listed at once
        settings = Settings(**given)
    except ValidationError as exc:
        errors += [_describe(err, root, (given, ctx.env_data)) for err in exc.errors()]
    except SettingsError as exc:  # e.g. malformed JSON in a complex MCP_SUPERVISOR_* variable
        errors.append(f"environment: {exc} (give list and mapping values as JSON)")
    finally:
        _CONTEXT.reset(token)
    if errors:
        raise ConfigError(errors)
    return settings


def _read(path: str | os.PathLike[str]) -> tuple[yaml.Node | None, dict[str, Any], list[str]]:
    """Parse the file keeping node marks; return the root node, its data (``mcpServers`` renamed), errors."""
    name = os.fspath(path)
    try:
        with open(path, "rb") as file:
            loader = yaml.SafeLoader(file.read())
    except OSError as exc:
        raise ConfigError([f"{name}: {exc.strerror or exc}"]) from None
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


def _describe(error: Any, root: yaml.Node | None, higher: tuple[Mapping[str, Any], ...]) -> str:
    """``path (line N): msg``; no line when the value came from the overrides or the environment."""
    loc = tuple(part for part in error["loc"] if part != "[key]")
    path = ".".join(str(part) for part in loc) or "<top level>"
    file_depth, line = _locate(root, loc)
    from_higher = max(_depth(data, loc) for data in higher)
    where = f" (line {line})" if line is not None and (from_higher == 0 or file_depth > from_higher) else ""
    return f"{path}{where}: {error['msg']}"
