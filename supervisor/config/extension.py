"""One extension's settings: the command, its restart policy, timeouts, filters, sandbox and the rest.

Client entries (Claude Desktop, Cursor, VS Code, Cline, ...) load as they are: see
:class:`ExtensionConfig` and :mod:`.clientkeys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from supervisor.config import clientkeys
from supervisor.config.fields import (
    Delay,
    EnvValue,
    Expanded,
    Frozen,
    MemorySize,
    Name,
    OnChange,
    Timeout,
    absolute,
    directory,
    env_name,
    expand,
    non_empty,
    non_empty_path,
)

__all__ = ("BackoffConfig", "ExtensionConfig", "SandboxConfig", "ToolFilter")


class BackoffConfig(Frozen):
    """Restart delays: ``initial * multiplier**n`` up to ``max``, +/- ``jitter``; reset after a stable run."""

    initial: Delay = 0.5
    max: Delay = 30.0
    multiplier: float = Field(2.0, ge=1, le=1000)
    jitter: float = Field(0.1, ge=0, le=1)
    reset_after: Delay = 60.0


class ToolFilter(Frozen):
    """Glob patterns on a tool's original name: shown when it matches ``allow`` and no ``deny``."""

    allow: list[str] = ["*"]
    deny: list[str] = []


class SandboxConfig(Frozen):
    """What a confined extension may reach beyond its base (see :mod:`supervisor.process.sandbox`).

    ``read``/``write``: paths; ``~`` and globs expand at each start, ``${VAR}`` at load.
    ``sandbox: false`` in the file is ``enabled: false`` here (unconfined). The sandbox is best
    effort (each layer the host has); ``require: full`` refuses to start with a layer missing.
    """

    enabled: bool = True
    network: Literal["none", "outbound", "all"] = "all"  # outbound: TCP connect, no bind
    read: list[Annotated[Expanded, AfterValidator(non_empty_path)]] = []
    write: list[Annotated[Expanded, AfterValidator(non_empty_path)]] = []
    require: Literal["full"] | None = None  # full: refuse to start where the host lacks a layer
    seccomp: bool = True  # false: no filter of system calls (a server that makes user namespaces)
    gateway: bool = False  # true: it may call the gateway's HTTP listener (other extensions' tools)
    tmp_max: MemorySize = 512 * 1024**2  # TMPDIR and /dev/shm: memory (tmpfs) of this size each
    pids_max: int | None = Field(1024, ge=8, le=4_194_304)  # tasks (processes, threads) of its tree


def _sandbox_switch(value: Any) -> Any:
    """``sandbox: true`` is the default sandbox; ``false`` opts out; anything else is a mapping."""
    if isinstance(value, bool):
        return {"enabled": value}
    if isinstance(value, SandboxConfig | Mapping):
        return value
    raise PydanticCustomError(
        "sandbox",
        "sandbox must be false, true or a mapping (network, read, write, require, seccomp, gateway, "
        "tmp_max, pids_max)",
    )


class ExtensionConfig(Frozen):
    """One stdio MCP server. ``${VAR}`` expands in command, args, env values and cwd at load time.

    ``${file:PATH}`` and ``${credential:NAME}`` in an env value stay references (the value is a
    :class:`~supervisor.config.secrets.EnvTemplate`): the secret is read at spawn, never held here.

    Client entries (Claude Desktop, Cursor, VS Code, Cline, ...) load as is: ``type: stdio`` is accepted,
    ``disabled: true`` means ``autostart: false``, ``timeout`` is ``call_timeout`` and the other keys
    of :mod:`supervisor.config.clientkeys` are mapped or dropped; none is kept as a field, so equal settings
    compare equal.
    """

    model_config = ConfigDict(coerce_numbers_to_str=True)  # `args: [--port, 8080]` is common in YAML

    command: Annotated[str, Field(strict=True), AfterValidator(expand), AfterValidator(non_empty)]  # 5: no
    args: list[Expanded] = []
    env: dict[Annotated[str, AfterValidator(env_name)], EnvValue] = {}
    cwd: Annotated[Expanded, AfterValidator(directory)] | None = None
    autostart: bool = True
    restart: Literal["always", "on-failure", "never"] = "on-failure"
    backoff: BackoffConfig = BackoffConfig()
    max_restarts: int | None = Field(None, ge=0, le=1_000_000)  # consecutive failures before `failed`
    start_timeout: Timeout = 30.0  # spawn + initialize + tools/list, from the start slot's grant
    first_start_timeout: Timeout | None = None  # instead, until a first handshake (npx -y, uvx download)
    stop_timeout: Delay = 5.0  # grace after stdin close, then SIGTERM, then SIGKILL
    call_timeout: Timeout = 60.0  # inactivity budget per call; progress renews it
    call_timeout_max: Timeout = 600.0  # absolute cap per call, progress or not
    prefix: Name | None = None  # gateway tool prefix; None: the extension's name
    tools: ToolFilter = ToolFilter()  # what gateway clients see of this extension's tools
    roots: list[Annotated[Expanded, AfterValidator(absolute)]] = []  # roots/list when no client gives any
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1024**3)  # cap on one stdout JSON-RPC line
    log_lines: int = Field(500, ge=1, le=100_000)  # stderr ring size
    on_demand: bool = False  # started by the first call; lists served from the saved catalog meanwhile
    idle_stop: Timeout | None = None  # seconds without calls before stopping; None: never
    instances: Literal["shared", "per-client"] = "shared"  # per-client: one child per gateway connection
    max_instances: int = Field(16, ge=1, le=1024)  # per-client children at once
    ping_interval: Timeout | None = None  # liveness: ping this often; None: off
    ping_timeout: Timeout = 10.0  # no answer (nor to any call in flight) this long: restart
    memory_max: MemorySize | None = None  # bytes, or 512M / 1G (binary units): the whole tree's RSS
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
