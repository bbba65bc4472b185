"""A private view of the file system: only the granted paths exist in it.

Standard library only and no relative imports (the exec launcher loads this file by path).

The launcher enters a new user and mount namespace (and a network namespace for
``network: none``), mounts an empty tmpfs as the new root, binds every granted path into it
at the same path (read-only unless granted for writing), hides the protected paths that a
grant happens to cover under empty read-only mounts, and pivots into it. The daemon gives
real paths, checked: each is opened one component at a time without following a symlink
(:func:`open_no_symlinks`), and what that opened is what gets bound, so a path swapped for a
symlink since the check fails the start instead of binding elsewhere. The symlinks that led
to a grant are made again inside, so paths resolve inside exactly as outside.

Why namespaces and not Landlock alone: Landlock (ABI 7) does not govern connecting to a unix
socket by path, so without them a sandboxed server could reach the daemon's own sockets, an
ssh or gpg agent, D-Bus or docker.sock. In the private view those sockets do not exist.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

TYPE_CHECKING = False  # typing and collections.abc cost milliseconds of every launch
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ("build_root", "enter_namespaces", "open_no_symlinks")

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV = 1, 2, 4
_AT_RECURSIVE = 0x8000
_SYS = {
    "x86_64": {"mount_setattr": 442, "pivot_root": 155},
    "aarch64": {"mount_setattr": 442, "pivot_root": 41},
}
_MAX_LINKS = 40  # symlinks followed for one path, as the kernel's ELOOP limit

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _check(result: int, what: str) -> None:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _syscall(name: str) -> int:
    try:
        return _SYS[os.uname().machine][name]
    except KeyError:
        raise OSError(0, f"the sandbox does not know {name} on {os.uname().machine}") from None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda s: os.fsencode(s) if s is not None else None  # noqa: E731
    result = _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data))
    _check(result, f"mount {source or fstype} on {target}")


def _set_attr(path: str, attrs: int) -> None:
    """Add mount attributes to *path* and every mount beneath it (only ever adds)."""
    attr = _MountAttr(attrs, 0, 0, 0)
    result = _libc.syscall(
        _syscall("mount_setattr"),
        -100,
        os.fsencode(path),
        _AT_RECURSIVE,
        ctypes.byref(attr),
        ctypes.sizeof(attr),
    )
    _check(result, f"mount_setattr {path}")


def open_no_symlinks(path: str) -> int:
    """An ``O_PATH`` descriptor of the absolute *path*, opened one component at a time from ``/``:
    ``OSError(ELOOP)`` if any component is a symlink (it was not when the daemon checked it)."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(errno.EINVAL, f"{path}: '..' in a path the daemon resolved")
            child = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, f"{path} changed since the daemon checked it (a symlink now)")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_namespaces(*, network: bool) -> None:
    """Enter a new user and mount namespace (and network one unless *network*), same uid and gid.

    The user namespace is what lets an unprivileged process (or root without capabilities, as
    in the systemd unit) mount; its uid and gid map to themselves, so files keep their owners.
    """
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | (0 if network else _CLONE_NEWNET)
    kinds = "user and mount namespaces" if network else "user, mount and network namespaces"
    _check(_libc.unshare(flags), f"cannot create {kinds}")
    _write("/proc/self/setgroups", "deny")
    try:
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
    except PermissionError:
        if uid != 0:
            raise
        raise PermissionError(  # Linux 5.12+: mapping root takes CAP_SETFCAP
            0,
            "root without CAP_SETFCAP cannot map itself into a user namespace (give the daemon that "
            "capability, as the systemd unit does, or run it as a regular user)",
        ) from None
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here propagates back


