"""An MCP client session upstream, whatever carries it: what every upstream kind shares.

:class:`SessionUpstream` holds a handshake-era ``ClientSession`` over some transport (a child's
pipes, a remote server's HTTP) and does what needs only the session: the handshake and its
listings, decoded calls, any request as is, pings. A kind adds how it is opened, its run id,
and the plain-JSON calls (:attr:`SessionUpstream.raw` where it has a fast path).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types as types
import structlog
from mcp import ClientSession
from mcp.shared.dispatcher import ProgressFnT

from supervisor.errors import first_line
from supervisor.upstream.listing import Listing
from supervisor.upstream.wire import Watched, check_encodable

__all__ = ("LIST_CHANGED", "Asked", "ListChanged", "Notified", "SessionUpstream", "asking_callbacks")

log = structlog.get_logger(__name__)

MAX_LISTED = 10_000  # per listing: a server paginating forever must not grow our cache forever

ListChanged = Callable[[str], None]  # "tools", "prompts" or "resources"; sync, must not block
Notified = Callable[[types.ServerNotification], None]  # log messages, resource updates; sync
# The server asks its client something (sampling, elicitation, roots): the answer, or an error for it.
Asked = Callable[["SessionUpstream", types.ServerRequest], Awaitable[types.ClientResult | types.ErrorData]]
ResultT = TypeVar("ResultT")

_LIST_METHODS = {
    "tools": "tools/list",
    "prompts": "prompts/list",
    "resources": "resources/list",
    "templates": "resources/templates/list",
}
LIST_CHANGED: dict[str, str] = {
    "notifications/tools/list_changed": "tools",
    "notifications/prompts/list_changed": "prompts",
    "notifications/resources/list_changed": "resources",
}


class SessionUpstream:
    """One run's MCP session upstream and why it ended (see :class:`~supervisor.extension.upstream.Upstream`).

    Other tasks may send requests concurrently; only the task that opened it ends it.
    """

    raw: Any = None  # plain-JSON calls beside the session, where the kind has them

    def __init__(self) -> None:
        self.session: ClientSession | None = None
        self.capabilities = types.ServerCapabilities()  # what its initialize declared
        self.protocol: str | None = None  # the protocol version its initialize agreed on
        self.ended = anyio.Event()  # exited, disconnected, or ended by a guard
        self.failure: str | None = None  # why it ended, unless the run's end says it all
        self.ready = False  # the handshake completed: only then is a stop graceful
        self.watched = Watched()  # requests we stopped waiting for: their late answers and progress

    @property
    def run(self) -> str:
        """This run's id: what tells it from the extension's earlier and later runs."""
        raise NotImplementedError

    def end(self, failure: str | None = None) -> None:
        if not self.ended.is_set():
            self.failure = failure
            self.ended.set()

    async def handshake(self, on_step: Callable[[str], None] | None = None) -> Listing:
        """``initialize``, then every list the server declares: the extension is usable once this returns.

        Tools must list cleanly; a failing prompt or resource listing is logged and left empty,
        so one optional feature cannot keep the tools from clients. *on_step* is told each
        request before it is sent ("initialize", "tools/list", ...), for the status record.
        """
        step = on_step or (lambda method: None)
        step("initialize")
        result = await self._session.initialize()
        self.capabilities, self.protocol = result.capabilities, str(result.protocol_version)
        step(_LIST_METHODS["tools"])
        tools = await self.list("tools")
        optional: dict[str, list[Any]] = {}
        for kind in ("prompts", "resources", "templates"):
            if self.offers(kind):
                step(_LIST_METHODS[kind])
            try:
                optional[kind] = await self.list(kind)
            except Exception as exc:  # MCPError or a malformed listing
                log.warning("extension.listing_failed", kind=kind, error=first_line(exc))
                optional[kind] = []
        self.ready = True
        return Listing.of(tools, **optional)

    def offers(self, kind: str) -> bool:
        """Whether the server declared *kind* ("tools", "prompts", "resources", "templates")."""
        capabilities = self.capabilities
        return {
            "tools": capabilities.tools is not None,
            "prompts": capabilities.prompts is not None,
            "resources": capabilities.resources is not None,
            "templates": capabilities.resources is not None,
        }[kind]

    async def list(self, kind: str) -> list[Any]:
        """Every page of one listing, at most :data:`MAX_LISTED` items; [] if not declared."""
        if not self.offers(kind):
            return []
        fetch, attribute = {
            "tools": (self._session.list_tools, "tools"),
            "prompts": (self._session.list_prompts, "prompts"),
            "resources": (self._session.list_resources, "resources"),
            "templates": (self._session.list_resource_templates, "resource_templates"),
        }[kind]
        items: list[Any] = []
        cursor: str | None = None
        while len(items) < MAX_LISTED:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await fetch(params=params)
            found = getattr(page, attribute)
            items += found
            if not found or page.next_cursor in (None, "", cursor):  # done, or paging in place
                break
            cursor = page.next_cursor
        return items[:MAX_LISTED]

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
    ) -> types.CallToolResult:
        """Forward one call. Bound it with a cancel scope: cancelling sends the server a cancel.

        Error handling: ``MCPError(INVALID_PARAMS)`` when the call cannot be encoded as JSON
        (a lone surrogate, nesting too deep); nothing is sent then.
        """
        check_encodable({"name": name, "arguments": arguments})  # before the SDK trips over it
        return await self._session.call_tool(name, arguments, progress_callback=progress)

    async def ping(self) -> None:
        """One ping; returns on its answer. Error handling: an error answer raises ``MCPError``."""
        await self._session.send_ping()

    async def roots_changed(self) -> None:
        """Tell the server its roots changed (it lists them again if it cares)."""
        await self._session.send_notification(types.RootsListChangedNotification())

    async def request(
        self,
        request: types.ClientRequest,
        result_type: type[ResultT],
        *,
        progress: ProgressFnT | None = None,
    ) -> ResultT:
        """Forward any client request as is (prompts/get, resources/read, completion/complete, ...).

        Error handling: as :meth:`call_tool`, for params that cannot be encoded.
        """
        check_encodable(request.model_dump(by_alias=True, mode="json", exclude_none=True))
        return await self._session.send_request(request, result_type, progress_callback=progress)

    @property
    def _session(self) -> ClientSession:
        assert self.session is not None, "used outside connect()"
        return self.session


def asking_callbacks(connection: SessionUpstream, on_asked: Asked) -> dict[str, Any]:
    """The session's callbacks for the server's sampling, elicitation and roots requests.

    Giving them is what declares the capabilities to the server at ``initialize``.
    """

    async def sampling(
        context: Any, params: types.CreateMessageRequestParams
    ) -> types.ClientResult | types.ErrorData:
        return await on_asked(connection, types.CreateMessageRequest(params=params))

    async def elicitation(
        context: Any, params: types.ElicitRequestParams
    ) -> types.ClientResult | types.ErrorData:
        return await on_asked(connection, types.ElicitRequest(params=params))

    async def roots(context: Any) -> types.ClientResult | types.ErrorData:
        return await on_asked(connection, types.ListRootsRequest())

    return {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": roots}
