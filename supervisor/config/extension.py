"""One extension's settings: a command or a URL, its restart policy, timeouts, filters, sandbox and the rest.

Client entries (Claude Desktop, Cursor, VS Code, Cline, ...) load as they are: see
:class:`ExtensionConfig` and :mod:`.clientkeys`.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
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
    header_name,
    non_empty,
    non_empty_path,
    remote_url,
)

__all__ = (
    "AnyExtension",
    "BackoffConfig",
    "ExtensionConfig",
    "OAuthSettings",
    "RemoteConfig",
    "SandboxConfig",
    "StdioConfig",
    "ToolFilter",
)


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
    cache_max: MemorySize | None = 2 * 1024**3  # its private package cache on disk; over it: emptied


def _sandbox_switch(value: Any) -> Any:
    """``sandbox: true`` is the default sandbox; ``false`` opts out; anything else is a mapping."""
    if isinstance(value, bool):
        return {"enabled": value}
    if isinstance(value, SandboxConfig | Mapping):
        return value
    raise PydanticCustomError(
        "sandbox",
        "sandbox must be false, true or a mapping (network, read, write, require, seccomp, gateway, "
        "tmp_max, pids_max, cache_max)",
    )


class ExtensionConfig(Frozen):
    """What every extension has, whatever runs it: its restart policy, timeouts, names and views.

    An entry is a :class:`StdioConfig` (``command``: a child the daemon runs) or a
    :class:`RemoteConfig` (``url``: a server it connects to); see :data:`AnyExtension`.
    """

    autostart: bool = True
    restart: Literal["always", "on-failure", "never"] = "on-failure"
    backoff: BackoffConfig = BackoffConfig()
    max_restarts: int | None = Field(None, ge=0, le=1_000_000)  # consecutive failures before `failed`
    start_timeout: Timeout = 30.0  # spawn or connect + initialize + tools/list, from the start slot's grant
    first_start_timeout: Timeout | None = None  # instead, until a first handshake (npx -y, uvx download)
    stop_timeout: Delay = 5.0  # grace after stdin close, then SIGTERM, then SIGKILL
    call_timeout: Timeout = 60.0  # inactivity budget per call; progress renews it
    call_timeout_max: Timeout = 600.0  # absolute cap per call, progress or not
    prefix: Name | None = None  # gateway tool prefix; None: the extension's name
    tools: ToolFilter = ToolFilter()  # what gateway clients see of this extension's tools
    roots: list[Annotated[Expanded, AfterValidator(absolute)]] = []  # roots/list when no client gives any
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1024**3)  # cap on one JSON-RPC message
    log_lines: int = Field(500, ge=1, le=100_000)  # stderr ring size
    on_demand: bool = False  # started by the first call; lists served from the saved catalog meanwhile
    idle_stop: Timeout | None = None  # seconds without calls before stopping; None: never
    instances: Literal["shared", "per-client"] = "shared"  # per-client: one run per gateway connection
    max_instances: int = Field(16, ge=1, le=1024)  # per-client runs at once
    ping_interval: Timeout | None = None  # liveness: ping this often; None: off
    ping_timeout: Timeout = 10.0  # no answer (nor to any call in flight) this long: restart
    tools_on_change: OnChange | None = None  # a pinned tool's definition changed; None: the top-level one

    @model_validator(mode="after")
    def _on_demand_is_not_autostart(self) -> ExtensionConfig:
        if self.on_demand and self.autostart and "autostart" in self.model_fields_set:
            raise PydanticCustomError(
                "on_demand_autostart",
                "give 'on_demand: true' or 'autostart: true', not both (an on-demand extension starts "
                "with its first call; 'autostart: false' beside it skips the run that learns its tools)",
            )
        return self


class StdioConfig(ExtensionConfig):
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
    memory_max: MemorySize | None = None  # bytes, or 512M / 1G (binary units): the whole tree's RSS
    sandbox: Annotated[SandboxConfig, BeforeValidator(_sandbox_switch)] = SandboxConfig()

    @model_validator(mode="before")
    @classmethod
    def _compat(cls, data: Any) -> Any:
        """Fold the Claude Desktop / Cursor keys ``type`` and ``disabled`` into real settings."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        kind = data.pop("type", "stdio")
        if kind != "stdio":
            raise PydanticCustomError(
                "not_stdio",
                "type '{kind}' is a remote server: give its 'url' (and no 'command')",
                {"kind": kind},
            )
        try:  # disabled, timeout, disabledTools, ...: mapped; autoApprove, ...: dropped (load() warns)
            return clientkeys.fold(data)[0]
        except clientkeys.ClientKeyError as exc:
            raise PydanticCustomError("client_key", str(exc)) from None


_SCOPE = re.compile(r"[!#-\[\]-~]+")  # RFC 6749 3.3: printable ASCII but space, '"' and '\\'


def _scope(value: str) -> str:
    if not _SCOPE.fullmatch(value):
        raise PydanticCustomError(
            "scope", "'{scope}' is not one OAuth scope (printable, no spaces)", {"scope": value}
        )
    return value


