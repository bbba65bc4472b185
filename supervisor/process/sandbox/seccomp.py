"""A seccomp filter through ctypes: the system calls a confined server has no use for.

Standard library only and no relative imports: the exec launcher (``launch.py``) loads this
file by path, before any of the package can be imported.

Refused with ``EPERM``: new user namespaces (``unshare``/``clone`` with ``CLONE_NEWUSER``; inside
one a server holds every capability over fresh namespaces: nf_tables, mounts, the kernel's
attack surface), keyrings (``keyctl``, ``add_key``, ``request_key``), ``bpf``,
``perf_event_open``, ``userfaultfd``, ``io_uring_setup``, and with *unix_sockets* off, creating a
unix socket (where no private root hides the daemon's sockets, an agent's or D-Bus's, and
Landlock does not govern connecting to them by path; ``socketpair`` still works). ``clone3``
gets ``ENOSYS``, as on an older kernel, because its flags are out of a filter's reach: libc
then uses ``clone``. System calls of another architecture (x32, 32-bit) get ``ENOSYS`` too,
since their numbers differ. Everything else is allowed.

Run as a file (``python -I -S seccomp.py --only-user-namespaces -- COMMAND...``) it refuses new
user namespaces alone, then execs COMMAND: how the tests play a host that restricts them.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ("install", "main")

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_CLONE_NEWUSER = 0x10000000
_AF_UNIX = 1
_EPERM, _ENOSYS = 1, 38

# BPF: instruction classes and fields (linux/filter.h), return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian: low half first)

_ARCHES = {  # audit arch, then the numbers of the calls below
    "x86_64": (0xC000003E, {
        "unshare": 272, "clone": 56, "clone3": 435, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "socket": 41,
    }),
    "aarch64": (0xC00000B7, {
        "unshare": 97, "clone": 220, "clone3": 435, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "socket": 198,
    }),
}  # fmt: skip
_REFUSED = ("keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup")


class _Instruction(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction)))


def _program(*, only_user_namespaces: bool, unix_sockets: bool) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k): a check per call, each ending in its own return."""
    machine = os.uname().machine
    if machine not in _ARCHES:
        raise OSError(0, f"the sandbox's seccomp filter does not know {machine}")
    arch, numbers = _ARCHES[machine]
    refuse, missing = (_RET_K, 0, 0, _ERRNO | _EPERM), (_RET_K, 0, 0, _ERRNO | _ENOSYS)
    allow = (_RET_K, 0, 0, _ALLOW)
    code: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ_K, 1, 0, arch), missing]
    code.append((_LD_W_ABS, 0, 0, _NR))
    if machine == "x86_64":
        code += [(_JGE_K, 0, 1, 0x40000000), missing]  # the x32 ABI's numbers

    def when_arg0(call: str, test: int, value: int) -> None:
        # nr == call? load arg0; (arg0 & value) or (arg0 == value)? refuse; else allow.
        code.extend(
            [(_JEQ_K, 0, 4, numbers[call]), (_LD_W_ABS, 0, 0, _ARG0_LOW), (test, 0, 1, value), refuse, allow]
        )

    when_arg0("unshare", _JSET_K, _CLONE_NEWUSER)
    when_arg0("clone", _JSET_K, _CLONE_NEWUSER)
    code += [(_JEQ_K, 0, 1, numbers["clone3"]), missing]
    if not only_user_namespaces:
        for call in _REFUSED:
            code += [(_JEQ_K, 0, 1, numbers[call]), refuse]
        if not unix_sockets:
            when_arg0("socket", _JEQ_K, _AF_UNIX)
    code.append(allow)
    return code


def install(*, only_user_namespaces: bool = False, unix_sockets: bool = True) -> None:
    """Set no_new_privs and install the filter on this thread, inherited by every descendant.

    Error handling: raises ``OSError`` naming the step that failed.
    """
    code = _program(only_user_namespaces=only_user_namespaces, unix_sockets=unix_sockets)
    instructions = (_Instruction * len(code))(*(_Instruction(*i) for i in code))
    program = _Program(len(code), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    for what, result in (
        ("prctl(PR_SET_NO_NEW_PRIVS)", lambda: libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
        (
            "prctl(PR_SET_SECCOMP)",
            lambda: libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program)),
        ),
    ):
        if result() < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")


def main(argv: list[str]) -> None:
    """``--only-user-namespaces -- COMMAND...``: refuse new user namespaces, then exec COMMAND."""
    if argv[:2] != ["--only-user-namespaces", "--"] or len(argv) < 3:
        sys.exit("usage: seccomp.py --only-user-namespaces -- COMMAND [ARG...]")
    install(only_user_namespaces=True)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
