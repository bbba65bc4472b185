"""The exec launcher: confine this process, then become the extension's command.

Run as ``python -I -S launch.py OPTIONS -- COMMAND ARGS...`` (last in the spawn shim's exec
chain, after the cgroup join). It imports only the standard library and its two siblings,
loaded by path: no pydantic, no mcp, no anyio (its whole start costs a few milliseconds, see
bench/sandbox.py). It never forks: it ``execve``s the command, so no process of its own is left.

Options (one value each, repeatable where it makes sense): ``-n MODE`` network
(``none | outbound | all``), ``-r PATH`` readable, ``-w PATH`` writable, ``-x PATH`` hidden even
inside a grant, ``-t DIR`` the private temporary directory (writable, bound last), ``-s DIR``
an empty directory to build the new root in, ``-c DIR`` the working directory to enter inside
(made to exist, readable only if granted). ``--probe`` instead of ``-- COMMAND``: confine,
then exit 0 (the daemon's check that this kernel can).

Steps: new user + mount (+ network) namespaces, the private root (:mod:`mounts`), no
capabilities, no_new_privs, the Landlock domain (:mod:`landlock`), exec. Any failure exits
with :data:`EXIT_SANDBOX` and one line on stderr: the command never runs unconfined.
"""

from __future__ import annotations

import os
import sys

try:  # imported as part of the package (tests, the structure check)
    from supervisor.process.sandbox import landlock, mounts
except ImportError:  # run as a file by the spawn chain: siblings by path (-I leaves the dir off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import landlock  # type: ignore[no-redef]
    import mounts  # type: ignore[no-redef]

__all__ = ("EXIT_SANDBOX", "Options", "confine", "main", "parse")

EXIT_SANDBOX = 71  # EX_OSERR: the sandbox could not be set up; nothing of the command ran
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_V3 = 0x20080522
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


class Options:
    """The parsed command line: the policy, and the command to exec."""

    def __init__(self) -> None:
        self.network = "all"
        self.read: list[str] = []
        self.write: list[str] = []
        self.hide: list[str] = []
        self.staging = ""
        self.cwd = ""
        self.tmp = ""
        self.command: list[str] = []
        self.probe = False


def parse(argv: list[str]) -> Options:
    """``-n/-r/-w/-x/-t/-s/-c VALUE ... -- COMMAND ...``; raises ``ValueError`` on anything else."""
    options, lists = Options(), {"-r": "read", "-w": "write", "-x": "hide"}
    singles = {"-n": "network", "-s": "staging", "-c": "cwd", "-t": "tmp"}
    position = 0
    while position < len(argv):
        flag = argv[position]
        if flag == "--":
            options.command = argv[position + 1 :]
            break
        if flag == "--probe" and position == len(argv) - 1:
            options.probe = True
            break
        if position + 1 >= len(argv) or (flag not in lists and flag not in singles):
            raise ValueError(f"bad launcher argument {flag!r}")
        value = argv[position + 1]
        if flag in lists:
            getattr(options, lists[flag]).append(value)
        else:
            setattr(options, singles[flag], value)
        position += 2
    if (
        not (options.command or options.probe)
        or not options.staging
        or options.network not in ("none", "outbound", "all")
    ):
        raise ValueError("the launcher needs -s DIR, a network mode and a command after --")
    return options


def _drop_capabilities() -> None:
    """No capability now or after exec, even for uid 0 (bounding, ambient, then the sets)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_V3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (64 bits)
    if libc.capset(header, data) < 0:
        raise OSError(ctypes.get_errno(), "capset")


def confine(options: Options) -> None:
    """Everything but the exec. Raises ``OSError`` naming the step that failed."""
    version = landlock.abi()
    if version < landlock.MIN_ABI:  # before any namespace: say what the kernel lacks
        raise OSError(0, f"this kernel's Landlock ABI is {version}, the sandbox needs {landlock.MIN_ABI}")
    mounts.enter_namespaces(network=options.network != "none")
    mounts.build_root(
        options.staging,
        read=options.read,
        write=options.write,
        hide=options.hide,
        tmp=options.tmp,
        cwd=options.cwd,
    )
    try:
        os.chdir(options.cwd or "/")
    except OSError:
        os.chdir("/")
    _drop_capabilities()
    rules = landlock.Ruleset(options.network, version=version)
    device = landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV
    grants = [(p, landlock.READ) for p in (*options.read, "/proc", "/sys")]
    grants += [
        (p, landlock.WRITE) for p in (*options.write, "/dev/shm", *([options.tmp] if options.tmp else []))
    ]
    grants += [(p, device) for p in (*_DEVICES, "/dev/pts")]
    for path, rights in grants:
        try:
            rules.allow(path, rights)
        except FileNotFoundError:  # skipped by the root as well
            continue
    rules.restrict_self()


def main(argv: list[str] | None = None) -> None:
    """Confine, then exec the command; never returns."""
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        confine(options)
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        sys.stderr.write(f"mcp-supervisor sandbox: cannot confine the extension: {detail}\n")
        sys.stderr.flush()
        os._exit(EXIT_SANDBOX)
    if options.probe:
        os._exit(0)
    try:
        os.execv(options.command[0], options.command)
    except OSError as exc:
        sys.stderr.write(f"mcp-supervisor sandbox: cannot run {options.command[0]}: {exc.strerror}\n")
        sys.stderr.flush()
        os._exit(127)


if __name__ == "__main__":
    main()
