"""The ``mcp-supervisor`` command: parses arguments, asks the daemon, prints. Nothing else.

Every failure ends as one sentence on stderr prefixed ``mcp-supervisor:`` and one of the exit
codes below; ``main`` never raises for a failure it knows about.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from supervisor import paths
from supervisor.cli import render
from supervisor.control import client
from supervisor.control.client import DaemonUnreachable, RemoteError
from supervisor.control.codes import CONFIG_INVALID
from supervisor.errors import ConfigError, SupervisorError

if TYPE_CHECKING:
    from supervisor.config.settings import Settings

__all__ = ("EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main")

EXIT_OK = 0
EXIT_FAILED = 1  # the operation failed; the message says why
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
EXIT_USAGE = 2  # bad command line or bad config
EXIT_UNREACHABLE = 3  # no daemon on the control socket

_PROG = "mcp-supervisor"
_QUERY_TIMEOUT = 30.0  # status, tools, logs: they answer from memory
_ALL_CONCURRENCY = 16  # requests in flight for --all, well under the daemon's connection cap
_MAX_LOG_LINES = 10_000
CLIENT_NAMES = ("claude", "cursor", "windsurf", "vscode", "claude-code")  # clientconfig.CLIENTS, unimported


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _fail(message: str) -> None:
    print(f"{_PROG}: {message}", file=sys.stderr)


async def _status(args: argparse.Namespace) -> int:
    params = {"name": args.name} if args.name else {}
    result = await client.request(args.socket, "status", params, timeout=_QUERY_TIMEOUT)
    if args.json:
        _print_json(result)
    else:
        print(render.status_table(result["extensions"], instances=bool(args.name)))
        _print_profiles(result.get("profiles"))
    return EXIT_OK


def _action_problem(command: str, record: dict[str, Any], wait: bool) -> str | None:
    """Why *record* means the *command* failed, or None."""
    state = record["state"]
    wanted = "stopped" if command == "stop" else "running"
    if state == wanted or (not wait and state != "failed"):
        return None
    reason = record.get("last_error") or render.exit_text(record.get("last_exit")) or f"it is {state}"
    return f"extension {record['name']!r} failed to {command}: {reason}"


async def _act_on_all(args: argparse.Namespace, wait: bool) -> list[dict[str, Any] | RemoteError]:
    """Run the command on every configured extension at once; outcomes in configured order."""
    status = await client.request(args.socket, "status", timeout=_QUERY_TIMEOUT)
    names = [record["name"] for record in status["extensions"]]
    outcomes: dict[str, dict[str, Any] | RemoteError] = {}
    limiter = anyio.CapacityLimiter(_ALL_CONCURRENCY)

    async def act(name: str) -> None:
        async with limiter:
            try:
                outcomes[name] = await client.request(args.socket, args.command, {"name": name, "wait": wait})
            except RemoteError as exc:
                outcomes[name] = RemoteError(exc.code, f"{name}: {exc}", exc.data)

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(act, name)
    return [outcomes[name] for name in names]


async def _action(args: argparse.Namespace) -> int:
    wait = not args.no_wait
    if args.name:
        outcomes = [await client.request(args.socket, args.command, {"name": args.name, "wait": wait})]
    else:
        outcomes = await _act_on_all(args, wait)
    records = [outcome for outcome in outcomes if isinstance(outcome, dict)]
    if records:
        print(render.status_table(records))
    problems = [
        str(outcome) if isinstance(outcome, RemoteError) else _action_problem(args.command, outcome, wait)
        for outcome in outcomes
    ]
    failures = [problem for problem in problems if problem]
    for problem in failures:
        _fail(problem)
    return EXIT_FAILED if failures else EXIT_OK


async def _tools(args: argparse.Namespace) -> int:
    params = {"name": args.name} if args.name else {}
    result = await client.request(args.socket, "tools", params, timeout=_QUERY_TIMEOUT)
    if args.json:
        _print_json(result)
    else:
        print(render.tools_table(result["tools"], shutil.get_terminal_size((100, 24)).columns))
        if (changes := render.changes_text(result["tools"])) is not None:
            print(f"\n{changes}")
        _print_profiles(result.get("profiles"))
    return EXIT_OK


async def _approve(args: argparse.Namespace) -> int:
    params = {"name": args.name, **({"tool": args.tool} if args.tool else {})}
    result = await client.request(args.socket, "approve", params, timeout=_QUERY_TIMEOUT)
    if args.json:
        _print_json(result)
    elif result["approved"]:
        print(f"approved: {', '.join(result['approved'])} (pinned to the current definition)")
    else:
        which = f"{args.name!r} has no tool that"
        if args.tool:
            which = f"tool {args.tool!r} of {args.name!r} has not"
        print(f"nothing to approve: {which} changed since pinned")
    return EXIT_OK


def _print_profiles(profiles: list[dict[str, Any]] | None) -> None:
    text = render.profiles_table(profiles or [])
    if text is not None:
        print(f"\n{text}")


def _arguments(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _UsageError(f"--args is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _UsageError(f'--args must be a JSON object such as \'{{"text": "hi"}}\', not {text!r}')
    return value


class _StatusLine:
    """The call's progress as one line on a terminal, rewritten in place and erased at the end."""

    def __init__(self, tool: str) -> None:
        self._tool, self._shown = tool, False

    def show(self, method: str, params: dict[str, Any]) -> None:
        progress, total, message = params.get("progress"), params.get("total"), params.get("message")
        if method != "progress" or not isinstance(progress, int | float):
            return
        text = f"{self._tool}: {progress:g}" + (f"/{total:g}" if isinstance(total, int | float) else "")
        if isinstance(message, str) and message:
            text += f" {message}"
        width = max(10, shutil.get_terminal_size().columns - 1)
        text = "".join(c if c.isprintable() else " " for c in text)[:width]  # no escapes from a child
        sys.stderr.write(f"\r\x1b[K{text}")
        sys.stderr.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


