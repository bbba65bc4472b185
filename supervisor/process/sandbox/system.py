"""The host's side of every sandbox: the system it reads, and what it never sees there.

The system directories every extension reads; the host's secrets (by name), the credential
stores in a home, and what in ``/etc`` the daemon's user may read and others may not (a root
daemon's ``/etc/default/cacerts`` at 0600); and where ``/etc``'s symlinks lead outside the
system (``/etc/resolv.conf`` into ``/run/systemd/resolve``). Reads the file system; changes nothing.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from supervisor.process.sandbox.install import is_broad

__all__ = (
    "HOME_SECRETS",
    "SSH_HOST_KEYS",
    "SYSTEM",
    "SYSTEM_SECRETS",
    "not_for_others",
    "private_to_the_daemon",
    "system_links",
    "within",
)

T = TypeVar("T")

MAX_PRIVATE_SCAN = 20_000  # entries of /etc looked at for files others may not read (1,200 is usual)
PRIVATE_SCAN_SECONDS = 60.0  # how long one look at /etc serves

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
SYSTEM_SECRETS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
    "/etc/ssl/private", "/etc/credstore", "/etc/credstore.encrypted", "/etc/mcp-supervisor",
)  # fmt: skip
SSH_HOST_KEYS = "/etc/ssh/ssh_host_*_key"
HOME_SECRETS = (
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".netrc", ".git-credentials",
    ".config/gh", ".password-store", ".local/share/keyrings", ".mozilla", ".config/google-chrome",
    ".config/chromium", ".pki",
)  # fmt: skip


def within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def system_links() -> dict[str, str]:
    """What symlinks at the top of /etc point at outside the system directories
    (``/etc/resolv.conf`` -> ``/run/systemd/resolve/...``): the target's directory. Looked at
    again after :data:`PRIVATE_SCAN_SECONDS`, as :func:`private_to_the_daemon` is."""
    return dict(_etc_links())


def _links_out_of(top: str) -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        names = os.listdir(top)
    except OSError:
        return found
    for name in names:
        link = os.path.join(top, name)
        if not os.path.islink(link):
            continue
        target = os.path.realpath(link)
        if not any(within(target, s) for s in (*SYSTEM, "/proc", "/sys", "/dev")) and os.path.exists(target):
            parent = os.path.dirname(target)
            found[target if is_broad(parent, "") else parent] = f"what {link} points at"
    return found


def not_for_others(top: str = "/etc", limit: int = MAX_PRIVATE_SCAN) -> list[str]:
    """What under *top* others may not read and the daemon may (a root daemon: ``/etc/default/cacerts``
    at 0600, ``pg_hba.conf``): a file without the world's read bit, a directory without its
    search bit (not entered). At most *limit* entries are looked at. Blocking: a few ms."""
    found: list[str] = []
    stack, seen = [top], 0
    while stack and seen < limit:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            if not (is_dir or stat.S_ISREG(info.st_mode)):
                continue
            for_others = info.st_mode & (stat.S_IXOTH if is_dir else stat.S_IROTH)
            if not for_others and os.access(entry.path, os.R_OK | (os.X_OK if is_dir else 0)):
                found.append(entry.path)
            elif is_dir and for_others:
                stack.append(entry.path)
    return sorted(found)


def private_to_the_daemon() -> list[str]:
    """:func:`not_for_others` of /etc, again after :data:`PRIVATE_SCAN_SECONDS` (it takes tens of
    ms here, and grants are computed on the event loop at each start and status)."""
    return list(_etc_private())


class _Recent(Generic[T]):
    """What *look* found, looked at again once :data:`PRIVATE_SCAN_SECONDS` have passed."""

    def __init__(self, look: Callable[[], T]) -> None:
        self._look = look
        self._taken = -math.inf
        self._found: T | None = None

    def __call__(self) -> T:
        if self._found is None or time.monotonic() - self._taken > PRIVATE_SCAN_SECONDS:
            self._taken, self._found = time.monotonic(), self._look()
        return self._found


_etc_links = _Recent(lambda: _links_out_of("/etc"))
_etc_private = _Recent(not_for_others)
