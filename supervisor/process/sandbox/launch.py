"""The exec launcher: confine this process, then become the extension's command.

Run as ``python -I -S launch.py OPTIONS -- COMMAND ARGS...`` (last in the spawn shim's exec
chain, after the cgroup join). It imports only the standard library and its two siblings,
loaded by path: no pydantic, no mcp, no anyio (its whole start costs a few milliseconds, see
bench/sandbox.py). It never forks: it ``execve``s the command, so no process of its own is left.

Options (one value each, repeatable where it makes sense): ``-n MODE`` network
(``none | outbound | all``), ``-r PATH`` readable, ``-w PATH`` writable, ``-x PATH`` hidden even
inside a grant, ``-l PATH`` a symlink leading to a grant (made again inside), ``-t DIR`` the
private temporary directory (writable, placed last), ``-m BYTES`` the size of the memory it and
``/dev/shm`` are given (each its own tmpfs, with a private root; default: the directory as is),
``-p N`` the most tasks (processes and threads) the extension's tree may have (``RLIMIT_NPROC``
in its own user namespace, so it counts that tree alone), ``-P DIR`` a pids cgroup to join
first (a root daemon's ``pids_max``: root is exempt from ``RLIMIT_NPROC``), ``-s DIR``
an empty directory to build the new root in, ``-c DIR`` the working directory to enter inside
(made to exist, readable only if granted), ``-a N`` the Landlock ABI to use (0: none; default
the kernel's), ``-N`` no namespaces (the host refuses them), ``-S`` no seccomp filter.
``--probe`` instead of ``-- COMMAND``: confine, print what this kernel offers as one JSON
object (``{"landlock": N}``), exit 0 (the daemon's check of the host).

Each layer is applied by itself, as far as the host has it (the daemon decides which, from its
probe, and says what is missing): new user + mount (+ network) namespaces and the private root
(:mod:`mounts`); no capabilities; a fresh session keyring; the Landlock domain (:mod:`landlock`),
which without a private root grants the entries around a hidden path instead of the path that
holds it; the seccomp filter (:mod:`seccomp`), which without a private root also refuses unix
sockets; no_new_privs; exec. Any failure exits with :data:`EXIT_SANDBOX` and one line on
stderr: the command never runs less confined than asked.
"""

from __future__ import annotations

import os
import resource
import stat
import sys

try:  # imported as part of the package (tests, the structure check)
    from supervisor.process.sandbox import landlock, mounts, seccomp
except ImportError:  # run as a file by the spawn chain: siblings by path (-I leaves the dir off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import landlock  # type: ignore[no-redef]
    import mounts  # type: ignore[no-redef]
    import seccomp  # type: ignore[no-redef]

__all__ = ("EXIT_SANDBOX", "Options", "confine", "main", "parse")

EXIT_SANDBOX = 71  # EX_OSERR: the sandbox could not be set up; nothing of the command ran
_PR_CAPBSET_READ, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 23, 24, 47, 4
_CAP_V3 = 0x20080522
_PR_SET_NO_NEW_PRIVS = 38  # set by Landlock and seccomp themselves; by hand when neither applies
_KEYCTL = {"x86_64": 250, "aarch64": 219}
_KEYCTL_JOIN_SESSION_KEYRING = 1
MAX_SPLIT = 10_000  # entries granted one by one around hidden paths, without a private root
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


class Options:
    """The parsed command line: the policy, and the command to exec."""

    def __init__(self) -> None:
        self.network = "all"
        self.read: list[str] = []
        self.write: list[str] = []
        self.hide: list[str] = []
        self.links: list[str] = []
        self.staging = ""
        self.cwd = ""
        self.tmp = ""
        self.tmp_size = 0  # bytes of each private tmpfs; 0: TMPDIR bound from the host, /dev/shm unsized
        self.pids_max = 0  # 0: no limit
        self.pids_cgroup = ""  # a cgroup to join first (a root daemon's pids_max), or none
        self.command: list[str] = []
        self.probe = False
        self.abi: int | None = None  # None: the kernel's
        self.namespaces = True
        self.seccomp = True


def parse(argv: list[str]) -> Options:
    """``-n/-r/-w/-x/-l/-t/-s/-c VALUE ... -- COMMAND ...``; raises ``ValueError`` on anything else."""
    options, lists = Options(), {"-r": "read", "-w": "write", "-x": "hide", "-l": "links"}
    singles = {"-n": "network", "-s": "staging", "-c": "cwd", "-t": "tmp", "-P": "pids_cgroup"}
    position = 0
    while position < len(argv):
        flag = argv[position]
        if flag in ("-N", "-S"):
            setattr(options, "namespaces" if flag == "-N" else "seccomp", False)
            position += 1
            continue
        numbers = {"-a": "abi", "-m": "tmp_size", "-p": "pids_max"}
        if flag in numbers and position + 1 < len(argv) and argv[position + 1].isdigit():
            setattr(options, numbers[flag], int(argv[position + 1]))
            position += 2
            continue
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
    if options.network == "none" and not options.namespaces:
        raise ValueError("network none needs a network namespace, and -N says there are none")
    return options


