"""Per-client instances: one child per gateway client for ``instances: per-client`` extensions.

A stateful server (a browser, a shell) shared by two clients mixes their state. Per client, each
gateway connection gets an :class:`~supervisor.extension.Extension` of its own (its own child,
spool directory and containment), made on that client's first use and started by its first
call like an on-demand one. Its watcher runs in the daemon's task group like any other; the
connection's close only asks it to stop (sync), the watcher tears the tree down, and the
daemon's shutdown waits for it. The control socket's calls use the shared instance (the
daemon's own Extension of that name), whose listing is also the one clients see.

A client is a connection that lasts: on ``mcp.sock`` the stream, over streamable HTTP the MCP
session (``Mcp-Session-Id``; its DELETE or idle expiry closes it). A 2026-07-28 request over HTTP
has no session, so no client to give an instance to: it is refused rather than given a child
that would live for one request (a stateful server would forget everything between calls).

At ``max_instances`` a new client's instance needs room. The daemon asks the gateway to
*reclaim* one: an HTTP session with no request and no stream open for a while ends (its client
sees 404 and opens a new session, as the protocol says), and its instance stops; a client on
``mcp.sock`` is never reclaimed, as its open connection shows it is there.
A call at the cap waits in line (:meth:`Instances.acquire`, bounded by its caller) for an
instance on its way out (reclaimed, or its client left) to be gone: its steps are
:meth:`Instances.queued`, :meth:`Instances.room_coming` (where the reclaim happens) and
:meth:`Instances.one_gone`; with nothing on its way out the answer is a retryable "busy" at once.

Operations act on every instance: :meth:`Instances.stop_all` (``stop NAME``) also *holds* them,
so no client gets a new one until :meth:`Instances.resume` (``start NAME``);
:meth:`Instances.restart_all` restarts the running ones, each with the usual restart semantics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from supervisor.errors import ExtensionUnavailable
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from supervisor.process.usage import Sampler

__all__ = ("SESSIONLESS", "Client", "Instances", "Replaced", "figures")

SESSIONLESS = (
    "one child per client session, and a 2026-07-28 request over HTTP has no session: connect "
    "with the 2025-11-25 protocol over HTTP, or through mcp.sock"
)
_COUNTED = ("restarts", "unresponsive", "memory_exceeded")  # of the snapshot, summed in totals()


class Client(Protocol):
    """A gateway client connection, as far as its instances care: whether it lasts, when it closes."""

    @property
    def lasting(self) -> bool: ...  # False: the connection serves a single request

    @property
    def closed(self) -> bool: ...  # it is gone: nothing is made for it

    def on_close(self, callback: Callable[[], None]) -> None: ...


Reclaim = Callable[[Collection[Client]], bool]  # end one of these clients to make room; whether it did


class Replaced(Exception):
    """These instances were replaced by a reload's: a waiting client asks the new ones."""


