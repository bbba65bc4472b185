"""Serving the media spool's ``file://`` links back through ``resources/read``.

Only regular files beneath the daemon's spool directory are served. A link's path is checked
as written (absolute, beneath the spool directory, no ``.`` or ``..``), then opened relative to
the spool directory's own fd, refusing a symlink in any component: with ``openat2``'s
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where the kernel has it (5.6+), else one component at
a time with ``O_NOFOLLOW``. No component can be swapped for a link between a check and the open,
since nothing is checked by name after the open. The fd is then checked to be a regular file
before a byte is read, and closed however the read ends. Reads run in a worker thread, a few
at a time, since a spooled file may be large.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import mimetypes
import os
import stat
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import anyio
import mcp_types as types
from mcp import MCPError

__all__ = ("MAX_READ_BYTES", "RESOURCE_NOT_FOUND", "open_beneath", "read")

MAX_READ_BYTES = 32 << 20  # one file served at most: it is held as base64 until the client takes it
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for resources/read of an unknown URI

_SYS_OPENAT2 = 437  # the same number on every Linux architecture (new system calls share one table)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_have_openat2: bool | None = None  # unknown until tried: ENOSYS on kernels before 5.6


def open_beneath(directory: Path, relative: PurePosixPath) -> int:
    """An fd for *relative* beneath *directory*, following no symlink on the way; the caller closes it.

    Raises:
        OSError: as ``open`` would (``ELOOP`` for a symlink, ``EXDEV`` for an escape).
    """
    global _have_openat2
    parts = relative.parts
    if not parts or any(part in ("", ".", "..") for part in parts):
        raise OSError(errno.EINVAL, "not a plain relative path")
    root = os.open(directory, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the spool's own path is the operator's
    try:
        if _have_openat2 is not False:
            how = _OpenHow(_FILE_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
            fd = _libc.syscall(
                _SYS_OPENAT2, root, os.fsencode(str(relative)), ctypes.byref(how), ctypes.sizeof(how)
            )
            if fd >= 0:
                _have_openat2 = True
                return int(fd)
            code = ctypes.get_errno()
            if code not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter that does not know it
                raise OSError(code, os.strerror(code))
            _have_openat2 = False
        return _walk(root, parts)
    finally:
        os.close(root)


def _walk(root: int, parts: tuple[str, ...]) -> int:
    """``open_beneath`` without ``openat2``: one component at a time, none of them a symlink."""
    current = root
    try:
        for part in parts[:-1]:
            following = os.open(part, _DIR_FLAGS, dir_fd=current)
            if current != root:
                os.close(current)
            current = following
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=current)
    finally:
        if current != root:
            os.close(current)


def _relative(spool_dir: Path, uri: str) -> PurePosixPath:
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise MCPError(RESOURCE_NOT_FOUND, f"unknown resource {uri[:200]!r}")
    requested = PurePosixPath(unquote(parts.path))
    outside = MCPError(
        RESOURCE_NOT_FOUND, f"{uri[:200]!r} is not a file in the media spool; only spool links are served"
    )
    if "\0" in str(requested) or not requested.is_absolute() or ".." in requested.parts:
        raise outside
    try:
        relative = requested.relative_to(PurePosixPath(spool_dir))
    except ValueError:
        raise outside from None
    if not relative.parts:
        raise outside
    return relative


def _read(spool_dir: Path, relative: PurePosixPath, uri: str) -> types.BlobResourceContents:
    try:
        fd = open_beneath(spool_dir, relative)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
            reason = "a symbolic link or not beneath the spool"
            raise MCPError(
                RESOURCE_NOT_FOUND, f"{uri[:200]!r} is {reason}; only spool files are served"
            ) from None
        raise MCPError(RESOURCE_NOT_FOUND, f"spool link {uri[:200]!r} is gone ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise MCPError(RESOURCE_NOT_FOUND, f"{uri[:200]!r} is {kind}; only spool files are served")
        if info.st_size > MAX_READ_BYTES:
            raise MCPError(
                types.INVALID_PARAMS, f"{uri[:200]!r} is over the {MAX_READ_BYTES}-byte read limit"
            )
        chunks, size = [], 0
        while size <= MAX_READ_BYTES and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_READ_BYTES:  # it grew since the fstat
        raise MCPError(types.INVALID_PARAMS, f"{uri[:200]!r} is over the {MAX_READ_BYTES}-byte read limit")
    mime = mimetypes.guess_type(relative.name)[0] or "application/octet-stream"
    blob = base64.b64encode(b"".join(chunks)).decode("ascii")
    return types.BlobResourceContents(uri=uri, mime_type=mime, blob=blob)


async def read(spool_dir: Path, uri: str, limiter: anyio.CapacityLimiter) -> types.ReadResourceResult:
    """The spooled file behind *uri* as one blob; an MCP error for anything else.

    *limiter* bounds concurrent reads: each holds the file and its base64 in memory at once.

    Error handling: ``-32002`` for a URI outside the spool, a missing file, a directory, a
    symlink or any other non-regular file; ``-32602`` for a file over :data:`MAX_READ_BYTES`.
    """
    relative = _relative(spool_dir, uri)
    contents = await anyio.to_thread.run_sync(_read, spool_dir, relative, uri, limiter=limiter)
    return types.ReadResourceResult(contents=[contents])
