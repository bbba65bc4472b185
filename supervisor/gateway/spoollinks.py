"""Serving the media spool's ``file://`` links back through ``resources/read``.

Only regular files inside the daemon's spool directory are served. The check is on the
resolved path (``..`` and symlinks anywhere in it are resolved first) and the file is opened
with ``O_NOFOLLOW``, so neither a crafted URI nor a link planted in the spool reaches another
file. Reads run in a worker thread, a few at a time, since a spooled file may be large.
"""

from __future__ import annotations

import base64
import mimetypes
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio
import mcp_types as types
from mcp import MCPError

__all__ = ("MAX_READ_BYTES", "RESOURCE_NOT_FOUND", "read")

MAX_READ_BYTES = 32 << 20  # one file served at most: it is held as base64 until the client takes it
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for resources/read of an unknown URI


def _inside(spool_dir: Path, uri: str) -> Path:
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise MCPError(RESOURCE_NOT_FOUND, f"unknown resource {uri!r}")
    requested = Path(unquote(parts.path))
    root = spool_dir.resolve()
    try:
        resolved = requested.resolve()
    except (ValueError, OSError):  # an embedded NUL, a loop of links
        raise MCPError(RESOURCE_NOT_FOUND, f"unknown resource {uri[:200]!r}") from None
    if not requested.is_absolute() or root not in resolved.parents:
        raise MCPError(
            RESOURCE_NOT_FOUND, f"{uri!r} is not a file in the media spool; only spool links are served"
        )
    return resolved


def _read(path: Path, uri: str) -> types.BlobResourceContents:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise MCPError(RESOURCE_NOT_FOUND, f"spool link {uri!r} is gone ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise MCPError(RESOURCE_NOT_FOUND, f"{uri!r} is not a regular file")
        if info.st_size > MAX_READ_BYTES:
            raise MCPError(types.INVALID_PARAMS, f"{uri!r} is over the {MAX_READ_BYTES}-byte read limit")
        data = file.read(MAX_READ_BYTES + 1)
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return types.BlobResourceContents(uri=uri, mime_type=mime, blob=base64.b64encode(data).decode("ascii"))


async def read(spool_dir: Path, uri: str, limiter: anyio.CapacityLimiter) -> types.ReadResourceResult:
    """The spooled file behind *uri* as one blob; an MCP error for anything else.

    *limiter* bounds concurrent reads: each holds the file and its base64 in memory at once.

    Error handling: ``-32002`` for a URI outside the spool, a missing file or a non-regular
    one; ``-32602`` for a file over :data:`MAX_READ_BYTES`.
    """
    path = _inside(spool_dir, uri)
    contents = await anyio.to_thread.run_sync(_read, path, uri, limiter=limiter)
    return types.ReadResourceResult(contents=[contents])
