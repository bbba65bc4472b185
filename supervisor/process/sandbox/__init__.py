"""Sandboxed extensions: a server reads, writes and reaches only what its config grants.

Each run of a confined extension starts through the exec launcher (:mod:`.launch`), last in
the spawn chain: a private view of the file system holding only the granted paths
(:mod:`.mounts`), no capabilities, no_new_privs and a Landlock domain (:mod:`.landlock`:
TCP by ``network``, signals and abstract unix sockets scoped to its own tree, no ptrace out
of it), then ``execve`` of the command. What is granted is computed by :mod:`.policy`.

The daemon side here: :class:`Sandbox` per extension (its grants, digest and status record),
:class:`Run` per run (a private temporary directory, the launcher's command line).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.errors import SpawnError
from supervisor.process.sandbox import caches, pidsgroup
from supervisor.process.sandbox.host import Host, probe_host, probed
from supervisor.process.sandbox.policy import (
    CACHE,
    MAX_GRANTS,
    Context,
    Grant,
    Grants,
    Spec,
    explain,
    grants_for,
    ungranted_paths,
)

__all__ = (
    "LAUNCHER",
    "Context",
    "Grant",
    "Grants",
    "Host",
    "Run",
    "Sandbox",
    "Spec",
    "daemon_context",
    "explain",
    "explain_extension",
    "grants_for",
    "probe_host",
    "refused",
    "sandbox_for",
    "sweep",
    "tmp_base",
)

LAUNCHER = Path(__file__).with_name("launch.py")
_GRANT_HINT = "it will find them missing: grant them in its sandbox.read or sandbox.write"

log = structlog.get_logger(__name__)


def daemon_context(
    *,
    environ: Mapping[str, str],
    config_path: str | None,
    socket: str,
    state: str,
    spool: str,
    instance: str,
    max_abi: int | None = None,
    caches: str | None = None,
) -> Context:
    """The context of one daemon: its config (and the config's own directory, when it is one of
    ours: secrets files live beside it), socket directory, state and spool are hidden. *max_abi*
    caps the Landlock ABI used (to see what an older kernel gets); *caches* holds each
    extension's private package cache."""
    protected = [os.path.dirname(os.path.abspath(socket)), state, spool]  # caches: hidden by the policy
    if config_path:
        config = os.path.abspath(os.path.expanduser(config_path))
        mine = "mcp-supervisor" in os.path.basename(os.path.dirname(config))
        protected.append(os.path.dirname(config) if mine else config)
    return Context(environ, tuple(protected), tmp=tmp_base(instance), max_abi=max_abi, caches=caches)


def tmp_base(instance: str) -> str:
    """Where the private temporary directories of one daemon's extensions live."""
    return os.path.join(tempfile.gettempdir(), f"mcps-{os.getuid()}-{instance[:12]}")


class Run:
    """One run's private temporary directory and launcher command line.

    Resource handling: :meth:`remove` deletes the directory; call it once the tree is gone.
    """

    def __init__(self, sandbox: Sandbox, directory: str) -> None:
        self.sandbox = sandbox
        self.directory = directory
        self.tmp = os.path.join(directory, "t")
        self.staging = os.path.join(directory, "r")
        os.mkdir(self.tmp, 0o700)
        os.mkdir(self.staging, 0o700)
        self.scratch: tuple[str, ...] = ()  # its tmpfs mounts (paths inside its root): memory it holds
        self.tasks: Path | None = None  # its pids cgroup (a root daemon's pids_max)

    def wrap(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> tuple[list[str], dict[str, str]]:
        """*argv* (``argv[0]`` resolved) behind the launcher, and *env* with ``TMPDIR``.

        Error handling: raises a permanent :class:`SpawnError` when the grants are too many.
        """
        grants = self.sandbox.grants(argv[0], env)
        self.sandbox.warn_once(grants)
        if grants.environ and self.sandbox.context.caches:
            with contextlib.suppress(OSError):
                os.makedirs(self.sandbox.context.caches, 0o700, exist_ok=True)
        for grant in grants.entries:
            if grant.reason.startswith(CACHE) and grant.access == "write":
                with contextlib.suppress(OSError):
                    os.makedirs(grant.path, 0o700, exist_ok=True)  # bound only if it exists
        launcher = [sys.executable, "-I", "-S", str(LAUNCHER), "-n", grants.network, "-s", self.staging]
        host = self.sandbox.host
        launcher += ["-a", str(host.landlock), *([] if host.namespaces else ["-N"])]
        spec = self.sandbox.spec
        launcher += [] if spec.seccomp else ["-S"]
        if host.namespaces and spec.tmp_max:
            launcher += ["-m", str(spec.tmp_max)]
            self.scratch = (os.path.realpath(self.tmp), "/dev/shm")
        if host.tasks_limited and spec.pids_max:
            launcher += self._tasks_limit(spec.pids_max)
        for access, flag in (("read", "-r"), ("write", "-w"), ("hidden", "-x"), ("link", "-l")):
            for path in grants.paths(access):
                launcher += [flag, path]
        launcher += ["-t", os.path.realpath(self.tmp), "-c", cwd or self.sandbox.context.cwd, "--", *argv]
        return launcher, {**env, **grants.environ, "TMPDIR": self.tmp}

    def _tasks_limit(self, limit: int) -> list[str]:
        """The launcher's arguments for at most *limit* tasks: RLIMIT_NPROC in its own user
        namespace (never the user's own), or for a root daemon a pids cgroup of its own."""
        if not self.sandbox.host.root:
            return ["-p", str(limit)]
        directory = pidsgroup.base(os.path.basename(self.sandbox.context.tmp))
        try:
            if directory is None:
                raise OSError("no pids hierarchy to make it in")
            self.tasks = pidsgroup.create(directory, os.path.basename(self.directory), limit)
        except OSError as exc:
            log.warning("sandbox.pids_unlimited", error=str(exc))
            return []
        return ["-P", str(self.tasks)]

    async def remove(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove_tree, self.directory)
            if self.tasks is not None:  # the tree is gone: its cgroup is empty
                await anyio.to_thread.run_sync(pidsgroup.remove, self.tasks)


def _remove_tree(path: str) -> None:
    def writable(function: Any, failed: str, exc: BaseException) -> None:  # a child's 0000 directory
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700) if os.path.isdir(failed) else os.unlink(failed)
            function(failed)

    shutil.rmtree(path, onerror=lambda f, p, e: writable(f, p, e[1]))


