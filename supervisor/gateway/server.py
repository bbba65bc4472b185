"""The gateway's MCP server: one view of every live extension, served with the SDK's lowlevel ``Server``.

:class:`Gateway` answers every client on every listener: its request handlers are
:mod:`.handlers`, its routing :mod:`.router`. It reads extension snapshots and listings and
borrows their sessions through the Extension's forwarding methods; it never opens or closes
one. Its own task (:meth:`Gateway.run`) owns the change announcer and the
:class:`~.notify.fanout.Fanout` that carries notifications to clients.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup, TaskStatus
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.models import InitializationOptions

from supervisor import __version__
from supervisor.extension.served import Served
from supervisor.extension.state import Snapshot, State
from supervisor.gateway import catalog as catalogs
from supervisor.gateway.asks import inputrequired
from supervisor.gateway.catalog import Catalog
from supervisor.gateway.fast.runner import Runner
from supervisor.gateway.handlers import UNAVAILABLE, Handlers
from supervisor.gateway.names import expose_uri, parse_uri
from supervisor.gateway.notify.downstream import Downstream
from supervisor.gateway.notify.fanout import Fanout
from supervisor.gateway.notify.listen import Listen
from supervisor.gateway.notify.releases import Releases
from supervisor.gateway.router import Extensions, Router
from supervisor.gateway.session import Session, session_of
from supervisor.gateway.tasks import router as tasks
from supervisor.gateway.tasks.ids import declare
from supervisor.gateway.view.profiles import Views

__all__ = ("UNAVAILABLE", "Extensions", "Gateway")

log = structlog.get_logger(__name__)

INSTRUCTIONS = (
    "Tools, prompts and resources of every MCP server supervised by mcp-supervisor on this host. "
    "Names are EXTENSION__NAME; resource URIs are mcp-supervisor://EXTENSION/ORIGINAL-URI."
)


class _Server(Server[Any]):
    """Advertise list_changed on every transport (streamable HTTP asks with no arguments)."""

    def create_initialization_options(
        self, notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any
    ) -> InitializationOptions:
        everything = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
        return super().create_initialization_options(notification_options or everything, *args, **kwargs)

    def get_capabilities(self, *args: Any, protocol_version: str | None = None, **kwargs: Any) -> Any:
        """Tasks too, for handshake-era clients (see :func:`.tasks.ids.declare`)."""
        capabilities = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        return declare(capabilities, protocol_version)


class Gateway(Handlers):
    """The MCP server view of *backend*'s extensions.

    Args:
        backend: the daemon (its ``extensions()`` in config order).
        spool_dir: the daemon's spool directory; ``resources/read`` serves files inside it only.
        name_budget: the longest exposed tool or prompt name (``gateway.max_name_length``).
        profiles: the config's ``profiles`` (client views, see :mod:`.views`).
    """

    def __init__(
        self,
        backend: Extensions,
        *,
        spool_dir: Path,
        name_budget: int = 64,
        profiles: Mapping[str, Any] | None = None,
    ) -> None:
        self._backend = backend
        self.views = Views(profiles)
        self._views_changed = False
        self._spool_dir = spool_dir
        self.router = Router(backend, self.views, budget=name_budget)
        self._announced = Catalog()
        self._changed = anyio.Event()
        self.fanout = Fanout()
        self.releases = Releases(self.router.extension, self.fanout.held)
        self.fanout.on_released = self.releases.released
        # extension name (an instance: its id) -> its resubscribe task; one per run at most
        self._resubscribing: dict[Hashable, anyio.CancelScope] = {}
        self._runs: dict[str, str | None] = {}  # extension -> id of the run we last saw running
        self._tg: TaskGroup | None = None
        self._spool_readers = anyio.CapacityLimiter(2)
        self.spool_prefix = spool_dir.as_uri() + "/"  # as the spool writes its links
        self.calls = Runner(self.router, self.spool_prefix)  # plain tool calls, beside the SDK's path
        self.inputs = inputrequired.InputRequired()  # 2026-07-28 clients' calls that wait for input
        # HTTP sessions by Mcp-Session-Id, once they listed tools or made a call: the HTTP fast
        # path's clients, and the ones a per-client extension may reclaim an instance from.
        # One per live session (at most the session cap): each leaves with its Session.
        self.http_sessions: dict[str, Session] = {}
        # The HTTP listener's: ends the session idle longest of these ids, if idle long enough.
        self.end_idle_http: Callable[[Collection[str]], str | None] | None = None
        # The HTTP listener's: requests of an Mcp-Session-Id being served now (for clients()).
        self.http_in_flight: Callable[[str], int] | None = None
        self.server = _Server(
            "mcp-supervisor",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self.inputs.wrap(self._call_tool),
            on_list_prompts=self._list_prompts,
            on_get_prompt=self.inputs.wrap(self._get_prompt),
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self.inputs.wrap(self._read_resource),
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_completion=self._complete,
            on_subscriptions_listen=Listen(self.fanout, self._take_subscription),
        )
        self.server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        self.server.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
        )
        self.tasks = tasks.TaskRouter(
            self.router, enroll=self.fanout.client, spool_prefix=self.spool_prefix, unavailable=UNAVAILABLE
        )
        self.tasks.install(self.server)

    # ---- the view ------------------------------------------------------------------------

    def invalidate(self, snapshot: Snapshot | None = None) -> None:
        """An extension changed (its new *snapshot*), or the set of extensions did. Sync."""
        self.router.invalidate()
        self._changed.set()
        if snapshot is None:
            names = {ext.name for ext in self._backend.extensions()}
            self._runs = {name: run for name, run in self._runs.items() if name in names}
        elif snapshot.state is State.RUNNING and self._runs.get(snapshot.name) != snapshot.run:
            restarted = snapshot.name in self._runs
            self._runs[snapshot.name] = snapshot.run
            if restarted:
                self._resubscribe(snapshot.name)

    def _resubscribe(self, extension: str) -> None:
        """A new run of *extension* knows nothing of our subscriptions: make them again.

        One task per extension: a newer run cancels the attempt for an older one.
        """
        ext = self.router.extension(extension)
        if ext is not None:
            self._subscribe_again_soon(ext, self.fanout.subscribed(), extension)

    def instance_restarted(self, ext: Served, owner: object) -> None:
        """A new run of *owner*'s per-client instance *ext*: its client's subscriptions again
        (those of its 2026-07-28 listen streams are counted, not kept by URI: not these). Sync."""
        self._subscribe_again_soon(ext, self.fanout.subscribed_by(owner), id(ext))

    def _subscribe_again_soon(self, ext: Served, exposed: list[str], key: Hashable) -> None:
        targets = [parse_uri(uri) for uri in exposed]
        uris = [target[1] for target in targets if target and target[0] == ext.name]
        if not uris or self._tg is None:
            return
        if (previous := self._resubscribing.pop(key, None)) is not None:
            previous.cancel()
        scope = self._resubscribing[key] = anyio.CancelScope()
        self._tg.start_soon(self._subscribe_again, ext, uris, scope, key)

    async def _subscribe_again(
        self, ext: Served, uris: list[str], scope: anyio.CancelScope, key: Hashable
    ) -> None:
        with scope:
            for uri in uris:
                request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
                try:
                    with anyio.fail_after(10):
                        await ext.request(request, types.EmptyResult)
                except Exception as exc:  # TimeoutError, an MCP error, the extension gone again
                    log.warning(
                        "gateway.resubscribe_failed", extension=ext.name, uri=uri, error=str(exc)[:300]
                    )
        if self._resubscribing.get(key) is scope:
            del self._resubscribing[key]

    def set_profiles(self, profiles: Mapping[str, Any]) -> None:
        """A reload's profiles; connected clients of a changed view are told to list again. Sync."""
        if self.views.configure(profiles):
            self._views_changed = True
            self._changed.set()

    def profiles(self) -> list[dict[str, Any]]:
        """Per view (the default one first): mode, tools in it, tools listed, budget."""
        return self.views.summary(self.catalog())

    def catalog(self) -> Catalog:
        """What clients see now (the router's)."""
        return self.router.catalog()

    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]:
        return self.router.exposed(extension, tool)

    def collisions(self, extension: str) -> list[str]:
        return self.router.collisions(extension)

    def note_http_session(self, ctx: ServerRequestContext[Any]) -> None:
        """Record the client of a handshake-era HTTP session under its ``Mcp-Session-Id``, for the
        HTTP fast path (:mod:`.http.fastcalls`) and :meth:`reclaim`; it is forgotten when the
        session closes. Sync."""
        session = session_of(ctx)
        headers = getattr(ctx.request, "headers", None)
        session_id = headers.get("mcp-session-id") if headers is not None else None
        if session.listener != "http" or not session.lasting or session.connection is None or not session_id:
            return
        if session.http_id is None and session_id not in self.http_sessions and not session.closed:
            session.http_id = session_id
            self.http_sessions[session_id] = session
            session.on_close(lambda: self.http_sessions.pop(session_id, None))

    def reclaim(self, holders: Collection[object]) -> bool:
        """At a per-client extension's ``max_instances``: end the HTTP session idle longest among
        *holders* (the clients holding an instance), if it has been idle long enough, and close
        its client now, so that its instances are on their way out. Whether one ended. Sync.

        A session that made tasks is left alone: their results would be lost with it."""
        by_id = {
            s.http_id: s
            for s in holders
            if isinstance(s, Session) and s.http_id is not None and not self.tasks.owners.of(s)
        }
        ended = self.end_idle_http(by_id) if self.end_idle_http is not None and by_id else None
        if ended is None:
            return False
        by_id[ended].close()
        return True

    def holds(self, extension: str) -> bool:
        """Whether some client is subscribed to a resource of *extension* (it must not idle-stop)."""
        return any((target := parse_uri(uri)) and target[0] == extension for uri in self.fanout.subscribed())

    def client_count(self) -> int:
        return len(self.fanout)

    def clients(self) -> list[dict[str, Any]]:
        """Each connected handshake-era client, oldest first: its listener, name and version,
        protocol, view, since when, and (on ``mcp.sock``) its requests in flight."""
        return [_described(client, self.views, self.http_in_flight) for client in self.fanout.downstreams()]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Announce changes to clients until cancelled; owns the per-client tasks."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._announced = self.catalog()
            self.views.warn_over_budget(self._announced)
            await tg.start(self.fanout.run)
            await tg.start(self.releases.run)
            await tg.start(self.inputs.run)
            task_status.started()
            try:
                await self._announce_changes()
            finally:
                self._tg = None

    async def _announce_changes(self) -> None:
        while True:
            await self._changed.wait()
            await anyio.sleep(0.1)  # coalesce: a restart storm is a few notifications
            self._changed = anyio.Event()
            newer = self.catalog()
            kinds = self._announced.changed_kinds(newer)
            if self._views_changed:  # a reload changed a profile: its clients list again
                self._views_changed = False
                kinds |= set(catalogs.KINDS)
            self.views.warn_over_budget(newer)
            known = set(self._announced.collisions)
            for collision in newer.collisions:
                if collision not in known:
                    log.warning("gateway.name_collision", detail=collision.describe())
            self._announced = newer
            if not kinds:
                continue
            log.info("gateway.lists_changed", kinds=sorted(kinds), clients=len(self.fanout))
            await self.fanout.lists_changed(kinds)

    def notify(
        self,
        extension: str,
        notification: types.ServerNotification,
        source: Served | None = None,
        owner: object = None,
    ) -> None:
        """Route a child's log message or resource update (from Extension *source*, the per-client
        instance of *owner* if it is one) to the clients that asked. Sync.

        A client hears the log messages of the extensions its view shows, and of a per-client
        extension only its own instance's (the shared one serves the control socket: nobody's);
        the same for a resource update, which a handshake-era client hears only if subscribed.
        """
        per_client = source is not None and source.config.instances == "per-client"

        def its_own(client: Downstream) -> bool:
            return not per_client or (owner is not None and client.session is owner)

        if isinstance(notification, types.LoggingMessageNotification):
            params = notification.params
            logger = f"{extension}/{params.logger}" if params.logger else extension

            def hears(client: Downstream) -> bool:
                return its_own(client) and self.views.of(client.context).sees(extension)

            self.fanout.log(params.level, params.data, logger, source, hears)
        elif isinstance(notification, types.ResourceUpdatedNotification):
            if per_client and owner is None:
                return  # the control socket's instance: nobody's
            uri = expose_uri(extension, notification.params.uri)
            self.fanout.resource_updated(uri, owner if per_client else None)


def _described(
    client: Downstream, views: Views, http_in_flight: Callable[[str], int] | None
) -> dict[str, Any]:
    session: Session = client.session
    params = client.connection.client_params
    info = params.client_info if params is not None else None
    session_id = client.connection.session_id
    in_flight: int | None = None
    if "in_flight" in session.__dict__:  # mcp.sock: its unanswered requests
        in_flight = len(session.in_flight)
    elif session_id is not None and http_in_flight is not None:  # HTTP: its requests being served
        in_flight = http_in_flight(session_id)
    return {
        "listener": session.listener,
        "client": info.name if info is not None else None,
        "version": info.version if info is not None else None,
        "protocol": client.connection.protocol_version,
        "profile": views.of(client.context).name if client.context is not None else None,
        "since": datetime.fromtimestamp(session.since, UTC).isoformat(),
        "in_flight": in_flight,
    }