def _drop_capabilities() -> None:
    """No capability now or after exec, even for uid 0 (bounding, ambient, then the sets)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            errno = ctypes.get_errno()
            # EPERM: no user namespace and no CAP_SETPCAP. Fine if it is not in the set anyway, or
            # we are not root: with no_new_privs no exec gains a capability from the bounding set.
            if errno == 1 and (libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) == 0 or os.getuid() != 0):
                continue
            raise OSError(errno, "prctl(PR_CAPBSET_DROP)")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_V3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (64 bits)
    if libc.capset(header, data) < 0:
        raise OSError(ctypes.get_errno(), "capset")


def confine(options: Options) -> int:
    """Everything but the exec; the Landlock ABI used. Raises ``OSError`` naming the step that failed."""
    version = landlock.abi() if options.abi is None else min(options.abi, landlock.abi())
    if options.pids_cgroup:  # first, as root in the host's namespaces: all it starts is counted
        with open(os.path.join(options.pids_cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    if options.namespaces:
        mounts.enter_namespaces(network=options.network != "none")
        if options.pids_max:  # counted per user namespace: this tree's tasks, not the user's
            resource.setrlimit(resource.RLIMIT_NPROC, (options.pids_max, options.pids_max))
        mounts.build_root(
            options.staging,
            read=options.read,
            write=options.write,
            hide=options.hide,
            tmp=options.tmp,
            tmp_size=options.tmp_size,
            cwd=options.cwd,
            links=options.links,
        )
    try:
        os.chdir(options.cwd or "/")
    except OSError:
        os.chdir("/")
    _drop_capabilities()
    _fresh_keyring()
    if version >= 1:
        _landlock(options, version)
    if options.seccomp:
        seccomp.install(unix_sockets=options.namespaces)  # no private root: no unix sockets at all
    elif version < 1:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    return version


def _fresh_keyring() -> None:
    """Leave the daemon's session keyring for an empty one of our own (its keys are the user's)."""
    import ctypes

    number = _KEYCTL.get(os.uname().machine)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if number is not None and libc.syscall(number, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        errno = ctypes.get_errno()
        if errno not in (38, 1):  # ENOSYS, EPERM: no keyrings here (a container's seccomp)
            raise OSError(errno, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(errno)}")


def _landlock(options: Options, version: int) -> None:
    rules = landlock.Ruleset(options.network, version=version)
    device = landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV
    grants = [(p, landlock.READ) for p in (*options.read, "/proc", "/sys")]
    grants += [
        (p, landlock.WRITE) for p in (*options.write, "/dev/shm", *([options.tmp] if options.tmp else []))
    ]
    grants += [(p, device) for p in (*_DEVICES, "/dev/pts")]
    hidden = [] if options.namespaces else [os.path.normpath(h) for h in options.hide]
    # A read grant inside a write grant (what others execute) is read-only: the private root
    # binds it so; Landlock alone grants writing around it, and it reading by its own entry.
    read_only = [] if options.namespaces else [os.path.normpath(r) for r in options.read]
    budget = [MAX_SPLIT]
    for path, rights in grants:
        try:
            fd = mounts.open_no_symlinks(path)  # what the daemon checked, or a refusal to start
        except FileNotFoundError:  # skipped by the root as well
            continue
        around = hidden + read_only if rights == landlock.WRITE else hidden
        try:
            _allow_around(rules, fd, os.path.normpath(path), rights, around, budget)
        finally:
            os.close(fd)
    rules.restrict_self()


def _allow_around(
    rules: landlock.Ruleset, fd: int, path: str, rights: int, hidden: list[str], budget: list[int]
) -> None:
    """Grant *rights* beneath *fd* (at *path*); where a hidden path lies beneath, grant the entries
    beside it instead, one by one, opened from their directory without following symlinks (a
    link there is not granted: its target is granted by its own name, or not at all), and the
    directory itself only its listing."""
    if path in hidden:
        return
    prefix = path.rstrip("/") + "/"
    if not any(h.startswith(prefix) for h in hidden):
        rules.allow_fd(fd, rights, path)
        return
    # Listing it stays allowed (an import lists the directories on its path), and so, Landlock
    # rights being inherited, does listing what lies beneath: a hidden directory's names show,
    # never its files' contents.
    rules.allow_fd(fd, rights & landlock.READ_DIR, path)
    directory = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        for name in os.listdir(directory):
            budget[0] -= 1
            if budget[0] < 0:
                raise OSError(0, f"more than {MAX_SPLIT} entries to grant one by one around hidden paths")
            try:
                child = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except OSError:
                continue
            try:
                if not stat.S_ISLNK(os.fstat(child).st_mode):
                    _allow_around(rules, child, prefix + name, rights, hidden, budget)
            finally:
                os.close(child)
    finally:
        os.close(directory)


def main(argv: list[str] | None = None) -> None:
    """Confine, then exec the command; never returns."""
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        version = confine(options)
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        sys.stderr.write(f"mcp-supervisor sandbox: cannot confine the extension: {detail}\n")
        sys.stderr.flush()
        os._exit(EXIT_SANDBOX)
    if options.probe:
        sys.stdout.write(f'{{"landlock": {version}}}\n')
        sys.stdout.flush()
        os._exit(0)
    try:
        os.execv(options.command[0], options.command)
    except OSError as exc:
        sys.stderr.write(f"mcp-supervisor sandbox: cannot run {options.command[0]}: {exc.strerror}\n")
        sys.stderr.flush()
        os._exit(127)


if __name__ == "__main__":
    main()
