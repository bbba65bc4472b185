"""Settings: frozen pydantic models, loaded from overrides > ``MCP_SUPERVISOR_*`` env > YAML file > defaults.

Only ``daemon`` and ``cli`` import this module; everything else receives plain model values.
"""

from __future__ import annotations

import os
import re
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
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from supervisor.config import clientkeys
from supervisor.config.file import describe, parse
from supervisor.config.secrets import EnvTemplate, Reference
from supervisor.errors import ConfigError
from supervisor.paths import ENV_PREFIX as _ENV
from supervisor.paths import default_config_path, default_socket_path, is_loopback

__all__ = (
    "BackoffConfig",
    "ConfigError",
    "ExtensionConfig",
    "GatewayConfig",
    "HttpConfig",
    "ProfileConfig",
    "SandboxConfig",
    "Settings",
    "SpoolConfig",
    "ToolFilter",
    "default_config_path",
    "default_socket_path",
    "load",
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
    parts = _expand_parts(value)
    if any(isinstance(part, Reference) for part in parts):
        reference = next(str(part) for part in parts if isinstance(part, Reference))
        raise PydanticCustomError(
            "secret_outside_env",
            "'{reference}' is allowed in env values only (a secret is read when the extension starts)",
            {"reference": reference},
        )
    return _os_text("".join(parts))  # type: ignore[arg-type]  # only text


def _expand_env(value: str) -> str | EnvTemplate:
    """:func:`_expand`, and ``${file:PATH}``/``${credential:NAME}`` kept as references for the spawn."""
    parts = _expand_parts(value)
    if not any(isinstance(part, Reference) for part in parts):
        return _os_text("".join(parts))  # type: ignore[arg-type]  # only text
    merged: list[str | Reference] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    return EnvTemplate(tuple(_os_text(p) if isinstance(p, str) else p for p in merged))


def _expand_parts(value: str) -> list[str | Reference]:
    """*value* as literal text (variables expanded) and secret references, in order."""
    env = _environ()
    parts: list[str | Reference] = []
    end = 0
    for match in _VAR.finditer(value):
        parts.append(value[end : match.start()])
        end = match.end()
        name, default, kind, target = match.group(1, 2, 3, 4)
        if match.group(0) == "$$":
            parts.append("$")
        elif kind is not None:
            parts.append(_reference(kind, target, env))
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


def _reference(kind: str, target: str, env: Mapping[str, str]) -> Reference:
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
    return Reference("file", os.path.normpath(_os_text(target)))


def _os_text(value: str) -> str:
    """Text that reaches the OS (argv, environment, paths): no NUL, and encodable."""
    if "\0" in value:
        raise PydanticCustomError("nul_character", "must not contain a NUL character")
    try:
        os.fsencode(value)
    except UnicodeError:
        raise PydanticCustomError("not_encodable", "contains a character the system cannot encode") from None
    return value


def _env_name(value: str) -> str:
    if not value or "=" in value:
        raise PydanticCustomError(
            "bad_env_name", "an environment variable name must be non-empty, without '='"
        )
    return _os_text(value)


def _directory(value: str) -> str:
    """A missing directory may appear later (a mount); an existing non-directory never works."""
    if not value:
        raise PydanticCustomError("empty_cwd", "cwd must not be empty (null: the daemon's directory)")
    if os.path.exists(value) and not os.path.isdir(value):
        raise PydanticCustomError("not_a_directory", "'{cwd}' is not a directory", {"cwd": value})
    return value


def _socket_path(value: str) -> str:
    """Both sockets must fit in ``sockaddr_un``: this one and the gateway's ``mcp.sock`` beside it."""
    for path in (_os_text(value), os.path.join(os.path.dirname(value), "mcp.sock")):
        if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
            raise PydanticCustomError(
                "socket_too_long",
                "'{path}' is over the {limit} bytes a unix socket path can have; use a shorter directory",
                {"path": path, "limit": _SOCKET_PATH_MAX},
            )
    return value


def _absolute(value: str) -> str:
    """A root is a directory the child may work in, named absolutely (it becomes a ``file://`` URI)."""
    if not os.path.isabs(value):
        raise PydanticCustomError("relative_root", "'{path}' is not an absolute path", {"path": value})
    return os.path.normpath(value)


def _non_empty_path(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_path", "a sandbox path must not be empty")
    return value


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


_Expanded = Annotated[str, AfterValidator(_expand)]
_EnvValue = Annotated[str, AfterValidator(_expand_env)]  # str, or an EnvTemplate (secrets: read at spawn)
_Name = Annotated[str, AfterValidator(_check_name)]
_Timeout = Annotated[float, Field(gt=0, le=_DAY)]  # seconds
_Delay = Annotated[float, Field(ge=0, le=_DAY)]  # seconds; 0 allowed


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
MIN_MEMORY_MAX = 1024**2  # smaller is a typo (bytes meant as megabytes): no server starts in it


def _memory_size(value: Any) -> int:
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
            "memory_max '{value}' is out of range: at least 1M, at most 1024T",
            {"value": value},
        )
    return size


_MemorySize = Annotated[int, BeforeValidator(_memory_size)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # .inf, .nan: errors


class BackoffConfig(_Frozen):
    """Restart delays: ``initial * multiplier**n`` up to ``max``, +/- ``jitter``; reset after a stable run."""

    initial: _Delay = 0.5
    max: _Delay = 30.0
    multiplier: float = Field(2.0, ge=1, le=1000)
    jitter: float = Field(0.1, ge=0, le=1)
    reset_after: _Delay = 60.0


class ToolFilter(_Frozen):
    """Glob patterns on a tool's original name: shown when it matches ``allow`` and no ``deny``."""

    allow: list[str] = ["*"]
    deny: list[str] = []


class SandboxConfig(_Frozen):
    """What a confined extension may reach beyond its base (see :mod:`supervisor.process.sandbox`).

    ``read``/``write``: paths; ``~`` and globs expand at each start, ``${VAR}`` at load.
    ``sandbox: false`` in the file is ``enabled: false`` here (unconfined).
    """

    enabled: bool = True
    network: Literal["none", "outbound", "all"] = "all"  # outbound: TCP connect, no bind
    read: list[Annotated[_Expanded, AfterValidator(_non_empty_path)]] = []
    write: list[Annotated[_Expanded, AfterValidator(_non_empty_path)]] = []


def _sandbox_switch(value: Any) -> Any:
    """``sandbox: true`` is the default sandbox; ``false`` opts out; anything else is a mapping."""
    if isinstance(value, bool):
        return {"enabled": value}
    if isinstance(value, SandboxConfig | Mapping):
        return value
    raise PydanticCustomError("sandbox", "sandbox must be false, true or a mapping (network, read, write)")


class ExtensionConfig(_Frozen):
    """One stdio MCP server. ``${VAR}`` expands in command, args, env values and cwd at load time.

    ``${file:PATH}`` and ``${credential:NAME}`` in an env value stay references (the value is a
    :class:`~supervisor.config.secrets.EnvTemplate`): the secret is read at spawn, never held here.

    Client entries (Claude Desktop, Cursor, VS Code, Cline, ...) load as is: ``type: stdio`` is accepted,
    ``disabled: true`` means ``autostart: false``, ``timeout`` is ``call_timeout`` and the other keys
    of :mod:`supervisor.config.clientkeys` are mapped or dropped; none is kept as a field, so equal settings
    compare equal.
    """

    model_config = ConfigDict(coerce_numbers_to_str=True)  # `args: [--port, 8080]` is common in YAML

    command: Annotated[str, Field(strict=True), AfterValidator(_expand), AfterValidator(_non_empty)]  # 5: no
    args: list[_Expanded] = []
    env: dict[Annotated[str, AfterValidator(_env_name)], _EnvValue] = {}
    cwd: Annotated[_Expanded, AfterValidator(_directory)] | None = None
    autostart: bool = True
    restart: Literal["always", "on-failure", "never"] = "on-failure"
    backoff: BackoffConfig = BackoffConfig()
    max_restarts: int | None = Field(None, ge=0, le=1_000_000)  # consecutive failures before `failed`
    start_timeout: _Timeout = 30.0  # spawn + initialize + tools/list, from the start slot's grant
    first_start_timeout: _Timeout | None = None  # instead, until a first handshake (npx -y, uvx download)
    stop_timeout: _Delay = 5.0  # grace after stdin close, then SIGTERM, then SIGKILL
    call_timeout: _Timeout = 60.0  # inactivity budget per call; progress renews it
    call_timeout_max: _Timeout = 600.0  # absolute cap per call, progress or not
    prefix: _Name | None = None  # gateway tool prefix; None: the extension's name
    tools: ToolFilter = ToolFilter()  # what gateway clients see of this extension's tools
    roots: list[Annotated[_Expanded, AfterValidator(_absolute)]] = []  # roots/list when no client gives any
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1024**3)  # cap on one stdout JSON-RPC line
    log_lines: int = Field(500, ge=1, le=100_000)  # stderr ring size
    on_demand: bool = False  # started by the first call; lists served from the saved catalog meanwhile
    idle_stop: _Timeout | None = None  # seconds without calls before stopping; None: never
    instances: Literal["shared", "per-client"] = "shared"  # per-client: one child per gateway connection
    max_instances: int = Field(16, ge=1, le=1024)  # per-client children at once
    ping_interval: _Timeout | None = None  # liveness: ping this often; None: off
    ping_timeout: _Timeout = 10.0  # no answer (nor to any call in flight) this long: restart
    memory_max: _MemorySize | None = None  # bytes, or 512M / 1G (binary units): the whole tree's RSS
    tools_on_change: OnChange | None = None  # a pinned tool's definition changed; None: the top-level one
    sandbox: Annotated[SandboxConfig, BeforeValidator(_sandbox_switch)] = SandboxConfig()

    @model_validator(mode="after")
    def _on_demand_is_not_autostart(self) -> ExtensionConfig:
        if self.on_demand and self.autostart and "autostart" in self.model_fields_set:
            raise PydanticCustomError(
                "on_demand_autostart",
                "give 'on_demand: true' or 'autostart: true', not both (an on-demand extension starts "
                "with its first call; 'autostart: false' beside it skips the run that learns its tools)",
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _compat(cls, data: Any) -> Any:
        """Fold the Claude Desktop / Cursor keys ``type`` and ``disabled`` into real settings."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        remote = [key for key in ("url", "serverUrl", "httpUrl") if key in data]  # Windsurf, Gemini CLI
        if remote:
            raise PydanticCustomError(
                "not_stdio",
                "only stdio servers can be supervised; '{key}' names a remote (HTTP/SSE) server",
                {"key": remote[0]},
            )
        kind = data.pop("type", "stdio")
        if kind != "stdio":
            raise PydanticCustomError(
                "not_stdio", "only stdio servers can be supervised, not type '{kind}'", {"kind": kind}
            )
        try:  # disabled, timeout, disabledTools, ...: mapped; autoApprove, ...: dropped (load() warns)
            return clientkeys.fold(data)[0]
        except clientkeys.ClientKeyError as exc:
            raise PydanticCustomError("client_key", str(exc)) from None


class SpoolConfig(_Frozen):
    """Where large media from results goes. ``dir`` None: the daemon picks a cache directory."""

    dir: Annotated[str, AfterValidator(_os_text)] | None = None
    max_inline_bytes: int = Field(262_144, ge=0, le=1024**3)  # decoded bytes; exactly this size stays inline
    max_total_bytes: int = Field(1024**3, gt=0, le=1024**5)


MIN_TOKEN_LENGTH = 16  # a bearer token guards every tool of every extension: not a password to type


class HttpConfig(_Frozen):
    """The gateway's optional streamable-HTTP listener."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)  # 0: any free port (the log line gateway.http_listening says)
    token: SecretStr | None = None  # bearer token; required when host is not a loopback address

    @model_validator(mode="after")
    def _token_off_loopback(self) -> HttpConfig:
        if self.token is not None and len(self.token.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise PydanticCustomError(
                "token_too_short", "a 'token' needs at least {n} characters", {"n": MIN_TOKEN_LENGTH}
            )
        if self.enabled and self.token is None and not is_loopback(self.host):
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


DEFAULT_MAX_TOOLS = 128  # many clients take at most 128 tools (some 40 or 50)


class ProfileConfig(_Frozen):
    """A client view: ``connect --profile NAME`` or ``/mcp/NAME``.

    ``extensions`` None: every extension. ``tools`` globs match a tool's own name or the name
    clients see (``EXT__NAME``); deny wins. ``mode: search`` lists three meta-tools instead.
    """

    extensions: list[_Name] | None = None
    tools: ToolFilter = ToolFilter()
    mode: Literal["list", "search"] = "list"
    max_tools: int = Field(DEFAULT_MAX_TOOLS, ge=1, le=100_000)  # more listed: a warning


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
        env_prefix=_ENV,
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        env_file=None,
        allow_inf_nan=False,
    )

    socket: Annotated[str, AfterValidator(_socket_path)] = Field(
        default_factory=lambda: default_socket_path(_environ()), min_length=1, validate_default=True
    )
    shutdown_timeout: _Timeout = 30.0  # daemon stop: how long to wait for every extension
    start_slots: int | None = Field(None, ge=1, le=1024)  # starts at once; None: about two per core
    spool: SpoolConfig = SpoolConfig()
    gateway: GatewayConfig = GatewayConfig()
    sandbox_defaults: SandboxConfig = (
        SandboxConfig()
    )  # the base of every extension's sandbox: (before extensions)
    extensions: dict[_Name, ExtensionConfig] = {}  # the file may call it `mcpServers`
    profiles: dict[_Name, ProfileConfig] = {}  # client views, by name
    tools_on_change: OnChange = "warn"  # extensions without their own tools_on_change

    @field_validator("extensions")
    @classmethod
    def _sandbox_defaults_merged(
        cls, extensions: dict[str, ExtensionConfig], info: ValidationInfo
    ) -> dict[str, ExtensionConfig]:
        """Each extension's sandbox on top of ``sandbox_defaults``: network from the extension if
        it gives one, paths from both. The result is what a reload compares."""
        defaults = info.data.get("sandbox_defaults")
        if defaults is None or defaults == SandboxConfig():
            return extensions
        merged = {}
        for name, extension in extensions.items():
            own = extension.sandbox
            if own.enabled:
                network = own.network if "network" in own.model_fields_set else defaults.network
                own = SandboxConfig.model_construct(  # values validated (and ${VAR}-expanded) once already
                    network=network, read=[*defaults.read, *own.read], write=[*defaults.write, *own.write]
                )
                extension = extension.model_copy(update={"sandbox": own})
            merged[name] = extension
        return merged

    @field_validator("extensions")
    @classmethod
    def _prefixes_are_unique(cls, extensions: dict[str, ExtensionConfig]) -> dict[str, ExtensionConfig]:
        """Two extensions on one gateway prefix would take each other's names as they start and stop."""
        owners: dict[str, str] = {}
        for name, ext in extensions.items():
            prefix = ext.prefix or name
            if (other := owners.setdefault(prefix, name)) != name:
                raise PydanticCustomError(
                    "shared_prefix",
                    "extensions '{first}' and '{second}' both use the gateway prefix '{prefix}' (an "
                    "extension's prefix defaults to its name); give one of them its own 'prefix:'",
                    {"first": other, "second": name, "prefix": prefix},
                )
        return extensions

    @field_validator("profiles")
    @classmethod
    def _profiles_name_extensions(
        cls, profiles: dict[str, ProfileConfig], info: ValidationInfo
    ) -> dict[str, ProfileConfig]:
        if "extensions" not in info.data:  # invalid itself: that error is reported already
            return profiles
        configured = info.data["extensions"]
        for name, profile in profiles.items():
            unknown = [e for e in profile.extensions or () if e not in configured]
            if unknown:
                raise PydanticCustomError(
                    "unknown_extension",
                    "profile '{profile}' names extensions that are not configured: {names}",
                    {"profile": name, "names": ", ".join(unknown)},
                )
        return profiles

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
    warnings: list[str] | None = None,
) -> Settings:
    """Read, merge and validate the settings; raise ConfigError listing every problem.

    *path* None means no file. *overrides* (the command line) win over ``MCP_SUPERVISOR_*`` in *environ*
    (default ``os.environ``), which wins over the file; top-level overrides that are None are ignored.
    ``${VAR}`` references and the default socket path are resolved from *environ* as well.
    Client keys that were dropped (``autoApprove``, ...) are appended to *warnings*, one line per extension.
    """
    environ = os.environ if environ is None else environ
    root, data, errors = parse(path) if path is not None else (None, {}, [])
    if warnings is not None:
        warnings += _dropped_client_keys(data.get("extensions"))
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    ctx = _Context(data, environ)
    token = _CONTEXT.set(ctx)
    try:  # validate even after file-level errors, so that every problem is listed at once
        settings = Settings(**given)
    except ValidationError as exc:
        errors += [describe(err, root, (given, ctx.env_data)) for err in exc.errors()]
    except SettingsError as exc:  # e.g. malformed JSON in a complex MCP_SUPERVISOR_* variable
        errors.append(f"environment: {exc} (give list and mapping values as JSON)")
    except RecursionError:  # json.loads of `[[[[...` in a complex MCP_SUPERVISOR_* variable
        errors.append("environment: a MCP_SUPERVISOR_* value is nested too deeply")
    finally:
        _CONTEXT.reset(token)
    if errors:
        raise ConfigError(errors)
    return settings


def _dropped_client_keys(extensions: Any) -> list[str]:
    """One line per extension naming the client keys (autoApprove, ...) that its entry loses."""
    lines = []
    for name, entry in extensions.items() if isinstance(extensions, Mapping) else ():
        try:
            dropped = clientkeys.fold(entry)[1] if isinstance(entry, Mapping) else []
        except clientkeys.ClientKeyError:  # validation reports it as an error
            continue
        if dropped:
            keys = ", ".join(dropped)
            lines.append(f"extensions.{name}: ignored {keys} (client settings mcp-supervisor does not use)")
    return lines