class Instances:
    """The per-client instances of extension *name*: at most *limit* at once, retiring ones included.

    *make* builds the instance of the client it is given (its log messages are that client's);
    *reclaim*, given the clients holding an instance, may end one of them at the cap (closing
    it at once, so that its instance is retiring when it returns True).
    """

    def __init__(
        self,
        name: str,
        make: Callable[[Client], Extension],
        limit: int,
        reclaim: Reclaim | None = None,
    ) -> None:
        self.name = name
        self.limit = limit
        self.held = False  # stopped by hand: no client gets an instance until resume()
        self.replaced = False  # a reload made new instances of the extension: ask those
        self._make = make
        self._reclaim = reclaim
        self._queue: dict[Client, int] = {}  # clients waiting for room, first first: their calls
        self._changed: anyio.Event | None = None  # set (and dropped): an instance began to go, the line moved
        self._by_client: dict[Client, Extension] = {}
        self._retiring: list[Extension] = []  # asked to stop; their trees may still be going
        self._hooked: set[Client] = set()  # clients whose close we hear of (once each)
        self._ended = dict.fromkeys(("calls", "errors", *_COUNTED), 0)  # of instances that are gone

    def of(self, client: Client) -> Extension:
        """*client*'s own instance, made on its first use (not started: its first call starts it).

        Error handling: :class:`ExtensionUnavailable`: retryable when *limit* instances exist;
        not when stopped by hand (until :meth:`resume`) or when *client* does not last.
        """
        ext = self._by_client.get(client)
        if ext is not None:
            return ext
        if not client.lasting:
            raise ExtensionUnavailable(self.name, "per-client", retryable=False, detail=SESSIONLESS)
        if client.closed:  # a request outliving its client (it waited for room): no child, no reclaim
            raise ExtensionUnavailable(self.name, "per-client", retryable=False, detail="its client is gone")
        if self.held:
            advice = State.STOPPED.remedy(self.name)  # as the shared one says
            raise ExtensionUnavailable(self.name, "stopped", retryable=False, advice=advice)
        self._prune()
        # A client waiting for room (queued) is served before any that came after it.
        if len(self._by_client) + len(self._retiring) + self._ahead_of(client) >= self.limit:
            detail = f"all {self.limit} per-client instances are in use (max_instances)"
            raise ExtensionUnavailable(self.name, "busy", retryable=True, detail=detail)
        ext = self._by_client[client] = self._make(client)
        if client not in self._hooked:
            self._hooked.add(client)
            client.on_close(lambda: self._closed(client))
        return ext

    async def acquire(self, client: Client) -> Extension:
        """*client*'s instance (:meth:`of`); at the cap, in line behind the clients before it,
        waiting while room is on its way (:meth:`room_coming`: an instance stopping, or one
        reclaimed now). The caller bounds the wait.

        Error handling: as :meth:`of` (a retryable "busy" at once when no room can come);
        :class:`Replaced` once a reload replaced these instances (ask the new ones).
        """
        with self.queued(client):
            while not self.replaced:
                try:
                    return self.of(client)
                except ExtensionUnavailable as exc:
                    if not exc.retryable or not self.room_coming(client):
                        raise
                await self.one_gone()
        raise Replaced(self.name)

    def replace(self) -> None:
        """A reload replaced these instances: waiters in :meth:`acquire` go ask the new ones."""
        self.replaced = True
        self._wake()

    @property
    def waiting(self) -> int:
        """Calls waiting at the cap for room."""
        return sum(self._queue.values())

    @contextlib.contextmanager
    def queued(self, client: Client) -> Iterator[None]:
        """While in it, *client* waits for room in line: first come, first served (its calls
        share its place)."""
        self._queue[client] = self._queue.get(client, 0) + 1
        try:
            yield
        finally:
            self._queue[client] -= 1
            if not self._queue[client]:
                del self._queue[client]
                self._wake()  # the line moved: those behind it look again

    def _ahead_of(self, client: Client) -> int:
        """Clients still waiting for room before *client* (all of them, if it is not in line):
        not those served meanwhile (another call of theirs may still be in line) or gone."""
        ahead = 0
        for waiting in self._queue:
            if waiting is client:
                break
            if waiting not in self._by_client and not waiting.closed:
                ahead += 1
        return ahead

    def room_coming(self, client: Client) -> bool:
        """At the cap: whether room is on its way for *client*. It is when as many instances are
        stopping as it needs (one, and one for each client before it in line), or when one more
        is reclaimed now; else, if any is stopping, it may still come."""
        if len(self._retiring) > self._ahead_of(client):
            return True
        if self._reclaim is not None and self._reclaim(list(self._by_client)):
            return True
        return bool(self._retiring)

    async def one_gone(self) -> None:
        """Return once one of the instances on their way out is gone, another begins to go (maybe
        gone already: a dormant one), or a client leaves the line; at once if none of it can be."""

        async def gone(ext: Extension, scope: anyio.CancelScope) -> None:
            await ext.wait_for(lambda snapshot: not snapshot.state.is_live)
            scope.cancel()

        async def changed(event: anyio.Event, scope: anyio.CancelScope) -> None:
            await event.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            if self._retiring or self._queue:
                self._changed = self._changed or anyio.Event()
                tg.start_soon(changed, self._changed, tg.cancel_scope)
            for ext in self._retiring:  # at most limit
                tg.start_soon(gone, ext, tg.cancel_scope)

    def existing(self, client: object) -> Extension | None:
        """*client*'s instance if it has one now; never makes one (a lookup: ``tasks/*``)."""
        return self._by_client.get(client)  # type: ignore[call-overload]

    def _closed(self, client: Client) -> None:
        self._hooked.discard(client)
        self._release(client)

    def _release(self, client: Client) -> None:
        ext = self._by_client.pop(client, None)
        if ext is not None:
            ext.request_stop()  # the watcher, in the daemon's task group, tears the tree down
            self._retiring.append(ext)
            self._wake()  # a waiter looks again: this one may be gone already (dormant)

    def _wake(self) -> None:
        """Every call waiting in :meth:`one_gone` returns and looks again."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _prune(self) -> None:
        """Forget retiring instances whose trees are gone, keeping their counts in the totals."""
        keep = []
        for ext in self._retiring:
            if ext.state.is_live:
                keep.append(ext)
            else:
                for key, value in _counts(ext).items():
                    self._ended[key] += value
        self._retiring = keep

    def all(self) -> list[Extension]:
        """Every instance whose child may still exist: the clients' ones, then the retiring ones."""
        self._prune()
        return [*self._by_client.values(), *self._retiring]

    def totals(self) -> dict[str, int]:
        """Calls, errors, restarts, ... of every instance there has been: monotonic, for counters."""
        sums = dict(self._ended)
        for ext in self.all():
            for key, value in _counts(ext).items():
                sums[key] += value
        return sums

    def health(self, usage: Sampler) -> dict[str, Any]:
        """For ``health``: each instance now (at most *limit*), and the totals of all there have been."""
        each = [figures(ext, usage) for ext in self.all()]
        return {
            "count": len(each),
            "max": self.limit,
            "held": self.held,
            "waiting": self.waiting,
            "totals": self.totals(),
            "each": each,
        }

    def release_all(self) -> None:
        """Ask every client's instance to stop (sync); each client's next use makes a new one."""
        for client in list(self._by_client):
            self._release(client)

    async def stop_all(self, *, hold: bool = False) -> None:
        """Stop every instance; returns once their process trees are gone. *hold*: see :attr:`held`."""
        self.held = self.held or hold
        self.release_all()
        async with anyio.create_task_group() as stoppers:
            for ext in self._retiring:
                stoppers.start_soon(ext.stop)
        self._prune()

    def resume(self) -> None:
        """Undo a hold: clients get instances again (each started by its next call)."""
        self.held = False

    async def restart_all(self, tg: TaskGroup) -> None:
        """Restart every client's live instance (in the daemon's *tg*); ends a hold.

        A dormant one (idle-stopped, or not called yet) stays so: its next call starts it.
        """
        self.held = False
        async with anyio.create_task_group() as restarts:
            for client, ext in list(self._by_client.items()):
                if ext.state.is_live:
                    restarts.start_soon(self._restart, client, ext, tg)

    async def _restart(self, client: Client, ext: Extension, tg: TaskGroup) -> None:
        await ext.restart(tg)
        if self._by_client.get(client) is not ext:  # its client left meanwhile: no one to serve
            ext.request_stop()


def figures(ext: Extension, usage: Sampler) -> dict[str, Any]:
    """One extension's (or instance's) state, counters and process tree, for ``health``."""
    snapshot = ext.snapshot()
    return {
        "name": ext.name,
        "state": snapshot.state.value,
        "pid": snapshot.pid,
        "restarts": snapshot.restarts,
        "calls": ext.calls,
        "errors": ext.errors,
        "in_flight": snapshot.in_flight,
        "unresponsive": snapshot.unresponsive,
        "memory_exceeded": snapshot.memory_exceeded,
        "resources": usage.usage(ext.name, snapshot.pid, ext.run_marker).as_dict(),
    }


def _counts(ext: Extension) -> dict[str, Any]:
    snapshot = ext.snapshot()
    return {"calls": ext.calls, "errors": ext.errors, **{k: getattr(snapshot, k) for k in _COUNTED}}