class OAuthSettings(Frozen):
    """How the daemon logs in to a remote server that asks for OAuth (see :mod:`supervisor.remote.auth`).

    Nothing set: the server's metadata says where to log in, and the client is registered there
    (a Client ID Metadata Document where the server takes one, else dynamic registration). A
    pre-registered client gives ``client_id`` (and ``client_secret``, expanded like ``env``:
    ``${credential:NAME}``); its redirect URI is ``http://127.0.0.1:PORT/callback`` with
    ``callback_port``. ``grant: client_credentials`` logs in as the client itself, no browser.
    """

    model_config = ConfigDict(populate_by_name=True)

    enabled: bool = True  # false: never log in, a 401 is an error like any other
    client_id: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(None, alias="clientId")
    client_secret: EnvValue | None = Field(None, alias="clientSecret")
    scopes: list[Annotated[str, AfterValidator(_scope)]] | None = None  # None: what the server asks
    grant: Literal["authorization_code", "client_credentials"] = "authorization_code"
    callback_port: int | None = Field(None, ge=1024, le=65535, alias="callbackPort")  # None: any free one
    # A Client ID Metadata Document you host (https, with a path): its URL is the client's id at
    # a server that takes them, instead of a registration there. Its redirect URI names callback_port.
    client_metadata_url: str | None = Field(None, alias="clientMetadataUrl")

    @model_validator(mode="after")
    def _document_names_its_port(self) -> OAuthSettings:
        url = self.client_metadata_url
        if url is None:
            return self
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "https" or not parsed.hostname or parsed.path in ("", "/"):
            raise PydanticCustomError(
                "client_metadata_url",
                "'client_metadata_url' must be an https:// URL with a path, not '{url}'",
                {"url": url},
            )
        if self.callback_port is None:
            raise PydanticCustomError(
                "client_metadata_url",
                "'client_metadata_url' needs 'callback_port': the port of the document's redirect URI",
            )
        return self

    @model_validator(mode="after")
    def _machine_needs_its_credentials(self) -> OAuthSettings:
        if self.grant == "client_credentials" and (self.client_id is None or self.client_secret is None):
            raise PydanticCustomError(
                "client_credentials", "'grant: client_credentials' needs 'client_id' and 'client_secret'"
            )
        return self


class RemoteConfig(ExtensionConfig):
    """One remote MCP server: streamable HTTP (both protocol eras) or the older HTTP+SSE.

    ``type: auto`` tries streamable HTTP and falls back to SSE when the server does not speak it.
    Header values expand like ``env`` values: ``${credential:NAME}`` and ``${file:PATH}`` are read
    at each connect, never held here nor logged. ``https://`` is verified with the system's trust
    store; plain ``http://`` is refused except to loopback unless ``allow_http`` says so.

    Client entries load as is: ``serverUrl`` (Windsurf) and ``httpUrl`` (Gemini CLI) are ``url``;
    ``type``/``transportType`` spelled ``streamable-http``, ``streamableHttp`` or ``http`` are ``http``.
    """

    url: Annotated[str, Field(strict=True), AfterValidator(expand), AfterValidator(remote_url)]
    type: Literal["auto", "http", "sse"] = "auto"
    headers: dict[Annotated[str, AfterValidator(header_name)], EnvValue] = {}
    allow_http: bool = False  # plain http:// to a host other than loopback (its traffic is readable)
    ping_interval: Timeout | None = 30.0  # nothing else notices an idle server going away
    oauth: OAuthSettings = OAuthSettings()

    @property
    def logs_in(self) -> bool:
        """Whether the daemon logs in to the server when it asks: unless switched off, or the
        config sends its own ``Authorization`` header (a static token the user manages)."""
        return self.oauth.enabled and not any(name.lower() == "authorization" for name in self.headers)

    @model_validator(mode="after")
    def _plain_http_stays_local(self) -> RemoteConfig:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme == "http" and not self.allow_http and not _loopback(parsed.hostname or ""):
            raise PydanticCustomError(
                "plain_http",
                "'{url}' is plain http:// to another host: anyone on the way reads its traffic and "
                "tokens; use https://, or 'allow_http: true' to accept that",
                {"url": self.url},
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _compat(cls, data: Any) -> Any:
        """Client spellings of the URL and the transport; the stdio-only keys named as such."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        for spelling in ("serverUrl", "httpUrl"):
            if spelling in data and "url" not in data:
                data["url"] = data.pop(spelling)
                if spelling == "httpUrl":
                    data.setdefault("type", "http")
        kind = data.pop("transportType", None)
        if kind is not None and "type" not in data:
            data["type"] = kind
        if "type" in data:
            data["type"] = _TRANSPORTS.get(data["type"], data["type"])
        stdio = [key for key in _STDIO_ONLY if key in data]
        if stdio:
            raise PydanticCustomError(
                "stdio_only",
                "'{key}' is for stdio servers; this entry has a 'url' (a remote server)",
                {"key": stdio[0]},
            )
        kept = {key: data.pop(key) for key in ("headers", "oauth") if key in data}  # clientkeys drops them
        try:
            folded = clientkeys.fold(data)[0]
        except clientkeys.ClientKeyError as exc:
            raise PydanticCustomError("client_key", str(exc)) from None
        return {**folded, **kept}


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_STDIO_ONLY = ("command", "args", "env", "cwd", "sandbox", "memory_max")
_TRANSPORTS = {"streamable-http": "http", "streamableHttp": "http", "streamable_http": "http"}


def _kind(value: Any) -> str:
    """Which kind an entry is: one with a URL (any client's spelling) is remote."""
    if isinstance(value, Mapping):
        return "(remote)" if any(key in value for key in ("url", "serverUrl", "httpUrl")) else "(stdio)"
    return "(remote)" if isinstance(value, RemoteConfig) else "(stdio)"


# An extension entry, either kind. The tags never show in an error: config.file leaves them out.
AnyExtension = Annotated[
    Annotated[StdioConfig, Tag("(stdio)")] | Annotated[RemoteConfig, Tag("(remote)")],
    Discriminator(_kind),
]
