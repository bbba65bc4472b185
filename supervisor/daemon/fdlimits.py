"""File descriptors: the daemon's soft limit raised to its hard one, and shared so none runs out.

Every connection to a listener costs an fd, and so does every pipe to a child. Under the usual
soft limit of 1024, a thousand stalled HTTP connections left the control socket unable to
accept (``EMFILE``), so not even ``status`` answered. At start the daemon raises its soft limit
to the hard one (systemd's unit sets ``LimitNOFILE=``), and :func:`plan` gives each listener a
connection cap that fits beside an fd reserve for the children and the daemon itself, so a
listener at its cap never starves the others. The control socket also holds one spare fd
(:class:`supervisor.sockets.Spare`) that it gives up to accept the operator when the process is out of fds
anyway.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ("FdPlan", "plan", "raise_soft_limit")

BASE_RESERVE = 64  # the daemon's own: the event loop, logs, the guardian, spool files, /proc reads
ACCEPT_BURST = 64  # connections a listener may accept in one go before it closes the ones over its cap
PER_CHILD = 8  # a child's pipes, pidfd and cgroup files, with room to spare
MIN_SHARE = 8  # connections a listener gets however low the limit
UNIX_CLIENT_FDS = 3  # an mcp.sock client handed off by connect: the socket and the client's two pipes


@dataclass(frozen=True, slots=True)
class FdPlan:
    """Connection caps per listener, from an fd limit. Pure data."""

    limit: int
    reserved: int  # for children and the daemon itself
    control: int
    unix: int  # mcp.sock
    http: int

    @property
    def cramped(self) -> bool:
        """Whether the limit forced caps below their defaults."""
        return (
            self.unix < _DEFAULTS["unix"]
            or self.http < _DEFAULTS["http"]
            or self.control < _DEFAULTS["control"]
        )


_DEFAULTS = {"control": 64, "unix": 256, "http": 256}


def raise_soft_limit() -> int:
    """Raise ``RLIMIT_NOFILE``'s soft limit to the hard one (capped at 1,048,576); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep what we have; plan() fits the caps to it
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def plan(limit: int, children: int) -> FdPlan:
    """Caps for the listeners under *limit*, keeping a reserve for *children* (each may have a child
    and, per client, instances: the caller counts them). Pure.

    The control socket keeps its default while it fits: it is how the operator gets in.
    """
    reserved = BASE_RESERVE + ACCEPT_BURST + PER_CHILD * children
    available = max(0, limit - reserved)
    control = max(MIN_SHARE, min(_DEFAULTS["control"], available // 8))
    share = max(0, available - control)  # fds, half to each listener
    unix = max(MIN_SHARE, min(_DEFAULTS["unix"], share // 2 // UNIX_CLIENT_FDS))
    http = max(MIN_SHARE, min(_DEFAULTS["http"], share - UNIX_CLIENT_FDS * unix))
    return FdPlan(
        limit=limit,
        reserved=reserved,
        control=control,
        unix=unix,
        http=http,
    )
