"""The SDK's request handlers of the gateway: listings, calls, prompts, reads, completions,
subscriptions, log levels and roots, each answered in the calling client's view.

The methods of :class:`~supervisor.gateway.server.Gateway` that the lowlevel ``Server`` calls.
A request is routed by the gateway's :class:`~.router.Router`, served by the Extension that
serves its client (:class:`~.session.Session`: its own instance for a per-client extension),
and answered with the child's result, its links rewritten (:mod:`.links`). Errors become the
MCP errors a client can act on: -32602 for names it cannot use, ``UNAVAILABLE`` (-32003, with
the state and whether to retry) for an extension that is not running, the child's own error
otherwise; a failed tool call is a tool result with ``isError``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.shared.dispatcher import ProgressFnT

from supervisor.errors import CallFailed, ExtensionUnavailable, SupervisorError
from supervisor.extension.served import Served
from supervisor.extension.state import State
from supervisor.gateway import spoollinks
from supervisor.gateway.asks import parked
from supervisor.gateway.links import expose_models
from supervisor.gateway.names import expose_uri, parse_uri
from supervisor.gateway.notify.downstream import MAX_SUBSCRIPTIONS
from supervisor.gateway.session import session_of
from supervisor.gateway.toolerrors import is_tool_error
from supervisor.gateway.view.profiles import View, call_meta, hidden_reason

__all__ = ("UNAVAILABLE", "Handlers")

UNAVAILABLE = -32003  # as on the control socket: the extension is not running (data: state, retryable)
MAX_URI_LENGTH = 4096  # a subscription is kept for the connection's life: keep its key small
ResultT = TypeVar("ResultT")


class Handlers:
    """The request handlers, as part of the Gateway (its ``router``, ``views``, ``fanout``, ...)."""

    def _view(self, ctx: ServerRequestContext[Any]) -> View:
        return self.views.of(ctx.request)

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        self.fanout.client(ctx)  # its Session now knows its connection: the fast path opens after this
        self.note_http_session(ctx)
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
            ext = await self._serving(ext, ctx)
            caller = parked.caller(ctx)
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
        state = ext.state if ext is not None else State.RUNNING
        if ext is not None and ext.on_the_way:
            timeout = ext.config.call_timeout
            detail = f"not running after {timeout:g}s"
            return _tool_error(
                str(ExtensionUnavailable(ext.name, state.value, retryable=True, detail=detail))
            )
        if ext is not None and state is not State.RUNNING:
            return _tool_error(
                f"extension {ext.name!r} is {state.value}; {state.remedy(ext.name)}, then list tools again"
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

    async def _serving(self, ext: Served, ctx: ServerRequestContext[Any]) -> Served:
        """The Extension that serves this request's client (:meth:`.Router.serving_when_room`).
        An HTTP session is noted by its id first: at the cap, a long idle one may be reclaimed."""
        self.note_http_session(ctx)
        return await self.router.serving_when_room(ext, session_of(ctx))

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
            ext = await self._serving(ext, ctx)
            caller = parked.caller(ctx)
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
    return parked.progress(ctx)


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
