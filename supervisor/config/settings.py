"""Settings: frozen pydantic models, loaded from overrides > ``MCP_SUPERVISOR_*`` env > YAML file > defaults.

Only ``daemon`` and ``cli`` load them; everything else receives plain model values. The field
types are in :mod:`.fields`, one extension's settings in :mod:`.extension`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
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
from supervisor.config.extension import (
    AnyExtension,
    BackoffConfig,
    ExtensionConfig,
    RemoteConfig,
    SandboxConfig,
    StdioConfig,
    ToolFilter,
)
from supervisor.config.fields import (
    LOADING,
    Frozen,
    Loading,
    Name,
    OnChange,
    Timeout,
    loading_environ,
    os_text,
    socket_path,
)
from supervisor.config.file import describe, parse
from supervisor.errors import ConfigError
from supervisor.paths import ENV_PREFIX as _ENV
from supervisor.paths import default_config_path, default_socket_path, is_loopback

__all__ = (
    "BackoffConfig",
    "ConfigError",
    "DashboardConfig",
    "ExtensionConfig",
    "GatewayConfig",
    "HttpConfig",
    "ProfileConfig",
    "RemoteConfig",
    "SandboxConfig",
    "Settings",
    "SpoolConfig",
    "StdioConfig",
    "ToolFilter",
    "default_config_path",
    "default_socket_path",
    "load",
)


class SpoolConfig(Frozen):
    """Where large media from results goes. ``dir`` None: the daemon picks a cache directory."""

    dir: Annotated[str, AfterValidator(os_text)] | None = None
    max_inline_bytes: int = Field(262_144, ge=0, le=1024**3)  # decoded bytes; exactly this size stays inline
    max_total_bytes: int = Field(1024**3, gt=0, le=1024**5)


MIN_TOKEN_LENGTH = 16  # a bearer token guards every tool of every extension: not a password to type


class HttpConfig(Frozen):
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


class GatewayConfig(Frozen):
    """The MCP gateway; its unix socket is always on, beside the control socket."""

    http: HttpConfig = HttpConfig()
    max_name_length: int = Field(64, ge=16, le=64)  # exposed tool/prompt names; clients cap at 64


class DashboardConfig(Frozen):
    """The web page on the HTTP listener (``/``), opened by ``mcp-supervisor dashboard``.

    With the HTTP gateway off, the listener starts at the first ``dashboard`` command, serving
    the page only. ``read_only``: every page shows, nothing can be started, stopped or approved.
    """

    enabled: bool = True
    read_only: bool = False


DEFAULT_MAX_TOOLS = 128  # many clients take at most 128 tools (some 40 or 50)


class ProfileConfig(Frozen):
    """A client view: ``connect --profile NAME`` or ``/mcp/NAME``.

    ``extensions`` None: every extension. ``tools`` globs match a tool's own name or the name
    clients see (``EXT__NAME``); deny wins. ``mode: search`` lists three meta-tools instead.
    """

    extensions: list[Name] | None = None
    tools: ToolFilter = ToolFilter()
    mode: Literal["list", "search"] = "list"
    max_tools: int = Field(DEFAULT_MAX_TOOLS, ge=1, le=100_000)  # more listed: a warning


class _EnvSource(EnvSettingsSource):
    """``MCP_SUPERVISOR_*`` from the load's environ rather than ``os.environ``; records what it supplied."""

    def __init__(self, settings_cls: type[BaseSettings], ctx: Loading) -> None:
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

    socket: Annotated[str, AfterValidator(socket_path)] = Field(
        default_factory=lambda: default_socket_path(loading_environ()), min_length=1, validate_default=True
    )
    shutdown_timeout: Timeout = 30.0  # daemon stop: how long to wait for every extension
    start_slots: int | None = Field(None, ge=1, le=1024)  # starts at once; None: about two per core
    spool: SpoolConfig = SpoolConfig()
    gateway: GatewayConfig = GatewayConfig()
    dashboard: DashboardConfig = DashboardConfig()
    sandbox_defaults: SandboxConfig = (
        SandboxConfig()
    )  # the base of every extension's sandbox: (before extensions)
    extensions: dict[Name, AnyExtension] = {}  # the file may call it `mcpServers`
    profiles: dict[Name, ProfileConfig] = {}  # client views, by name
    tools_on_change: OnChange = "warn"  # extensions without their own tools_on_change

    @field_validator("extensions")
    @classmethod
    def _sandbox_defaults_merged(
        cls, extensions: dict[str, AnyExtension], info: ValidationInfo
    ) -> dict[str, AnyExtension]:
        """Each extension's sandbox on top of ``sandbox_defaults``: network, require, seccomp,
        gateway, tmp_max, pids_max and cache_max from the extension if it gives them, paths from both. The
        result is what a reload compares."""
        defaults = info.data.get("sandbox_defaults")
        if defaults is None or defaults == SandboxConfig():
            return extensions
        merged: dict[str, AnyExtension] = {}
        for name, extension in extensions.items():
            if not isinstance(extension, StdioConfig):  # a remote server runs nothing here
                merged[name] = extension
                continue
            own = extension.sandbox
            if own.enabled:
                given = own.model_fields_set
                network = own.network if "network" in given else defaults.network
                own = SandboxConfig.model_construct(  # values validated (and ${VAR}-expanded) once already
                    network=network,
                    read=[*defaults.read, *own.read],
                    write=[*defaults.write, *own.write],
                    require=own.require if "require" in given else defaults.require,
                    seccomp=own.seccomp if "seccomp" in given else defaults.seccomp,
                    gateway=own.gateway if "gateway" in given else defaults.gateway,
                    tmp_max=own.tmp_max if "tmp_max" in given else defaults.tmp_max,
                    pids_max=own.pids_max if "pids_max" in given else defaults.pids_max,
                    cache_max=own.cache_max if "cache_max" in given else defaults.cache_max,
                )
                extension = extension.model_copy(update={"sandbox": own})
            merged[name] = extension
        return merged

    @field_validator("extensions")
    @classmethod
    def _prefixes_are_unique(cls, extensions: dict[str, AnyExtension]) -> dict[str, AnyExtension]:
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
        ctx = LOADING.get() or Loading({}, os.environ)
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
    ctx = Loading(data, environ)
    token = LOADING.set(ctx)
    try:  # validate even after file-level errors, so that every problem is listed at once
        settings = Settings(**given)
    except ValidationError as exc:
        errors += [describe(err, root, (given, ctx.env_data)) for err in exc.errors()]
    except SettingsError as exc:  # e.g. malformed JSON in a complex MCP_SUPERVISOR_* variable
        errors.append(f"environment: {exc} (give list and mapping values as JSON)")
    except RecursionError:  # json.loads of `[[[[...` in a complex MCP_SUPERVISOR_* variable
        errors.append("environment: a MCP_SUPERVISOR_* value is nested too deeply")
    finally:
        LOADING.reset(token)
    if errors:
        raise ConfigError(errors)
    return settings


def _dropped_client_keys(extensions: Any) -> list[str]:
    """One line per extension naming the client keys (autoApprove, ...) that its entry loses."""
    lines = []
    for name, entry in extensions.items() if isinstance(extensions, Mapping) else ():
        if isinstance(entry, Mapping) and any(key in entry for key in ("url", "serverUrl", "httpUrl")):
            entry = {key: value for key, value in entry.items() if key != "headers"}  # a remote's own
        try:
            dropped = clientkeys.fold(entry)[1] if isinstance(entry, Mapping) else []
        except clientkeys.ClientKeyError:  # validation reports it as an error
            continue
        if dropped:
            keys = ", ".join(dropped)
            lines.append(f"extensions.{name}: ignored {keys} (client settings mcp-supervisor does not use)")
    return lines