class _Root:
    """The new root being built on a tmpfs at *staging*; host paths are read directly."""

    def __init__(self, staging: str) -> None:
        _mount("tmpfs", staging, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
        self.staging = staging
        self.devs = {os.stat(staging).st_dev}  # file systems of ours: we may create in them
        self.covers: list[str] = []  # the hiding mounts, made read-only once everything is placed

    def inside(self, path: str) -> str:
        return self.staging + path

    def place(self, path: str) -> str | None:
        """Create what *path* needs in the new root; the host path to bind there, or None if missing.

        Directories on the way are created in the tmpfs (never on the host: a component that
        is missing inside a bound directory is missing on the host too), symlinks recreated.
        """
        host, rest, links = "/", [part for part in path.split("/") if part], 0
        while rest:
            part = rest.pop(0)
            candidate = os.path.join(host, part)
            try:
                info = os.lstat(candidate)
            except OSError:
                return None
            inner = self.inside(candidate)
            present = os.path.lexists(inner)
            ours = os.lstat(os.path.dirname(inner)).st_dev in self.devs
            if stat.S_ISLNK(info.st_mode):
                link = os.readlink(candidate)
                if not present and ours:
                    os.symlink(link, inner)
                links += 1
                if links > _MAX_LINKS:
                    return None
                target = os.path.normpath(os.path.join(host, link))  # host is real: ".." is safe
                host, rest = "/", [p for p in target.split("/") if p] + rest
                continue
            if not present:
                if not ours:
                    return None
                if rest or stat.S_ISDIR(info.st_mode):
                    os.mkdir(inner, 0o755)
                else:
                    os.close(os.open(inner, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            host = candidate
        return host

    def bind(self, path: str, *, writable: bool, devices: bool = False) -> bool:
        """Bind host *path* (a real path) at the same place inside, as opened without following
        a symlink; False if it does not exist. Raises ``OSError(ELOOP)`` if it became a symlink."""
        try:
            fd = open_no_symlinks(path)
        except FileNotFoundError:
            return False
        try:
            if not self._make(path, directory=stat.S_ISDIR(os.fstat(fd).st_mode)):
                return False
            _mount(f"/proc/self/fd/{fd}", self.inside(path), None, _MS_BIND | _MS_REC)
        finally:
            os.close(fd)
        attrs = _ATTR_NOSUID | (0 if devices else _ATTR_NODEV) | (0 if writable else _ATTR_RDONLY)
        _set_attr(self.inside(path), attrs)
        return True

    def _make(self, path: str, *, directory: bool) -> bool:
        """Make *path* exist inside, as a mount point: its missing components in our tmpfs (never
        on the host). False if a component is missing inside a bound directory."""
        inner = self.staging
        parts = [part for part in path.split("/") if part]
        for n, part in enumerate(parts):
            inner = os.path.join(inner, part)
            if os.path.lexists(inner):
                continue
            if os.lstat(os.path.dirname(inner)).st_dev not in self.devs:
                return False
            if n < len(parts) - 1 or directory:
                os.mkdir(inner, 0o755)
            else:
                os.close(os.open(inner, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        return True

    def hide(self, path: str) -> None:
        """Cover *path* (if a grant made it visible) with something empty and read-only.

        Not through a symlink: one inside a bound directory leads to the host's tree, where a
        mount would cover the source of a grant still to be bound (its real path is hidden by its
        own name)."""
        inner = self.inside(path)
        if not os.path.lexists(inner) or self._through_a_link(path):
            return
        if os.path.isdir(inner):
            _mount("tmpfs", inner, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755,size=64k")
            self.devs.add(os.stat(inner).st_dev)
            self.covers.append(inner)  # writable until the private tmp and cwd are placed
        else:
            _mount(self.inside("/.empty"), inner, None, _MS_BIND)
            _set_attr(inner, _ATTR_RDONLY | _ATTR_NOSUID | _ATTR_NODEV)

    def _through_a_link(self, path: str) -> bool:
        inner = self.staging
        for part in (part for part in path.split("/") if part):
            inner = os.path.join(inner, part)
            if os.path.islink(inner):
                return True
        return False

    def devices(self, shm_size: int) -> None:
        """A minimal /dev: the harmless devices, a private devpts and a /dev/shm of *shm_size*
        bytes (0: the kernel's default, half the memory)."""
        os.makedirs(self.inside("/dev/pts"), 0o755)
        os.mkdir(self.inside("/dev/shm"), 0o755)
        for name in ("null", "zero", "full", "random", "urandom", "tty"):
            self.bind(f"/dev/{name}", writable=True, devices=True)
        _mount(
            "devpts", self.inside("/dev/pts"), "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666"
        )
        self.scratch("/dev/shm", shm_size, mode=0o1777)
        links = {"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0"}
        links |= {"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
        for name, target in links.items():
            os.symlink(target, self.inside(f"/dev/{name}"))

    def scratch(self, path: str, size: int, *, mode: int) -> None:
        """A tmpfs of its own at *path* (which exists inside), *size* bytes at most (0: the default)."""
        options = f"mode={mode:o}" + (f",size={size}" if size else "")
        _mount("tmpfs", self.inside(path), "tmpfs", _MS_NOSUID | _MS_NODEV, options)

    def enter(self) -> None:
        """Make the new root the process's root, with the tmpfs itself read-only."""
        for cover in self.covers:
            _mount(
                None, cover, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
            )
        os.chdir(self.staging)
        _check(_libc.syscall(_syscall("pivot_root"), b".", b"."), "pivot_root")
        _check(_libc.umount2(b".", _MNT_DETACH), "umount the old root")  # it is stacked on the new one
        os.chdir("/")
        _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def build_root(
    staging: str,
    *,
    read: Iterable[str],
    write: Iterable[str],
    hide: Iterable[str],
    tmp: str = "",
    tmp_size: int = 0,
    cwd: str = "",
    links: Iterable[str] = (),
) -> None:
    """Replace this process's view of the file system with the granted paths only.

    *staging* is an empty host directory to build in; *read* and *write* are absolute paths,
    missing ones skipped. Deeper grants are bound after shallower ones, so a write grant
    inside a read grant stays writable. *hide* paths are covered in the same order, so a grant
    inside a hidden path still shows. /dev, /proc and /sys are provided; then *tmp* is bound
    writable (it may lie in a hidden directory), or with *tmp_size* it is a tmpfs of that many
    bytes, as /dev/shm is (memory the daemon counts in ``memory_max``, gone with the namespace);
    the symlinks *links* that lead to grants are made again, and *cwd* is made to exist (empty
    unless granted).
    """
    root = _Root(staging)
    os.close(os.open(root.inside("/.empty"), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0))  # covers files
    steps = [(p, "read") for p in read] + [(p, "write") for p in write] + [(p, "hide") for p in hide]
    # Shallow first; at one path, bind then hide; so a grant inside a hidden path shows through.
    for path, step in sorted(steps, key=lambda s: (s[0].rstrip("/").count("/"), s[1] == "hide")):
        if step == "hide":
            root.hide(path)
        else:
            root.bind(path, writable=step == "write")
    root.devices(tmp_size)
    for path in ("/proc", "/sys"):
        root.bind(path, writable=False)
    if tmp and not root.bind(tmp, writable=True):
        raise OSError(0, f"the private temporary directory {tmp} is missing")
    if tmp and tmp_size:
        root.scratch(tmp, tmp_size, mode=0o700)
    for link in links:
        root.place(link)
    if cwd:
        root.place(cwd)
    root.enter()
