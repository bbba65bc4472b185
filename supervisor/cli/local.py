"""The commands that work on files or run the daemon: check-config, import, client-config, daemon."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from supervisor import paths
from supervisor.errors import ConfigError, SupervisorError

if TYPE_CHECKING:
    from supervisor.config.settings import Settings

from supervisor.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail

__all__ = ("check_config", "client_config", "daemon", "import_servers", "load_settings")

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def load_settings(
    path: str,
    overrides: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    from supervisor.config import (
        settings as config,  # pydantic-settings: only the commands that read a config pay for it
    )

    try:
        return config.load(path, overrides=overrides, warnings=warnings, environ=environ)
    except ConfigError as exc:
        if len(exc.errors) == 1 and exc.errors[0].startswith(path):
            raise  # already names the file: "x.yaml: No such file or directory"
        problems = "\n".join(f"  {line}" for line in exc.errors)
        raise ConfigError([f"{path} is not valid:\n{problems}"]) from None


def check_config(args: argparse.Namespace) -> int:
    args.config = args.config or paths.default_config_path()  # the daemon's, as `daemon` finds it
    warnings: list[str] = []
    settings = load_settings(args.config, warnings=warnings)
    names = list(settings.extensions)
    for warning in warnings:
        fail(f"warning: {warning}")
    if args.explain:
        return _explain(settings, args.config, args.explain)
    listed = f": {', '.join(names)}" if names else ""
    print(f"{args.config}: OK ({len(names)} extension{'' if len(names) == 1 else 's'}{listed})")
    return EXIT_OK


def _explain(settings: Settings, config_path: str, names: list[str]) -> int:
    from supervisor.config.settings import RemoteConfig
    from supervisor.daemon.identity import sandbox_context
    from supervisor.process import sandbox
    from supervisor.remote import explain as remote

    unknown = [name for name in names if name not in settings.extensions]
    if unknown:
        fail(f"no extension named {', '.join(map(repr, unknown))} in {config_path}")
        return EXIT_USAGE
    context = sandbox_context(settings, config_path=config_path, environ=os.environ)
    running = anyio.run(_explained_by_the_daemon, settings.socket, names)
    for name in names:
        lines, config = running.get(name), settings.extensions[name]
        if isinstance(config, RemoteConfig):
            lines = remote.explain(name, config)
        elif lines is None:
            lines = sandbox.explain_extension(name, settings.extensions[name], context)
            lines.insert(1, "  (no daemon runs it: as one started from this shell would confine it)")
        else:
            lines.insert(1, f"  (as the daemon on {settings.socket} confines it, in its running config)")
        print("\n".join(lines))
    return EXIT_OK


async def _explained_by_the_daemon(socket: str, names: list[str]) -> dict[str, list[str]]:
    """What the daemon on *socket* says of each of *names* it runs: its environment, state and
    spool are what its extensions are confined by (a systemd unit's ``STATE_DIRECTORY``, say)."""
    from supervisor.control.client import request

    found: dict[str, list[str]] = {}
    for name in names:
        try:
            found[name] = list((await request(socket, "explain", {"name": name}, timeout=30))["lines"])
        except SupervisorError:  # no daemon there, or not one that has this extension (yet)
            continue
    return found


def import_servers(args: argparse.Namespace) -> int:
    from supervisor.config import migrate

    config_path = Path(os.path.expanduser(args.config or paths.default_config_path()))
    request = migrate.Request(
        args.file,
        config_path,
        force=args.force,
        rewrite_client=args.rewrite_client,
        dry_run=args.dry_run,
        workspace=args.workspace,
        project=args.project,
        socket=args.socket,
    )

    def socket_of(path: Path, environ: Mapping[str, str]) -> str:
        return load_settings(str(path), overrides={"socket": args.socket}, environ=dict(environ)).socket

    migrate.run_import(request, load=socket_of, say=print)
    return EXIT_OK


def client_config(args: argparse.Namespace) -> int:
    from supervisor.config import snippets as clientconfig

    if args.http:
        return _http_client_config(args)
    socket = args.socket
    if socket is None and args.config:
        socket = load_settings(args.config).socket
    command_args = clientconfig.connect_args(socket, args.profile)
    print(clientconfig.snippet(args.client, clientconfig.connect_command(), command_args))
    return EXIT_OK


def _http_client_config(args: argparse.Namespace) -> int:
    """The entry for a client that speaks streamable HTTP and sends headers: URL and bearer token
    (made now, as the daemon would at its start, if neither the config nor the state has one)."""
    from supervisor.config import snippets as clientconfig
    from supervisor.daemon.httptoken import gateway_token

    path = args.config or paths.default_config_path()
    http = load_settings(path).gateway.http
    if not http.enabled or http.port == 0:
        say = "is off" if not http.enabled else "listens on any free port (port: 0)"
        fail(f"the HTTP gateway of {path} {say}; set gateway.http (enabled, port)")
        return EXIT_USAGE
    if args.client == "claude":
        fail("Claude Desktop takes no headers in its file: use the connect entry (without --http)")
        return EXIT_USAGE
    try:
        token, _ = gateway_token(http.token.get_secret_value() if http.token else None, os.environ)
    except SupervisorError as exc:
        fail(str(exc))
        return EXIT_FAILED
    host = f"[{http.host}]" if ":" in http.host else http.host
    url = f"http://{'127.0.0.1' if http.host in ('0.0.0.0', '::') else host}:{http.port}/mcp"
    url += f"/{args.profile}" if args.profile else ""
    print(clientconfig.http_snippet(args.client, url, {"Authorization": f"Bearer {token}"}))
    return EXIT_OK


def daemon(args: argparse.Namespace) -> int:
    _return_big_buffers_to_the_system()  # before the imports below allocate and free big blocks
    warnings: list[str] = []
    settings = load_settings(args.config or paths.default_config_path(), {"socket": args.socket}, warnings)
    from supervisor.daemon import run as daemon  # lazily: client commands need not import the whole daemon

    path = args.config or paths.default_config_path()
    overrides = {"socket": args.socket}
    log_json = {"auto": None, "json": True, "console": False}[args.log_format]
    run = partial(
        daemon.run, settings, config_path=path, overrides=overrides, warnings=warnings, log_json=log_json
    )
    _exit_now(anyio.run(run, backend="asyncio", backend_options={"use_uvloop": True}))


def _exit_now(code: int) -> NoReturn:
    """End the daemon without the interpreter's teardown of its modules: that takes 0.3 s and more
    on a busy host, counted against ``shutdown_timeout``, and by now every child, socket and
    file is closed and every log line written."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _return_big_buffers_to_the_system() -> None:
    """Serve every allocation over 1 MiB from its own mapping, returned to the OS when freed.

    glibc raises its mmap threshold each time a big block is freed, after which multi-MB
    messages come from the heap and a freed one is not always reusable: a 20 MiB image then
    peaked at 4x its size in about half the calls instead of 2.7x (bench/media.py). Process-wide,
    so the entry point decides it, as early as it can: startup frees also raise the thresholds.
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to tune
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 128 << 10)  # the default, which startup frees have raised
