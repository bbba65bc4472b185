"""Landlock through ctypes: three system calls, no dependency.

Standard library only and no relative imports: the exec launcher (``launch.py``) loads this
file by path, before any of the package can be imported.

A ruleset *handles* some access rights; everything handled is denied unless a rule grants it
beneath a path (or on a TCP port). Rights it does not handle stay allowed, so ``outbound``
handles only ``BIND_TCP``: connecting is left alone, binding is refused. Scopes (ABI 6) confine
signals and abstract unix sockets to the domain's own processes. A Landlock domain also
refuses ptrace of any process outside it, and every mount change.

Any ABI is used for what it has: files since 1 (moving between directories 2, truncating 3,
ioctl on devices 5), TCP since :data:`TCP_ABI`, scopes since :data:`SCOPE_ABI`.
"""

from __future__ import annotations

import ctypes
import os
import stat

__all__ = (
    "FULL_ABI",
    "READ",
    "SCOPE_ABI",
    "TCP_ABI",
    "WRITE",
    "Ruleset",
    "abi",
)

TCP_ABI = 4  # binding and connecting TCP ports
SCOPE_ABI = 6  # signals and abstract unix sockets within the domain
FULL_ABI = SCOPE_ABI  # every right the sandbox asks for

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on x86_64 and aarch64
_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only rights a file can carry

READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_SYM
    | REFER | TRUNCATE
)  # fmt: skip  # never MAKE_CHAR / MAKE_BLOCK: device nodes are how a root escapes

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled at boot."""
    result = _libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(0, int(result))


def _fs_rights(version: int) -> int:
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= version)]


class Ruleset:
    """One Landlock ruleset being built; :meth:`restrict_self` applies it to this process.

    *network*: ``all`` handles no TCP right, ``outbound`` handles bind, ``none`` bind and connect.
    Error handling: every call raises ``OSError`` naming the step that failed.
    """

    def __init__(self, network: str, *, version: int | None = None) -> None:
        self.version = abi() if version is None else version
        if self.version < 1:
            raise OSError(0, "Landlock is not available")
        self.fs = _fs_rights(self.version)
        net = {"all": 0, "outbound": BIND_TCP, "none": BIND_TCP | CONNECT_TCP}[network]
        scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        attr = _RulesetAttr(
            self.fs, net if self.version >= TCP_ABI else 0, scoped if self.version >= SCOPE_ABI else 0
        )
        self._fd = _check(
            _libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0),
            "landlock_create_ruleset",
        )

    def allow(self, path: str, rights: int) -> None:
        """Grant *rights* beneath *path* (a file gets only the file rights among them)."""
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            self.allow_fd(fd, rights, path)
        finally:
            os.close(fd)

    def allow_fd(self, fd: int, rights: int, name: str) -> None:
        """Grant *rights* beneath what *fd* (an ``O_PATH`` descriptor, *name* for errors) is."""
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneath(rights & self.fs, fd)
        _check(
            _libc.syscall(_ADD_RULE, self._fd, _RULE_PATH_BENEATH, ctypes.byref(rule), 0),
            f"landlock_add_rule {name}",
        )

    def restrict_self(self) -> None:
        """Set no_new_privs and enter the domain; irreversible, inherited by every descendant."""
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        try:
            _check(_libc.syscall(_RESTRICT_SELF, self._fd, 0), "landlock_restrict_self")
        finally:
            os.close(self._fd)
