"""The gateway's MCP server: one view of every live extension, served with the SDK's lowlevel ``Server``.

:class:`Gateway` answers every client on every listener. It reads extension snapshots and
listings and borrows their sessions through :class:`~supervisor.extension.Extension`'s
forwarding methods; it never opens or closes one. Its own task (:meth:`Gateway.run`) owns the
change announcer and the :class:`~.fanout.Fanout` that carries notifications to clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup, TaskStatus
from mcp import MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.shared.dispatcher import ProgressFnT

from supervisor import __version__
from supervisor.errors import CallFailed, ExtensionUnavailable, SupervisorError
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from supervisor.gateway import catalog as catalogs
from supervisor.gateway import spoollinks
from supervisor.gateway.asks import inputrequired
from supervisor.gateway.catalog import Catalog
from supervisor.gateway.links import expose_models
from supervisor.gateway.names import expose_uri, parse_uri
from supervisor.gateway.notify.downstream import MAX_SUBSCRIPTIONS, Downstream
from supervisor.gateway.notify.fanout import Fanout
from supervisor.gateway.notify.listen import Listen
from supervisor.gateway.notify.releases import Releases
from supervisor.gateway.router import Extensions, Router
from supervisor.gateway.session import session_of
from supervisor.gateway.tasks import router as tasks
from supervisor.gateway.toolerrors import is_tool_error
from supervisor.gateway.view.profiles import View, Views, call_meta, hidden_reason

__all__ = ("UNAVAILABLE", "Extensions", "Gateway")

log = structlog.get_logger(__name__)

UNAVAILABLE = -32003  # as on the control socket: the extension is not running (data: state, retryable)
MAX_URI_LENGTH = 4096  # a subscription is kept for the connection's life: keep its key small
INSTRUCTIONS = (
    "Tools, prompts and resources of every MCP server supervised by mcp-supervisor on this host. "
    "Names are EXTENSION__NAME; resource URIs are mcp-supervisor://EXTENSION/ORIGINAL-URI."
)
ResultT = TypeVar("ResultT")


class _Server(Server[Any]):
    """Advertise list_changed on every transport (streamable HTTP asks with no arguments)."""

    def create_initialization_options(
        self, notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any
    ) -> InitializationOptions:
        everything = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
        return super().create_initialization_options(notification_options or everything, *args, **kwargs)

    def get_capabilities(self, *args: Any, protocol_version: str | None = None, **kwargs: Any) -> Any:
        """Tasks too, for handshake-era clients (see :func:`.tasks.declare`)."""
        capabilities = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        return tasks.declare(capabilities, protocol_version)


class Gateway:
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
        self._resubscribing: dict[str, anyio.CancelScope] = {}  # extension -> its resubscribe task
        self._runs: dict[str, int | None] = {}  # extension -> pid of the run we last saw running
        self._tg: TaskGroup | None = None
        self._spool_readers = anyio.CapacityLimiter(2)
        self.spool_prefix = spool_dir.as_uri() + "/"  # as the spool writes its links
        self.inputs = inputrequired.InputRequired()  # 2026-07-28 clients' calls that wait for input
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
            self._runs = {name: pid for name, pid in self._runs.items() if name in names}
        elif snapshot.state is State.RUNNING and self._runs.get(snapshot.name) != snapshot.pid:
            restarted = snapshot.name in self._runs
            self._runs[snapshot.name] = snapshot.pid
            if restarted:
                self._resubscribe(snapshot.name)

    def _resubscribe(self, extension: str) -> None:
        """A new run of *extension* knows nothing of our subscriptions: make them again.

        One task per extension: a newer run cancels the attempt for an older one.
        """
        targets = [parse_uri(uri) for uri in self.fanout.subscribed()]
        uris = [target[1] for target in targets if target and target[0] == extension]
        ext = self.router.extension(extension)
        if not uris or ext is None or self._tg is None:
            return
        if (previous := self._resubscribing.pop(extension, None)) is not None:
            previous.cancel()
        scope = self._resubscribing[extension] = anyio.CancelScope()
        self._tg.start_soon(self._subscribe_again, ext, uris, scope)

    async def _subscribe_again(self, ext: Extension, uris: list[str], scope: anyio.CancelScope) -> None:
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
        if self._resubscribing.get(ext.name) is scope:
            del self._resubscribing[ext.name]

    def set_profiles(self, profiles: Mapping[str, Any]) -> None:
        """A reload's profiles; connected clients of a changed view are told to list again. Sync."""
        if self.views.configure(profiles):
            self._views_changed = True
            self._changed.set()

    def profiles(self) -> list[dict[str, Any]]:
        """Per view (the default one first): mode, tools in it, tools listed, budget."""
        return self.views.summary(self.catalog())

    def _view(self, ctx: ServerRequestContext[Any]) -> View:
        return self.views.of(ctx.request)

    def catalog(self) -> Catalog:
        """What clients see now (the router's)."""
        return self.router.catalog()

    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]:
        return self.router.exposed(extension, tool)

    def collisions(self, extension: str) -> list[str]:
        return self.router.collisions(extension)

    def holds(self, extension: str) -> bool:
        """Whether some client is subscribed to a resource of *extension* (it must not idle-stop)."""
        return any((target := parse_uri(uri)) and target[0] == extension for uri in self.fanout.subscribed())

    def client_count(self) -> int:
        return len(self.fanout)

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
        source: Extension | None = None,
        owner: object = None,
    ) -> None:
        """Route a child's log message or resource update (from Extension *source*, the per-client
        instance of *owner* if it is one) to the clients that asked. Sync.

        A client hears the log messages of the extensions its view shows, and of a per-client
        extension only its own instance's (the shared one serves the control socket: nobody's).
        """
        if isinstance(notification, types.LoggingMessageNotification):
            params = notification.params
            logger = f"{extension}/{params.logger}" if params.logger else extension
            per_client = source is not None and source.config.instances == "per-client"

            def hears(client: Downstream) -> bool:
                if per_client and (owner is None or client.session is not owner):
                    return False
                return self.views.of(client.context).sees(extension)

            self.fanout.log(params.level, params.data, logger, source, hears)
        elif isinstance(notification, types.ResourceUpdatedNotification):
            self.fanout.resource_updated(expose_uri(extension, notification.params.uri))

    # ---- handlers ------------------------------------------------------------------------

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        self.fanout.client(ctx)  # its Session now knows its connection: the fast path opens after this
        return types.ListToolsResult(tools=list(self.views.project(self.catalog(), self._view(ctx)).listed))

    async def _list_prompts(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListPromptsResult:
        self.fanout.client(ctx)
        return types.ListPromptsResult(
            prompts=list(self.views.project(self.catalog(), self._view(ctx)).prompts)
        )

    async def _list_resources(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListResourcesResult:
        self.fanout.client(ctx)
        resources = self.views.project(self.catalog(), self._view(ctx)).resources
        return types.ListResourcesResult(resources=list(resources))

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: Any
    ) -> types.ListResourceTemplatesResult:
        self.fanout.client(ctx)
        templates = self.views.project(self.catalog(), self._view(ctx)).templates
        return types.ListResourceTemplatesResult(resource_templates=list(templates))

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self.fanout.client(ctx)
        catalog, view = self.catalog(), self._view(ctx)
        meta = await call_meta(self.views.project(catalog, view), params, lambda p: self._call_tool(ctx, p))
        if meta is not None:  # search mode: search_tools, describe_tool, call_tool
            return meta
        target = catalog.tool_names.resolve(params.name)
        if target is None:  # perhaps a tool of an extension on its way whose tools are not known yet
            target = await self._resolved_once_running(params.name)
        if target is None or not view.admits(*target, params.name):
            return self._unknown_tool(params.name, view)
        extension, tool = target
        ext = self.router.extension(extension)
        if ext is None:
            return _tool_error(f"extension {extension!r} was removed from the config")
        try:
            ext = self.router.serving(ext, session_of(ctx))
            caller = inputrequired.caller(ctx)
            async with self.fanout.request_logs(ctx, ext):
                result = await ext.call_tool(
                    tool, params.arguments, progress=_progress_relay(ctx), caller=caller
                )
            return result.model_copy(
                update={"content": expose_models(ext.name, result.content, self.spool_prefix)}
            )
        except (ExtensionUnavailable, CallFailed) as exc:
            if is_tool_error(exc):
                return _tool_error(str(exc))
            raise MCPError(exc.code, str(exc), exc.data) from None

    async def _resolved_once_running(self, name: str) -> tuple[str, str] | None:
        """*name* resolved again once the extension its prefix names runs, if it is on its way
        (starting, in backoff or a restart, with no listing known yet): within its call_timeout."""
        ext = self.router.owner_by_prefix(name)
        if ext is None or not ext.on_the_way:
            return None
        with anyio.move_on_after(ext.config.call_timeout):
            await ext.wait_for(lambda s: s.state is State.RUNNING or not ext.on_the_way)
        return self.catalog().tool_names.resolve(name)

    def _unknown_tool(self, name: str, view: View) -> types.CallToolResult:
        """A tool this client cannot call: name the filter that hides it, or the extension not running."""
        if (hidden := hidden_reason(self.catalog(), view, name, self.router.budget)) is not None:
            raise MCPError(types.INVALID_PARAMS, hidden)
        if (held := self.router.held_reason(name)) is not None:
            raise MCPError(types.INVALID_PARAMS, held)
        ext = self.router.owner_by_prefix(name)
        state = ext.snapshot().state if ext is not None else State.RUNNING
        if ext is not None and ext.on_the_way:
            timeout = ext.config.call_timeout
            detail = f"not running after {timeout:g}s"
            return _tool_error(
                str(ExtensionUnavailable(ext.name, state.value, retryable=True, detail=detail))
            )
        if ext is not None and state is not State.RUNNING:
            return _tool_error(
                f"extension {ext.name!r} is {state.value}; "
                f"start it with `mcp-supervisor start {ext.name}`, then list tools again"
            )
        raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}; list tools again")

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        self.fanout.client(ctx)
        target = self.catalog().prompt_names.resolve(params.name)
        if target is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name!r}")
        extension, prompt = target
        self._check_sees(ctx, extension)
        request = types.GetPromptRequest(params=_forwarded(params, name=prompt))
        result = await self._forward(extension, ctx, request, types.GetPromptResult)
        messages = [
            m.model_copy(update={"content": expose_models(extension, [m.content], self.spool_prefix)[0]})
            for m in result.messages
        ]
        return result.model_copy(update={"messages": messages})

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        self.fanout.client(ctx)
        uri = params.uri
        if uri.startswith("file:"):
            return await spoollinks.read(self._spool_dir, uri, self._spool_readers)
        target = parse_uri(uri)
        if target is None:
            raise MCPError(spoollinks.RESOURCE_NOT_FOUND, f"unknown resource {uri!r}")
        extension, original = target
        self._check_sees(ctx, extension)
        request = types.ReadResourceRequest(params=_forwarded(params, uri=original))
        result = await self._forward(extension, ctx, request, types.ReadResourceResult)
        contents = [c.model_copy(update={"uri": expose_uri(extension, c.uri)}) for c in result.contents]
        return result.model_copy(update={"contents": contents})

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        self.fanout.client(ctx)
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            target = self.catalog().prompt_names.resolve(ref.name)
            ref_update = {"name": target[1]} if target else {}
        else:
            target = parse_uri(ref.uri)
            ref_update = {"uri": target[1]} if target else {}
        if target is None:
            raise MCPError(types.INVALID_PARAMS, "unknown completion reference")
        self._check_sees(ctx, target[0])
        forwarded = _forwarded(params, ref=ref.model_copy(update=ref_update))
        return await self._forward(
            target[0], ctx, types.CompleteRequest(params=forwarded), types.CompleteResult
        )

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        client = self.fanout.client(ctx)
        if client is not None and len(client.subscriptions) >= MAX_SUBSCRIPTIONS:
            raise MCPError(types.INVALID_PARAMS, f"at most {MAX_SUBSCRIPTIONS} subscriptions per client")
        new = client if client is not None and params.uri not in client.subscriptions else None
        if new is not None:  # counted before the child is asked, so no release overtakes it (.releases)
            self.fanout.subscribe(new, params.uri)
        try:
            await self._take_subscription(ctx, params.uri)
        except BaseException:  # a failure leaves nothing behind
            if new is not None:
                self.fanout.unsubscribe(new, params.uri)
            raise
        return types.EmptyResult()

    async def _take_subscription(self, ctx: ServerRequestContext[Any], uri: str) -> None:
        """Subscribe to exposed *uri* in its extension (for ``resources/subscribe`` and listen streams)."""
        target = parse_uri(uri) if len(uri) <= MAX_URI_LENGTH else None
        if target is None:
            raise MCPError(spoollinks.RESOURCE_NOT_FOUND, f"unknown resource {uri[:200]!r}")
        self._check_sees(ctx, target[0])
        request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=target[1]))
        async with self.releases.taking(uri):
            await self._forward(target[0], ctx, request, types.EmptyResult)

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        client = self.fanout.client(ctx)
        if client is not None:
            self.fanout.unsubscribe(client, params.uri)
        return types.EmptyResult()  # the last holder's release reaches the child (.releases)

    async def _set_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        client = self.fanout.client(ctx)
        if client is not None:
            client.log_level = params.level
        return types.EmptyResult()

    async def _roots_changed(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        """Children whose roots came from this client list them again (its own instances too);
        no other child saw them."""
        client = session_of(ctx)
        for ext in self._backend.extensions():
            await ext.roots_changed(client)
            own = self._backend.existing_instance(ext.name, client)
            if own is not None and own is not ext:
                await own.roots_changed(client)

    # ---- forwarding ----------------------------------------------------------------------

    def _check_sees(self, ctx: ServerRequestContext[Any], extension: str) -> None:
        view = self._view(ctx)
        if not view.sees(extension):
            raise MCPError(types.INVALID_PARAMS, f"extension {extension!r} is not in profile {view.label!r}")

    async def _forward(
        self, extension: str, ctx: ServerRequestContext[Any], request: Any, result_type: type[ResultT]
    ) -> ResultT:
        ext = self.router.extension(extension)
        if ext is None:
            raise MCPError(UNAVAILABLE, f"extension {extension!r} was removed from the config")
        try:
            ext = self.router.serving(ext, session_of(ctx))
            caller = inputrequired.caller(ctx)
            async with self.fanout.request_logs(ctx, ext):
                return await ext.request(request, result_type, progress=_progress_relay(ctx), caller=caller)
        except ExtensionUnavailable as exc:
            raise MCPError(UNAVAILABLE, str(exc), {"state": exc.state, "retryable": exc.retryable}) from None
        except CallFailed as exc:
            raise MCPError(exc.code or types.INTERNAL_ERROR, str(exc), exc.data) from None
        except SupervisorError as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from None


def _forwarded(params: Any, **changes: Any) -> Any:
    """The client's params for the child: renamed, and without the client's ``_meta``.

    The client's progress token is its own; the child gets a fresh one from our session.
    """
    return params.model_copy(update={**changes, "meta": None})


def _progress_relay(ctx: ServerRequestContext[Any]) -> ProgressFnT:
    """Progress from the child, back to the client that asked (a no-op if it sent no token)."""
    return inputrequired.progress(ctx)


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
