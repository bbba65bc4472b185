"""Where a client's request goes: one router for every call path (the SDK's handlers, the fast
path, tasks).

:class:`Router` keeps the :class:`~.catalog.Catalog` of what clients see (built from every
configured extension's listing, rebuilt when one changes), resolves an exposed name within a
client's view (cached per catalog and view: glob matching per call costs more than the rest of
routing), and picks the Extension that serves a client: the shared one, or for a per-client
extension the client's own instance. Sync throughout: it reads snapshots and listings only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import anyio

from supervisor.errors import ExtensionUnavailable
from supervisor.extension.pins import held_message
from supervisor.extension.served import Served
from supervisor.extension.state import State
from supervisor.gateway import catalog as catalogs
from supervisor.gateway.catalog import Catalog, Source
from supervisor.gateway.names import expose
from supervisor.gateway.session import Session
from supervisor.gateway.view.profiles import View, Views
from supervisor.upstream.listing import Listing

__all__ = ("MAX_ROUTES", "Extensions", "Router")

MAX_ROUTES = 4096  # cached routes (catalog names x views in use); past it, the cache starts over
# Their last listing stays shown (waiting for a login: the saved one, so that a call can ask for it).
_LIVE = frozenset({State.STARTING, State.RUNNING, State.BACKOFF, State.NEEDS_LOGIN})
_NOTHING = Listing()  # what a stopped extension lists (one object: catalogs compare listings by identity)


class Extensions(Protocol):
    """What the gateway needs of the daemon."""

    def extensions(self) -> Sequence[Served]: ...

    def instance_of(self, name: str, client: Any) -> Served: ...

    async def instance_when_room(self, name: str, client: Any) -> Served: ...

    def existing_instance(self, name: str, client: Any) -> Served | None: ...


class Router:
    """Exposed names to extensions, in each client's view (see the module's docstring).

    Args:
        backend: the daemon (its ``extensions()`` in config order, and per-client instances).
        views: the configured profiles.
        budget: the longest exposed tool or prompt name (``gateway.max_name_length``).
    """

    def __init__(self, backend: Extensions, views: Views, *, budget: int = 64) -> None:
        self._backend = backend
        self.views = views
        self.budget = budget
        self._catalog = Catalog()
        self._stale = True
        self._routes: dict[tuple[str, View], tuple[str, str] | None] = {}
        self._routes_of = self._catalog

    def __len__(self) -> int:
        """Routes cached now (at most :data:`MAX_ROUTES`)."""
        return len(self._routes)

    def invalidate(self) -> None:
        """An extension's listing or state changed: build the catalog again when next asked. Sync."""
        self._stale = True

    def extensions(self) -> Sequence[Served]:
        return self._backend.extensions()

    def catalog(self) -> Catalog:
        """What clients see now: every configured extension's names, the listed ones' entries."""
        if self._stale:
            self._stale = False
            sources = []
            for ext in self._backend.extensions():
                listed = ext.state in _LIVE or ext.dormant  # dormant: its saved listing
                listing = ext.offered() if listed else _NOTHING  # held tools (tools_on_change: hold) left out
                known = ext.known_listing()  # its names stay its own while it does not run
                config = ext.config
                prefix = config.prefix or ext.name
                known_if_other = known if known is not listing else None
                sources.append(
                    Source(ext.name, prefix, config.tools.allow, config.tools.deny, listing, known_if_other)
                )
            self._catalog = catalogs.build(sources, self.budget)
        return self._catalog

    def route(self, name: str, request: Any = None) -> tuple[str, str] | None:
        """The (extension, tool) a ``tools/call`` of *name* goes to, for a client whose messages carry
        *request* as their request context (None: no profile); None when the handler must decide
        (a search-mode meta-tool, a name hidden from this view, an unknown one).
        """
        view, catalog = self.views.of(request), self.catalog()
        if catalog is not self._routes_of or len(self._routes) >= MAX_ROUTES:
            self._routes, self._routes_of = {}, catalog
        key = (name, view)
        if key in self._routes:
            return self._routes[key]
        target = catalog.tool_names.resolve(name)
        if target is None:
            return None  # not cached: any name a client makes up would be
        routed = self._routes[key] = target if view.admits(*target, name) else None
        return routed

    def route_tool(self, name: str, request: Any, session: Session) -> tuple[Served, str] | None:
        """:meth:`route`, with the extension that serves *session* (for a per-client one, its own
        instance): for the fast path. None also where the SDK's path must say why not."""
        target = self.route(name, request)
        ext = self.extension(target[0]) if target is not None else None
        if ext is None or target is None:
            return None
        try:
            return self.serving(ext, session), target[1]
        except ExtensionUnavailable:
            return None  # busy, held: the SDK's path answers as it always does

    def extension(self, name: str) -> Served | None:
        """The configured extension *name* (the shared one of a per-client extension)."""
        return next((ext for ext in self._backend.extensions() if ext.name == name), None)

    def serving(self, ext: Served, session: Session) -> Served:
        """The Extension that serves *session*: its own instance when per-client.

        Error handling: :class:`ExtensionUnavailable` when it may not have one (all in use,
        stopped by hand, a client of one request).
        """
        if ext.config.instances != "per-client":
            return ext
        return self._backend.instance_of(ext.name, session)

    async def serving_when_room(self, ext: Served, session: Session) -> Served:
        """:meth:`serving` for a request that can wait: at ``max_instances``, while an instance is
        on its way out, up to the extension's ``call_timeout`` for its room. Errors as :meth:`serving`."""
        if ext.config.instances != "per-client":
            return ext
        with anyio.move_on_after(ext.config.call_timeout):
            return await self._backend.instance_when_room(ext.name, session)
        return self.serving(ext, session)  # out of time: room now, or why there is none

    def existing(self, ext: Served, session: Session) -> Served | None:
        """:meth:`serving` without making an instance: None when *session* has none."""
        if ext.config.instances != "per-client":
            return ext
        return self._backend.existing_instance(ext.name, session)

    def owner_by_prefix(self, name: str) -> Served | None:
        """The extension whose prefix *name* has (prefixes are unique in the config)."""
        return next(
            (e for e in self._backend.extensions() if name.startswith(expose(e.config.prefix or e.name, ""))),
            None,
        )

    def held_reason(self, name: str) -> str | None:
        """Why *name* is refused if it is a tool held by ``tools_on_change: hold``, else None."""
        for ext in self._backend.extensions():
            changes = ext.pins.changes() if ext.pins is not None else {}
            for change in changes.values():
                if change.held and expose(ext.config.prefix or ext.name, change.tool, self.budget) == name:
                    return held_message(ext.name, name, change)
        return None

    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]:
        """The name clients see for *tool* (None if hidden by a filter), and why it differs, if it does."""
        catalog = self.catalog()
        name = catalog.tool_names.exposed(extension, tool)
        why = next((c.describe() for c in catalog.collisions if c.loser == (extension, tool)), None)
        return name, why

    def collisions(self, extension: str) -> list[str]:
        """Name collisions that cost *extension* a plain name, described."""
        return [c.describe() for c in self.catalog().collisions if c.loser[0] == extension]
