"""How one daemon contains its extensions' process trees; chosen once, at startup.

``cgroup``: a writable cgroup v2 hierarchy (the root cgroup, or a delegated one such as a
systemd unit with ``Delegate=yes``) gives each run a cgroup of its own (:mod:`.cgroups`).
``scan``: elsewhere, trees are found in ``/proc`` (:mod:`.proctree`). In both, the daemon is
a child subreaper (:mod:`.reaper`) and a guardian process (:mod:`.guardian`) ends every tree
if the daemon dies without cleaning up. ``MCP_SUPERVISOR_CONTAINMENT=scan`` forces the
fallback; ``=cgroup`` also uses a cgroup that is writable but not marked as delegated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from supervisor.process import cgroups, guardian, reaper, spawner
from supervisor.process import children as process
from supervisor.process.cgroups import Subtree

__all__ = ("MODES", "REAP_INTERVAL", "Containment")

log = structlog.get_logger(__name__)

MODES = ("auto", "cgroup", "scan")
REAP_INTERVAL = 1.0  # seconds between looks for exited orphans (see Containment.keep_reaping)
_GUARDIAN_START = 10.0  # seconds for a guardian to say it is ready


@dataclass(eq=False)
class Containment:
    """The containment of one daemon. Resource handling: :meth:`close` ends the guardian."""

    prefix: str
    subtree: Subtree | None
    subreaper: bool
    _guardian: subprocess.Popen[bytes] | None = None
    _to_guardian: int = -1  # the write end of the guardian's stdin: closing it says "clean exit"
    _guardian_pidfd: int = -1
    _closing: bool = False
    _restarts: int = field(default=0)

    @property
    def mode(self) -> str:
        return "cgroup" if self.subtree is not None else "scan"

    @classmethod
    async def prepare(cls, *, instance: str, prefix: str, want: str = "auto") -> Containment:
        """Become a subreaper, build the cgroup sub-tree if we may, and start the guardian.

        Also kills what an earlier daemon on the same socket left in its cgroups. Returns once
        the guardian is armed, so no extension ever runs unguarded. Shielded (a SIGTERM during
        startup waits for it, about 50 ms): half a preparation could not be cleaned up.
        """
        subreaper = reaper.become_subreaper()
        if want not in MODES:
            log.warning("daemon.bad_containment", value=want, expected=list(MODES), using="auto")
            want = "auto"
        with anyio.CancelScope(shield=True):
            subtree = await anyio.to_thread.run_sync(_make_subtree, instance, want)
            process.contain_in(subtree, prefix=prefix)
            self = cls(prefix, subtree, subreaper)
            try:
                await self._start_guardian()
            except (OSError, RuntimeError, TimeoutError) as exc:  # contained still, not after a SIGKILL
                log.error("daemon.guardian_failed", error=str(exc) or type(exc).__name__)
        log.info("daemon.containment", **self.describe())
        return self

    def describe(self) -> dict[str, Any]:
        """For ``health``: the mode, this daemon's cgroup sub-tree, the guardian's pid."""
        return {
            "mode": self.mode,
            "cgroup": str(self.subtree.path) if self.subtree else None,
            "subreaper": self.subreaper,
            "guardian_pid": self._guardian.pid if self._guardian else None,
            "guardian_restarts": self._restarts,
        }

    async def keep_reaping(self) -> None:
        """Reap the orphans that came back to us (a subreaper) and exited, every
        :data:`REAP_INTERVAL` seconds, until cancelled.

        Not on SIGCHLD: the event loop (uvloop) keeps that signal for itself. Meanwhile a zombie
        holds only its pid; the peek that finds none costs one system call.
        """
        if not self.subreaper:
            return
        while True:
            await anyio.sleep(REAP_INTERVAL)
            reaped = await anyio.to_thread.run_sync(reaper.reap_strangers)
            if reaped:
                log.debug("daemon.reaped_orphans", count=len(reaped))

    async def keep_guardian(self) -> None:
        """Start a new guardian whenever it died (it should not) or could not start; runs until cancelled."""
        failures = 0
        while not self._closing:
            if self._guardian_pidfd >= 0:
                await anyio.wait_readable(self._guardian_pidfd)
                if self._closing:
                    return
                await anyio.to_thread.run_sync(self._reap_guardian, 1.0)
                log.error("daemon.guardian_exited", hint="starting a new one")
                self._restarts += 1
            await anyio.sleep(min(2.0**failures, 60.0))  # a guardian that cannot start must not spin
            try:
                await self._start_guardian()
                failures = 0
            except (OSError, RuntimeError, TimeoutError) as exc:
                failures += 1
                log.error("daemon.guardian_failed", error=str(exc) or type(exc).__name__)

    async def close(self) -> None:
        """After every extension stopped: kill what is left, remove the sub-tree, end the guardian."""
        self._closing = True
        with anyio.CancelScope(shield=True):
            clean = functools.partial(
                guardian.clean_up,
                self.prefix,
                self.subtree.path if self.subtree else None,
                adopter=os.getpid() if self.subreaper else None,
                tracked=reaper.tracked(),
            )
            killed = await anyio.to_thread.run_sync(clean)
            if killed:
                log.warning("daemon.killed_leftovers", count=killed)
            if self.subtree is not None:
                await anyio.to_thread.run_sync(self.subtree.remove_all)
            if self._to_guardian >= 0:
                os.close(self._to_guardian)
                self._to_guardian = -1
            if self._guardian is not None:
                await anyio.to_thread.run_sync(self._reap_guardian, 5.0)

    async def _start_guardian(self) -> None:
        argv = guardian.argv(
            daemon=os.getpid(), prefix=self.prefix, subtree=self.subtree.path if self.subtree else None
        )
        env = {k: v for k, v in os.environ.items() if k != process.MARKER_ENV}
        if self._to_guardian >= 0:  # the pipe of a guardian that died
            os.close(self._to_guardian)
        read_end, self._to_guardian = os.pipe()
        try:
            popen = await _wrap(spawner.submit(functools.partial(_popen_guardian, argv, env, read_end)))
        finally:
            os.close(read_end)
        assert popen.stdout is not None
        self._guardian, self._guardian_pidfd = popen, os.pidfd_open(popen.pid)
        try:
            with anyio.fail_after(_GUARDIAN_START):
                await anyio.wait_readable(popen.stdout.fileno())
            if popen.stdout.read1(64) != b"ready\n":
                raise RuntimeError("the guardian process did not start")
        except BaseException:
            popen.kill()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._reap_guardian, 5.0)
            raise

    def _reap_guardian(self, within: float) -> None:
        if self._guardian is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._guardian.wait(within)
        if self._guardian.returncode is not None:
            reaper.untrack(self._guardian.pid)
            with contextlib.suppress(OSError):
                self._guardian.stdout.close()  # type: ignore[union-attr]
            with contextlib.suppress(OSError):
                os.close(self._guardian_pidfd)
            self._guardian, self._guardian_pidfd = None, -1


async def _wrap(future: Any) -> Any:
    return await asyncio.wrap_future(future)


def _popen_guardian(argv: list[str], env: dict[str, str], stdin: int) -> subprocess.Popen[bytes]:
    with reaper.lock:
        popen = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
        reaper.track(popen.pid)
    return popen


def _make_subtree(instance: str, want: str) -> Subtree | None:
    if want == "scan":
        return None
    found = cgroups.locate(force=want == "cgroup")
    subtree = None
    if found is not None:
        base, move_self = found
        try:
            subtree = Subtree.prepare(base, f"{instance}-{os.getpid()}", move_self=move_self)
        except OSError as exc:
            log.warning("daemon.cgroup_unavailable", cgroup=str(base), error=str(exc))
    if subtree is None:
        log.info("daemon.no_cgroup", hint="containing process trees by /proc scans (see docs/operations.md)")
        return None
    for stale in subtree.stale(f"{instance}-"):  # an earlier daemon on this socket, and its guardian, died
        try:
            killed = guardian.clean_up("\0", stale)  # the prefix matches no marker: cgroup only
        except OSError as exc:  # its own guardian, still at work, removed it under us
            log.info("daemon.cgroup_gone", cgroup=str(stale), error=str(exc))
            continue
        log.warning("daemon.swept_cgroup", cgroup=str(stale), killed=killed)
    try:
        for abandoned in subtree.remove_abandoned():
            log.info("daemon.removed_cgroup", cgroup=str(abandoned))
    except OSError as exc:  # others' leftovers, swept as a courtesy: never this daemon's end
        log.warning("daemon.sweep_failed", cgroup=str(subtree.path.parent), error=str(exc))
    return subtree