async def _call(args: argparse.Namespace) -> int:
    params = {"name": args.name, "tool": args.tool, "arguments": _arguments(args.args)}
    status = _StatusLine(args.tool) if sys.stderr.isatty() else None  # nothing when not a terminal
    try:
        if status is not None:
            params["progress"] = True
        on_progress = status.show if status is not None else None
        result = await client.request(args.socket, "call", params, on_notification=on_progress)
    finally:
        if status is not None:
            status.clear()
    failed = bool(result.get("isError"))
    if args.json:
        _print_json(result)
    elif failed:
        text = render.result_text(result) or "no details"
        separator = "\n" if "\n" in text else " "
        _fail(f"tool {args.tool!r} of {args.name!r} reported an error:{separator}{text}")
    else:
        text = render.result_text(result)
        if text:
            print(text)
    return EXIT_FAILED if failed else EXIT_OK


async def _logs(args: argparse.Namespace) -> int:
    result = await client.request(
        args.socket, "logs", {"name": args.name, "lines": args.lines}, timeout=_QUERY_TIMEOUT
    )
    for line in result["lines"]:
        print(line.removesuffix("\n"))
    return EXIT_OK


async def _reload(args: argparse.Namespace) -> int:
    try:
        report = await client.request(args.socket, "reload", {})
    except RemoteError as exc:
        if exc.code != CONFIG_INVALID or not isinstance(exc.data, dict):
            raise
        _fail(f"{exc.message}:")
        for problem in exc.data.get("errors", []):
            print(f"  {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        _print_json(report)
        return EXIT_OK
    for key, label in (("added", "started"), ("removed", "stopped and removed"), ("restarted", "restarted")):
        print(f"{label}: {', '.join(report[key]) or '-'}")
    if report["needs_restart"]:
        print(f"not applied until the daemon restarts: {', '.join(report['needs_restart'])}")
    return EXIT_OK


async def _health(args: argparse.Namespace) -> int:
    if args.prometheus:
        result = await client.request(args.socket, "health", {"format": "prometheus"}, timeout=_QUERY_TIMEOUT)
        print(result["text"], end="")
        return EXIT_OK
    report = await client.request(args.socket, "health", {}, timeout=_QUERY_TIMEOUT)
    if args.json:
        _print_json(report)
        return EXIT_OK
    print(render.health_text(report))
    return EXIT_OK


async def _connect(args: argparse.Namespace) -> int:
    from supervisor.cli import connect

    path = connect.gateway_socket(args.socket)
    return await connect.run(path, reconnect_timeout=args.reconnect_timeout, profile=args.profile)


def _load(
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


def _check_config(args: argparse.Namespace) -> int:
    warnings: list[str] = []
    settings = _load(args.config, warnings=warnings)
    names = list(settings.extensions)
    for warning in warnings:
        _fail(f"warning: {warning}")
    if args.explain:
        return _explain(settings, args.config, args.explain)
    listed = f": {', '.join(names)}" if names else ""
    print(f"{args.config}: OK ({len(names)} extension{'' if len(names) == 1 else 's'}{listed})")
    return EXIT_OK


def _explain(settings: Settings, config_path: str, names: list[str]) -> int:
    from supervisor.daemon.root import sandbox_context
    from supervisor.process import sandbox

    unknown = [name for name in names if name not in settings.extensions]
    if unknown:
        _fail(f"no extension named {', '.join(map(repr, unknown))} in {config_path}")
        return EXIT_USAGE
    context = sandbox_context(settings, config_path=config_path, environ=os.environ)
    for name in names:
        print("\n".join(sandbox.explain_extension(name, settings.extensions[name], context)))
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
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

    def load(path: Path, environ: Mapping[str, str]) -> str:
        return _load(str(path), overrides={"socket": args.socket}, environ=dict(environ)).socket

    migrate.run_import(request, load=load, say=print)
    return EXIT_OK


def _client_config(args: argparse.Namespace) -> int:
    from supervisor.config import snippets as clientconfig

    socket = args.socket
    if socket is None and args.config:
        socket = _load(args.config).socket
    command_args = clientconfig.connect_args(socket, args.profile)
    print(clientconfig.snippet(args.client, clientconfig.connect_command(), command_args))
    return EXIT_OK


def _daemon(args: argparse.Namespace) -> int:
    _return_big_buffers_to_the_system()  # before the imports below allocate and free big blocks
    warnings: list[str] = []
    settings = _load(args.config or paths.default_config_path(), {"socket": args.socket}, warnings)
    from supervisor.daemon import run as daemon  # lazily: client commands need not import the whole daemon

    path = args.config or paths.default_config_path()
    overrides = {"socket": args.socket}
    run = partial(daemon.run, settings, config_path=path, overrides=overrides, warnings=warnings)
    _exit_now(anyio.run(run, backend="asyncio"))


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


def _line_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= _MAX_LOG_LINES:
        raise argparse.ArgumentTypeError(f"must be between 1 and {_MAX_LOG_LINES}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("must be a finite number of seconds, 0 or more")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=_PROG, description="Supervise stdio MCP servers.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    socket_help = "the daemon's control socket (default: $MCP_SUPERVISOR_SOCKET, else a per-user path)"
    remote = _Parser(add_help=False)
    remote.add_argument("--socket", metavar="PATH", help=socket_help)

    def add(
        name: str, run: Callable[..., Any], help_text: str, *, is_async: bool = True
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, parents=[remote] if is_async else [], help=help_text, description=help_text
        )
        sub.set_defaults(run=run, is_async=is_async)
        return sub

    sub = add("daemon", _daemon, "run the supervisor in the foreground", is_async=False)
    sub.add_argument("-c", "--config", metavar="CONFIG", help="config file (default: $MCP_SUPERVISOR_CONFIG)")
    sub.add_argument("--socket", metavar="PATH", help="control socket, overriding the config")
    sub = add("status", _status, "show the state of each extension")
    sub.add_argument("name", nargs="?", metavar="NAME")
    sub.add_argument("--json", action="store_true", help="print the raw status records")
    for verb in ("start", "stop", "restart"):
        sub = add(verb, _action, f"{verb} one extension, or all of them")
        sub.add_argument("name", nargs="?", metavar="NAME")
        sub.add_argument("--all", action="store_true", help="every configured extension")
        sub.add_argument("--no-wait", action="store_true", help="return without waiting for the outcome")
    sub = add("tools", _tools, "list the tools of running extensions")
    sub.add_argument("name", nargs="?", metavar="NAME")
    sub.add_argument("--json", action="store_true", help="print the raw tool list")
    sub = add("call", _call, "call one tool and print its result")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("tool", metavar="TOOL")
    sub.add_argument("--args", metavar="JSON", help="the tool's arguments, a JSON object")
    sub.add_argument("--json", action="store_true", help="print the raw result")
    sub = add("approve", _approve, "accept the changed definitions of an extension's tools (pin them)")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("tool", nargs="?", metavar="TOOL", help="only this tool (default: every changed one)")
    sub.add_argument("--json", action="store_true", help="print the raw result")
    sub = add("logs", _logs, "print the last lines an extension wrote to stderr")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("-n", "--lines", type=_line_count, default=50, metavar="N", help="how many (default 50)")
    sub = add("reload", _reload, "re-read the config: start added, stop removed, restart changed extensions")
    sub.add_argument("--json", action="store_true", help="print the raw report")
    sub = add("health", _health, "diagnostics of the daemon itself")
    output = sub.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the raw report")
    output.add_argument(
        "--prometheus", action="store_true", help="print metrics in the Prometheus text format"
    )
    sub = add("connect", _connect, "an MCP server on stdio for MCP clients: a pipe to the daemon's gateway")
    sub.add_argument(
        "--reconnect-timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="when the daemon goes away, keep trying to reconnect this long (default 60)",
    )
    sub.add_argument(
        "--profile", metavar="NAME", help="see the tools of this profile of the config only (default: all)"
    )
    sub = add("check-config", _check_config, "validate a config file", is_async=False)
    sub.add_argument("config", metavar="CONFIG")
    sub.add_argument(
        "--explain",
        metavar="NAME",
        action="append",
        help="print what extension NAME's sandbox grants and hides, and why (repeatable)",
    )
    sub = add(
        "import",
        _import,
        "add the stdio servers of an MCP client's config file to the config",
        is_async=False,
    )
    sub.add_argument("file", metavar="FILE", help="claude_desktop_config.json, mcp.json, .mcp.json, ...")
    sub.add_argument(
        "-c", "--config", metavar="CONFIG", help="config to add to (default: $MCP_SUPERVISOR_CONFIG)"
    )
    sub.add_argument("--force", action="store_true", help="replace extensions of the same name")
    sub.add_argument(
        "--rewrite-client",
        action="store_true",
        help="then replace them in FILE by one connect entry (backup)",
    )
    sub.add_argument("--dry-run", action="store_true", help="print what would be done, write nothing")
    sub.add_argument(
        "--workspace", metavar="DIR", help="what ${workspaceFolder} means (default: FILE's project)"
    )
    sub.add_argument("--project", metavar="DIR", help="~/.claude.json: that project's servers instead")
    sub.add_argument("--socket", metavar="PATH", help="the daemon's socket, for the connect entry")
    sub = add(
        "client-config",
        _client_config,
        "print the entry an MCP client needs to use the daemon",
        is_async=False,
    )
    sub.add_argument("--client", choices=list(CLIENT_NAMES), default="claude", help="default: claude")
    sub.add_argument("--profile", metavar="P", help="a profile of the config (connect --profile)")
    sub.add_argument("--socket", metavar="PATH", help="the daemon's socket, when not the default")
    sub.add_argument("-c", "--config", metavar="CONFIG", help="take the socket from this config")
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command in ("start", "stop", "restart") and bool(args.name) == bool(args.all):
        raise _UsageError(f"give either NAME or --all (see '{_PROG} {args.command} --help')")
    if getattr(args, "is_async", False) and not args.socket:
        args.socket = paths.default_socket_path()
    return args


def _report(exc: BaseException) -> int:
    """Print *exc* as one sentence and return its exit code; re-raise what is not ours (a bug)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, BrokenPipeError):  # `mcp-supervisor logs x | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    if isinstance(exc, _UsageError | ConfigError):
        code = EXIT_USAGE
    elif isinstance(exc, DaemonUnreachable):
        code = EXIT_UNREACHABLE
    elif isinstance(exc, SupervisorError):
        code = EXIT_FAILED
    elif isinstance(exc, OSError):
        _fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))
        return EXIT_FAILED
    elif isinstance(exc, KeyboardInterrupt):
        _fail("interrupted")
        return EXIT_FAILED
    else:
        raise exc
    _fail(str(exc))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``mcp-supervisor`` command and return its exit code (``sys.exit(main())``)."""
    try:
        args = _parse(argv)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except _UsageError as exc:
        return _report(exc)
    run: Callable[[argparse.Namespace], Any] = args.run
    try:
        if args.is_async:
            command: Callable[[], Awaitable[int]] = partial(run, args)
            return anyio.run(command, backend="asyncio")
        return run(args)
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        return _report(exc)


if __name__ == "__main__":
    sys.exit(main())
