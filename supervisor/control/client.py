"""The control socket's client: JSON-RPC requests to the daemon, one reply line each.

Resource handling: :class:`Client` owns one connection, opened by ``async with`` and closed on
exit; :func:`request` opens one for a single request.

Error handling: a missing or dead socket is :class:`DaemonUnreachable`; a socket served by
another user is :class:`~supervisor.sockets.UntrustedPeer` (checked before anything is sent);
an error the daemon sends back is :class:`RemoteError`; anything else going wrong on the wire
is a :class:`~supervisor.errors.SupervisorError` whose message names what happened.
"""

from __future__ import annotations

import errno
import itertools
import json
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor import sockets
from supervisor.errors import DaemonUnreachable, SupervisorError

__all__ = ("MAX_REPLY", "Client", "DaemonUnreachable", "OnNotification", "RemoteError", "request")

MAX_REPLY = 1 << 26  # bytes in one reply line; results are small once media is spooled
OnNotification = Callable[[str, dict[str, Any]], None]  # method, params; sync

_NOBODY_THERE = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR})


class RemoteError(SupervisorError):
    """The daemon answered with a JSON-RPC error; ``str(exc)`` is its message."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class Client:
    """One connection to the control socket; requests on it are answered in order.

    Use as ``async with Client(path) as client: await client.request("status")``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._stream: anyio.abc.SocketStream | None = None
        self._reader: BufferedByteReceiveStream | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Client:
        try:
            self._stream = await sockets.connect(self.path)  # raises UntrustedPeer before we send
        except PermissionError:
            raise DaemonUnreachable(self.path, f"permission denied connecting to {self.path}") from None
        except OSError as exc:
            if exc.errno in _NOBODY_THERE:
                raise DaemonUnreachable(self.path) from None
            reason = f"cannot connect to {self.path}: {exc.strerror or exc}"
            raise DaemonUnreachable(self.path, reason) from None
        self._reader = BufferedByteReceiveStream(self._stream)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; idempotent."""
        stream, self._stream, self._reader = self._stream, None, None
        if stream is not None:
            await stream.aclose()

    async def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-request limit callers pass in
        on_notification: OnNotification | None = None,
    ) -> Any:
        """Send one request and return its ``result``.

        Notifications the daemon sends before the reply (``call`` with ``progress``) go to
        *on_notification* (sync), or are skipped.

        Raises:
            RemoteError: the daemon answered with an error.
            SupervisorError: no answer within *timeout* seconds (the connection is then
                closed), the daemon hung up without answering, or the answer was garbage.
        """
        if self._stream is None or self._reader is None:
            raise SupervisorError("the connection to the daemon is closed")
        request_id = next(self._ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        try:
            with anyio.fail_after(timeout):
                await self._stream.send(json.dumps(message).encode() + b"\n")
                while (line := await self._reader.receive_until(b"\n", MAX_REPLY)) and (
                    notification := _notification(line)
                ):
                    if on_notification is not None:
                        on_notification(*notification)
        except TimeoutError:
            await self.aclose()
            raise SupervisorError(f"the daemon did not answer {method!r} within {timeout:g} s") from None
        except anyio.DelimiterNotFound:
            await self.aclose()
            raise SupervisorError(f"the daemon's reply to {method!r} is too large") from None
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
            await self.aclose()
            message = f"the daemon closed the connection without replying to {method!r}"
            raise SupervisorError(message) from None
        return _result(line, request_id, method)


def _notification(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """(method, params) if *line* is a notification (a message with a method and no id)."""
    if b'"method"' not in line:
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or "id" in message or not isinstance(message.get("method"), str):
        return None
    params = message.get("params")
    return message["method"], params if isinstance(params, dict) else {}


def _result(line: bytes, request_id: int, method: str) -> Any:
    try:
        reply = json.loads(line)
    except ValueError:
        raise SupervisorError(f"the daemon sent an invalid reply to {method!r}") from None
    if not isinstance(reply, dict):
        raise SupervisorError(f"the daemon sent an invalid reply to {method!r}")
    error = reply.get("error")
    if isinstance(error, dict):  # also an error with id null: refused before reading anything
        return _raise_remote(error)
    if reply.get("id") != request_id or "result" not in reply:
        raise SupervisorError(f"the daemon sent an invalid reply to {method!r}")
    return reply["result"]


def _raise_remote(error: dict[str, Any]) -> Any:
    code = error.get("code")
    message = error.get("message")
    raise RemoteError(
        code if isinstance(code, int) else 0,
        message if isinstance(message, str) and message else "the daemon reported an unspecified error",
        error.get("data"),
    )


async def request(
    path: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 - a per-request limit callers pass in
    on_notification: OnNotification | None = None,
) -> Any:
    """Connect to the control socket at *path*, send one request and return its ``result``.

    Raises:
        DaemonUnreachable: the socket is missing, not a socket, or nobody accepts on it.
        RemoteError: the daemon answered with an error.
        SupervisorError: see :meth:`Client.request`.
    """
    async with Client(path) as client:
        return await client.request(method, params, timeout=timeout, on_notification=on_notification)
