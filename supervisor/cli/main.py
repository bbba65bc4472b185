"""The ``mcp-supervisor`` command line: the parser, the dispatch to a command, the exit codes.

Every failure ends as one sentence on stderr prefixed ``mcp-supervisor:`` and one of the exit
codes below; ``main`` never raises for a failure it knows about.

A command runs from :mod:`.remote` (those that ask the daemon) or :mod:`.local` (those that
read files or run the daemon), imported only when it runs: ``connect`` pays for nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, NoReturn

from supervisor import paths
from supervisor.errors import ConfigError, DaemonUnreachable, SupervisorError

__all__ = (
    "CLIENT_NAMES",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "PROG",
    "UsageError",
    "fail",
    "main",
    "print_json",
)

EXIT_OK = 0
EXIT_FAILED = 1  # the operation failed; the message says why
EXIT_USAGE = 2  # bad command line or bad config
EXIT_UNREACHABLE = 3  # no daemon on the control socket

PROG = "mcp-supervisor"
MAX_LOG_LINES = 10_000
CLIENT_NAMES = ("claude", "cursor", "windsurf", "vscode", "claude-code")  # clientconfig.CLIENTS, unimported


class UsageError(Exception):
    """A bad command line: exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def fail(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _line_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= MAX_LOG_LINES:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_LOG_LINES}")
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
    parser = _Parser(prog=PROG, description="Supervise stdio MCP servers.")
    socket_help = "the daemon's control socket (default: $MCP_SUPERVISOR_SOCKET, else a per-user path)"
    # Before the command too, as supervisorctl's -s and docker's -H: `mcp-supervisor --socket P status`.
    # The commands' own --socket is SUPPRESSed when absent, so it does not undo this one.
    parser.add_argument("--socket", metavar="PATH", help=socket_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    remote = _Parser(add_help=False)
    remote.add_argument("--socket", metavar="PATH", help=socket_help, default=argparse.SUPPRESS)

    def add(
        name: str, run: str, help_text: str, *, asks_daemon: bool = True, is_async: bool = True
    ) -> argparse.ArgumentParser:
        """A command; *run* is "module:function" in this package, imported only when it runs."""
        sub = commands.add_parser(
            name, parents=[remote] if asks_daemon else [], help=help_text, description=help_text
        )
        sub.set_defaults(run=run, asks_daemon=asks_daemon, is_async=is_async)
        return sub

    sub = add(
        "daemon", "local:daemon", "run the supervisor in the foreground", asks_daemon=False, is_async=False
    )
    sub.add_argument("-c", "--config", metavar="CONFIG", help="config file (default: $MCP_SUPERVISOR_CONFIG)")
    sub.add_argument(
        "--socket", metavar="PATH", help="control socket, overriding the config", default=argparse.SUPPRESS
    )
    sub.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="auto (default): readable lines on a terminal, JSON lines elsewhere (journald, files)",
    )
    sub = add("status", "remote:status", "show the state of each extension")
    sub.add_argument("name", nargs="?", metavar="NAME")
    sub.add_argument("--json", action="store_true", help="print the raw status records")
    for verb in ("start", "stop", "restart"):
        sub = add(verb, "remote:action", f"{verb} one extension, or all of them")
        sub.add_argument("name", nargs="?", metavar="NAME")
        sub.add_argument("--all", action="store_true", help="every configured extension")
        sub.add_argument("--no-wait", action="store_true", help="return without waiting for the outcome")
    sub = add("tools", "remote:tools", "list the tools of running extensions")
    sub.add_argument("name", nargs="?", metavar="NAME")
    sub.add_argument("--json", action="store_true", help="print the raw tool list")
    sub = add("call", "remote:call", "call one tool and print its result")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("tool", metavar="TOOL")
    sub.add_argument("--args", metavar="JSON", help="the tool's arguments, a JSON object")
    sub.add_argument("--json", action="store_true", help="print the raw result")
    sub = add(
        "approve", "remote:approve", "accept the changed definitions of an extension's tools (pin them)"
    )
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("tool", nargs="?", metavar="TOOL", help="only this tool (default: every changed one)")
    sub.add_argument("--json", action="store_true", help="print the raw result")
    sub = add("login", "remote:login", "log in to a remote extension's server (OAuth), once for the host")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument(
        "--no-browser", action="store_true", help="print the authorization URL only (default: open it too)"
    )
    sub.add_argument(
        "--device",
        action="store_true",
        help="log in with a code entered on another device (for a host reached over SSH)",
    )
    sub.add_argument(
        "--wait",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the login in the browser (default 600)",
    )
    sub = add("logout", "remote:logout", "revoke and forget the login to a remote extension's server")
    sub.add_argument("name", metavar="NAME")
    sub = add("dashboard", "remote:dashboard", "print (and open) the dashboard's URL, with a one-time code")
    sub.add_argument("--no-browser", action="store_true", help="print the URL only (default: open it too)")
    sub.add_argument("--read-only", action="store_true", help="a session that may look, not act")
    sub = add("logs", "remote:logs", "print the last lines an extension wrote to stderr")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("-n", "--lines", type=_line_count, default=50, metavar="N", help="how many (default 50)")
    sub = add(
        "reload", "remote:reload", "re-read the config: start added, stop removed, restart changed extensions"
    )
    sub.add_argument("--json", action="store_true", help="print the raw report")
    sub = add("health", "remote:health", "diagnostics of the daemon itself")
    output = sub.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the raw report")
    output.add_argument(
        "--prometheus", action="store_true", help="print metrics in the Prometheus text format"
    )
    sub = add(  # no event loop of asyncio's: connect has its own (connect/loop.py)
        "connect",
        "connect:command",
        "an MCP server on stdio for MCP clients: a pipe to the daemon's gateway",
        is_async=False,
    )
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
    sub = add(
        "check-config", "local:check_config", "validate a config file", asks_daemon=False, is_async=False
    )
    sub.add_argument(
        "config", metavar="CONFIG", nargs="?", help="default: $MCP_SUPERVISOR_CONFIG, else the system's"
    )
    sub.add_argument(
        "--explain",
        metavar="NAME",
        action="append",
        help="print what extension NAME's sandbox grants and hides, and why (repeatable)",
    )
    sub = add(
        "import",
        "local:import_servers",
        "add the servers of an MCP client's config file (stdio and remote) to the config",
        asks_daemon=False,
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
    sub.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's socket, for the connect entry",
        default=argparse.SUPPRESS,
    )
    sub = add(
        "client-config",
        "local:client_config",
        "print the entry an MCP client needs to use the daemon",
        asks_daemon=False,
        is_async=False,
    )
    sub.add_argument("--client", choices=list(CLIENT_NAMES), default="claude", help="default: claude")
    sub.add_argument("--profile", metavar="P", help="a profile of the config (connect --profile)")
    sub.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's socket, when not the default",
        default=argparse.SUPPRESS,
    )
    sub.add_argument("-c", "--config", metavar="CONFIG", help="take the socket from this config")
    sub.add_argument(
        "--http",
        action="store_true",
        help="the HTTP gateway's URL with its bearer token instead (for clients that send headers)",
    )
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command in ("start", "stop", "restart") and bool(args.name) == bool(args.all):
        raise UsageError(f"give either NAME or --all (see '{PROG} {args.command} --help')")
    if getattr(args, "asks_daemon", False) and not args.socket:
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
    if isinstance(exc, UsageError | ConfigError):
        code = EXIT_USAGE
    elif isinstance(exc, DaemonUnreachable):
        code = EXIT_UNREACHABLE
    elif isinstance(exc, SupervisorError):
        code = EXIT_FAILED
    elif isinstance(exc, OSError):
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))
        return EXIT_FAILED
    elif isinstance(exc, KeyboardInterrupt):
        fail("interrupted")
        return EXIT_FAILED
    else:
        raise exc
    fail(str(exc))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``mcp-supervisor`` command and return its exit code (``sys.exit(main())``)."""
    try:
        args = _parse(argv)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except UsageError as exc:
        return _report(exc)
    module, _, function = args.run.partition(":")
    commands = importlib.import_module(f"supervisor.cli.{module}")
    run: Callable[[argparse.Namespace], Any] = getattr(commands, function)
    try:
        if args.is_async:
            import anyio  # here: connect, the command run most, has no use for it

            command: Callable[[], Awaitable[int]] = partial(run, args)
            return anyio.run(command, backend="asyncio")
        return run(args)
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        return _report(exc)


if __name__ == "__main__":
    sys.exit(main())