class Sandbox:
    """One extension's confinement: its spec, the daemon's context, its last grants.

    *args*, *cwd*, *roots* and *own_env* (its ``env``) are the extension's config.
    """

    def __init__(
        self,
        name: str,
        spec: Spec,
        context: Context,
        *,
        args: Sequence[str],
        cwd: str | None,
        roots: Sequence[str],
        own_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name, self.spec, self.context = name, spec, context
        self.args, self.cwd, self.roots = list(args), cwd, list(roots)
        self.own_env = dict(own_env or {})  # the config's env: a package cache it names is its own
        self._last: Grants | None = None
        self._described = False
        self._warned = False  # of a path argument no grant covers: once
        self.host = Host(0, False, False, failure="not probed yet")  # prepare() probes it

    def grants(self, command: str, env: Mapping[str, str] | None = None) -> Grants:
        """The effective grants for the resolved executable *command* (remembered for status).

        Error handling: a permanent :class:`SpawnError` when they exceed :data:`MAX_GRANTS`.
        """
        grants = grants_for(
            self.spec,
            command=command,
            args=self.args,
            cwd=self.cwd,
            roots=self.roots,
            context=self.context,
            env={**self.context.environ, **(env or {})},
            own_env=self.own_env,
            cache=self.cache,
        )
        if len(grants.entries) > MAX_GRANTS:
            raise SpawnError(
                f"the sandbox grants {len(grants.entries)} paths, more than {MAX_GRANTS}; narrow its globs",
                permanent=True,
            )
        self._last = grants
        return grants

    @property
    def cache(self) -> str | None:
        """Its private package cache's directory (None: the daemon keeps none)."""
        return os.path.join(self.context.caches, self.name) if self.context.caches else None

    @property
    def caching(self) -> bool:
        """Whether its last run was given a private package cache (its command is a package
        manager or runs one): only then is there a cache to keep within ``cache_max``."""
        return self.cache is not None and self._last is not None and bool(self._last.environ)

    def warn_once(self, grants: Grants) -> None:
        """Say once (a restart does not again) which path arguments *grants* leave out."""
        if self._warned:
            return
        self._warned = True
        missing = ungranted_paths(
            self.args, grants, home=self.context.home, base=self.cwd or self.context.cwd
        )
        if missing:
            log.warning("sandbox.path_not_granted", extension=self.name, paths=missing, hint=_GRANT_HINT)

    def took(self, run: Run) -> None:
        """*run*, prepared by another :class:`Sandbox` of this extension (the daemon's head
        start), is this one's now: its grants are the ones :meth:`describe` shows."""
        self._last, self._warned, self.host = run.sandbox._last, run.sandbox._warned, run.sandbox.host
        run.sandbox = self

    def describe(self, command: str, *, starting: bool = False) -> dict[str, Any]:
        """The status record: mode, network, the grants digest (computed once if never run, and
        not while *starting*: the launch computes them, a status meanwhile shows none yet), and
        once the host is known, the layers it has (``confined``), what it lacks (``lacks``) and
        the limits of its config that do not bind (``unlimited``)."""
        if self._last is None and not self._described and not starting:
            self._described = True  # once: a command not found or too many paths is not retried here
            found = (
                shutil.which(command, path=self.context.environ.get("PATH"))
                if "/" not in command
                else command
            )
            with contextlib.suppress(OSError, SpawnError):
                self.grants(os.path.abspath(found or command))
        record: dict[str, Any] = {
            "mode": "confined",
            "network": self.spec.network,
            "digest": self._last.digest if self._last else None,
        }
        host = probed(self.context.max_abi)
        if host is not None:
            record |= {
                "confined": host.level(),
                "lacks": host.lacks(self.spec.network, seccomp=self.spec.seccomp),
                "unlimited": host.unlimited() if self.spec.pids_max else [],
            }
        return record

    async def prepare(self) -> Run:
        """Check the host can confine this extension as asked, and make this run's private directory.

        Error handling: a permanent :class:`SpawnError` saying why not and how to opt out.
        """
        host = self.host = await anyio.to_thread.run_sync(probe_host, self.context.max_abi)
        refusal = refused(self.spec, host)
        if refusal is not None:
            raise SpawnError(refusal, permanent=True)
        return await anyio.to_thread.run_sync(self._new_run)

    def _new_run(self) -> Run:
        caches.trim(self.cache, self.spec.cache_max, self.name)  # over cache_max: downloads again
        base = self.context.tmp
        try:
            os.makedirs(base, 0o700, exist_ok=True)
            info = os.lstat(base)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise SpawnError(f"{base} is not a private directory of this user", permanent=True)
            return Run(self, tempfile.mkdtemp(prefix=f"{self.name[:16]}-", dir=base))
        except OSError as exc:
            raise SpawnError(
                f"cannot make the sandbox's temporary directory: {exc}", permanent=False
            ) from exc


def refused(spec: Spec, host: Host) -> str | None:
    """Why an extension with *spec* must not start on *host*, or None: the host confines nothing,
    ``network: none`` without a network namespace, or a lack under ``require: full``."""
    if host.failure is not None:
        return (
            f"the sandbox cannot be set up here ({host.failure}); set `sandbox: false` to run it unconfined"
        )
    if spec.network == "none" and not host.network_namespace:
        return (
            f"network: none needs a network namespace, which this host refuses ({host.refused}); "
            "give it `network: outbound` or set `sandbox: false`"
        )
    lacks = host.lacks(spec.network, seccomp=spec.seccomp)
    if spec.require == "full" and lacks:
        return f"sandbox require: full, and this host cannot enforce it all: {'; '.join(lacks)}"
    return None


def sandbox_for(name: str, config: Any, context: Context) -> Sandbox | None:
    """The sandbox of extension *name* from its config (its ``sandbox``, defaults merged); None when off."""
    given = config.sandbox
    if not given.enabled:
        return None
    spec = Spec(
        given.network,
        tuple(given.read),
        tuple(given.write),
        given.require,
        given.seccomp,
        tmp_max=given.tmp_max,
        pids_max=given.pids_max,
        cache_max=given.cache_max,
    )
    return Sandbox(
        name, spec, context, args=config.args, cwd=config.cwd, roots=config.roots, own_env=config.env
    )


def sweep(base: str, *, remove: bool = False) -> int:
    """Remove what earlier runs left in *base* (a crashed daemon's); how many directories.

    *remove*: *base* itself too (the daemon's exit, once every extension is stopped).
    """
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for entry in names:
        _remove_tree(os.path.join(base, entry))
    if (tasks := pidsgroup.base(os.path.basename(base)) if os.getuid() == 0 else None) is not None:
        pidsgroup.sweep(tasks)  # the runs' pids cgroups it left
        if remove:
            with contextlib.suppress(OSError):
                tasks.rmdir()
    if remove:
        with contextlib.suppress(OSError):
            os.rmdir(base)
    return len(names)


def explain_extension(name: str, config: Any, context: Context) -> list[str]:
    """``check-config --explain NAME``: what stdio extension *name* (its config) may reach, and
    why (a remote one: :func:`supervisor.remote.explain.explain`)."""
    confined = sandbox_for(name, config, context)
    if confined is None:
        return [f"{name}: not sandboxed (sandbox: false): it can do whatever the daemon's user can"]
    env = {**context.environ, **config.env}
    command = config.command
    found = command if "/" in command else shutil.which(command, path=env.get("PATH"))
    lines = [] if found else [f"{name}: command {command!r} is not found on PATH; as if it were {command}"]
    base = config.cwd or context.cwd
    grants = confined.grants(os.path.join(base, found or command), env)
    lines += explain(name, grants)
    missing = ungranted_paths(config.args, grants, home=context.home, base=base)
    lines += [f"  not granted: {path} (an argument of it: {_GRANT_HINT})" for path in missing]
    host = probe_host(context.max_abi)
    refusal = refused(confined.spec, host)
    lines.append(f"  confined by: {host.level()}" if host.failure is None else "  confined by: nothing")
    lacks = host.lacks(confined.spec.network, seccomp=confined.spec.seccomp)
    lines += [f"  not enforced here: {lack}" for lack in lacks]
    lines += [f"  not enforced here: {limit}" for limit in host.unlimited() if confined.spec.pids_max]
    if refusal is not None:
        lines.append(f"  it will not start: {refusal}")
    return lines
