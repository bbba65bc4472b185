"""The commands that ask the daemon: status, start/stop/restart, tools, call, approve, logs, reload,
health. (``connect``, the stdio pump to the gateway, is its own package: it runs no asyncio.)"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

import anyio

from supervisor.cli import render
from supervisor.control import client
from supervisor.control.client import RemoteError
from supervisor.control.codes import CONFIG_INVALID

if TYPE_CHECKING:
    pass

from supervisor.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, fail, print_json

__all__ = (
    "action",
    "approve",
    "call",
    "dashboard",
    "health",
    "login",
    "logout",
    "logs",
    "reload",
    "status",
    "tools",
)

_QUERY_TIMEOUT = 30.0  # status, tools, logs: they answer from memory
_LOGIN_START = 90.0  # the servers' metadata and a registration, before the URL is known
_ALL_CONCURRENCY = 16  # requests in flight for --all, well under the daemon's connection cap


async def status(args: argparse.Namespace) -> int:
    params = {"name": args.name} if args.name else {}
    result = await client.request(args.socket, "status", params, timeout=_QUERY_TIMEOUT)
    if args.json:
        print_json(result)
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


async def action(args: argparse.Namespace) -> int:
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
        fail(problem)
    return EXIT_FAILED if failures else EXIT_OK


async def tools(args: argparse.Namespace) -> int:
    params = {"name": args.name} if args.name else {}
    result = await client.request(args.socket, "tools", params, timeout=_QUERY_TIMEOUT)
    if args.json:
        print_json(result)
    else:
        print(render.tools_table(result["tools"], shutil.get_terminal_size((100, 24)).columns))
        if (changes := render.changes_text(result["tools"])) is not None:
            print(f"\n{changes}")
        _print_profiles(result.get("profiles"))
    return EXIT_OK


async def approve(args: argparse.Namespace) -> int:
    params = {"name": args.name, **({"tool": args.tool} if args.tool else {})}
    result = await client.request(args.socket, "approve", params, timeout=_QUERY_TIMEOUT)
    if args.json:
        print_json(result)
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
        raise UsageError(f"--args is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError(f'--args must be a JSON object such as \'{{"text": "hi"}}\', not {text!r}')
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


async def call(args: argparse.Namespace) -> int:
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
        print_json(result)
    elif failed:
        text = render.result_text(result) or "no details"
        separator = "\n" if "\n" in text else " "
        fail(f"tool {args.tool!r} of {args.name!r} reported an error:{separator}{text}")
    else:
        text = render.result_text(result)
        if text:
            print(text)
    return EXIT_FAILED if failed else EXIT_OK


async def login(args: argparse.Namespace) -> int:
    """Print (and open) the authorization URL, then wait for the person's login and say how it went."""
    params = {"name": args.name, **({"device": True} if args.device else {})}
    begun = await client.request(args.socket, "login", params, timeout=_LOGIN_START)
    url, code = begun.get("url"), begun.get("user_code")
    if url and code:
        print(
            f"To log in to {args.name!r}, open this URL on any device and enter the code {code}:",
            file=sys.stderr,
        )
        print(url, flush=True)
    elif url:
        print(f"Open this URL to log in to {args.name!r} (it waits {args.wait:g}s):", file=sys.stderr)
        print(url, flush=True)
        if not args.no_browser and _has_display():
            await anyio.to_thread.run_sync(_open_browser, url)
    params = {"name": args.name, "wait": max(1.0, min(args.wait, 3600.0))}
    record = await client.request(args.socket, "login_wait", params, timeout=params["wait"] + _QUERY_TIMEOUT)
    if record["state"] == "running":
        print(f"logged in: {args.name!r} is running")
        return EXIT_OK
    reason = record.get("last_error") or f"it is {record['state']}"
    fail(f"logged in, but {args.name!r} is not running: {reason}")
    return EXIT_FAILED


async def dashboard(args: argparse.Namespace) -> int:
    """Print the dashboard's URL (its code works once, for two minutes); open it where there is a display."""
    params = {"read_only": True} if args.read_only else {}
    opened = await client.request(args.socket, "dashboard", params, timeout=_QUERY_TIMEOUT)
    mode = " (read-only)" if opened["read_only"] else ""
    print(f"The dashboard{mode}: this link works once, within {opened['expires_in']:g}s:", file=sys.stderr)
    print(opened["url"], flush=True)
    if not args.no_browser and _has_display():
        await anyio.to_thread.run_sync(_open_browser, opened["url"])
    return EXIT_OK


def _has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform == "darwin"


def _open_browser(url: str) -> None:
    import webbrowser  # only here: it reads the environment for browsers at import

    webbrowser.open(url)


async def logout(args: argparse.Namespace) -> int:
    result = await client.request(args.socket, "logout", {"name": args.name}, timeout=_QUERY_TIMEOUT)
    revoked = "revoked and forgotten" if result["revoked"] else "forgotten (the server revoked nothing)"
    print(f"logged out of {args.name!r}: its tokens are {revoked}")
    return EXIT_OK


async def logs(args: argparse.Namespace) -> int:
    result = await client.request(
        args.socket, "logs", {"name": args.name, "lines": args.lines}, timeout=_QUERY_TIMEOUT
    )
    for line in result["lines"]:
        print(line.removesuffix("\n"))
    return EXIT_OK


async def reload(args: argparse.Namespace) -> int:
    try:
        report = await client.request(args.socket, "reload", {})
    except RemoteError as exc:
        if exc.code != CONFIG_INVALID or not isinstance(exc.data, dict):
            raise
        fail(f"{exc.message}:")
        for problem in exc.data.get("errors", []):
            print(f"  {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print_json(report)
        return EXIT_OK
    for key, label in (("added", "started"), ("removed", "stopped and removed"), ("restarted", "restarted")):
        print(f"{label}: {', '.join(report[key]) or '-'}")
    if report["needs_restart"]:
        print(f"not applied until the daemon restarts: {', '.join(report['needs_restart'])}")
    return EXIT_OK


async def health(args: argparse.Namespace) -> int:
    if args.prometheus:
        result = await client.request(args.socket, "health", {"format": "prometheus"}, timeout=_QUERY_TIMEOUT)
        print(result["text"], end="")
        return EXIT_OK
    report = await client.request(args.socket, "health", {}, timeout=_QUERY_TIMEOUT)
    if args.json:
        print_json(report)
        return EXIT_OK
    print(render.health_text(report))
    return EXIT_OK
