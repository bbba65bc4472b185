"""The HTTP gateway's bearer token: the config's, else one made once and kept in the state directory.

The HTTP listener is always authenticated: on loopback the kernel tells the peer's user (see
:mod:`.callers`), but not whether a browser page of that user sent the request. A token made
here is 32 random bytes, URL-safe, in ``STATE/http-token`` (0600), made with ``O_EXCL`` so that a
daemon and ``client-config`` starting at once agree on one; it survives restarts. Light: the
CLI's ``client-config`` imports it.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from supervisor import paths
from supervisor.errors import SupervisorError

__all__ = ("FILE", "gateway_token", "token_path")

FILE = "http-token"
_MAX = 4096


def token_path(environ: Mapping[str, str]) -> Path:
    return paths.default_state_root(environ) / FILE


def gateway_token(configured: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """The token and where it comes from (``"config"`` or the file's path), making the file if needed.

    Raises:
        SupervisorError: the file cannot be made or read, or is not this user's alone.
    """
    if configured:
        return configured, "config"
    path = token_path(environ)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return _read(path), str(path)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
        return _read(path), str(path)
    except OSError as exc:
        why = exc.strerror or exc
        raise SupervisorError(f"cannot keep the HTTP gateway's token in {path}: {why}") from exc


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise SupervisorError(f"{path} must be a file of this user's alone (mode 0600); remove it")
        token = file.read(_MAX).strip()
    if len(token) < 16:  # a half-written file (a crash mid-write): say so rather than accept it
        raise SupervisorError(f"{path} holds no usable token; remove it and start again")
    return token
