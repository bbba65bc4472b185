"""Errors that cross module boundaries. Each message is one sentence a user can act on."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = (
    "CallFailed",
    "ConfigError",
    "DaemonUnreachable",
    "ExtensionUnavailable",
    "LoginNeeded",
    "SpawnError",
    "StartFailed",
    "SupervisorError",
    "UnknownExtension",
    "first_line",
)


class SupervisorError(Exception):
    """Base class; ``str(exc)`` is shown to users as is."""


class DaemonUnreachable(SupervisorError):
    """No daemon could be reached at *path*."""

    def __init__(self, path: str, reason: str | None = None) -> None:
        super().__init__(reason or f"no daemon is listening on {path}")
        self.path = path


class UnknownExtension(SupervisorError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no extension named {name!r} is configured")
        self.name = name


class ExtensionUnavailable(SupervisorError):
    """The extension is not running. ``retryable`` when it is on its way back (starting, backoff);
    else *advice* may say what brings it back."""

    def __init__(
        self, name: str, state: str, *, retryable: bool, detail: str | None = None, advice: str | None = None
    ) -> None:
        message = f"extension {name!r} is {state}"
        if detail:
            message += f" ({detail})"
        if retryable or advice:
            message += "; try again shortly" if retryable else f"; {advice}"
        super().__init__(message)
        self.name, self.state, self.retryable = name, state, retryable


class LoginNeeded(ExtensionUnavailable):
    """A remote extension waits for a login, and the calling client can open URLs (URL-mode
    elicitation, MCP 2025-11-25): it answers as the protocol's ``URLElicitationRequiredError``
    (-32042), naming the authorization URL, so the person logs in from the client."""

    code = -32042  # URL_ELICITATION_REQUIRED

    def __init__(self, name: str, url: str, elicitation_id: str) -> None:
        super().__init__(
            name, "needs-login", retryable=False, advice="log in at the URL given, then call again"
        )
        words = f"Log in to {name!r} (a remote MCP server of mcp-supervisor) to use its tools"
        elicitation = {"mode": "url", "elicitationId": elicitation_id, "url": url, "message": words}
        self.data = {"elicitations": [elicitation]}


class CallFailed(SupervisorError):
    """A tool call reached the extension but did not produce a result."""

    def __init__(
        self, message: str, *, code: int | None = None, data: object = None, from_child: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.data = data  # the child's JSON-RPC error data, passed on as is
        self.from_child = from_child  # the child's own JSON-RPC error, whatever its code


class SpawnError(SupervisorError):
    """The child process could not be started. ``permanent`` when retrying cannot help."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class StartFailed(SupervisorError):
    """The child started but did not complete the MCP handshake and tool listing."""


class ConfigError(SupervisorError):
    """The configuration is unusable. ``errors`` holds one line per problem; ``str(exc)`` joins them."""

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: tuple[str, ...] = tuple(errors)
        super().__init__("\n".join(self.errors))


def first_line(exc: BaseException, *, typed: bool = True, limit: int = 300) -> str:
    """*exc* in one line for a log or a status: its type (when *typed*) and its message's first line."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__[:limit]
    return (f"{type(exc).__name__}: {lines[0]}" if typed else lines[0])[:limit]
