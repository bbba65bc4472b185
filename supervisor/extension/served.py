"""What the gateway uses of one extension: the narrow face of :class:`.supervised.Extension`.

The gateway routes, lists and forwards through this alone, never through an extension's
lifetimes (start, stop, restart: the daemon's), its watcher or its upstream, so an extension
over another kind of upstream (a remote server) serves the gateway unchanged. Every method
here is documented where :class:`~.supervised.Extension` implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.shared.dispatcher import ProgressFnT

    from supervisor.config.extension import ExtensionConfig
    from supervisor.extension.asking import Caller
    from supervisor.extension.inline import Answered, InlineCall
    from supervisor.extension.pins import Pins
    from supervisor.extension.state import Snapshot, State
    from supervisor.upstream.listing import Listing

__all__ = ("Served",)

ResultT = TypeVar("ResultT")


class Served(Protocol):
    """One extension (shared, or one client's instance) as the gateway sees it."""

    name: str
    config: ExtensionConfig
    pins: Pins | None  # its pinned tool definitions (None: not pinned)

    # ---- what it offers, and whether it runs ---------------------------------------------

    def snapshot(self) -> Snapshot: ...

    @property
    def state(self) -> State: ...

    @property
    def run_id(self) -> str | None: ...

    @property
    def capabilities(self) -> types.ServerCapabilities | None: ...

    @property
    def dormant(self) -> bool: ...

    @property
    def on_the_way(self) -> bool: ...

    def offered(self) -> Listing: ...

    def known_listing(self) -> Listing: ...

    async def wait_for(self, predicate: Callable[[Snapshot], bool]) -> Snapshot: ...

    # ---- forwarding --------------------------------------------------------------------------

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> types.CallToolResult: ...

    async def call_tool_raw(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> dict[str, Any]: ...

    def call_tool_inline(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        answered: Answered,
        *,
        caller: Caller | None = None,
    ) -> InlineCall | None: ...

    async def request(
        self,
        request: types.ClientRequest,
        result_type: type[ResultT],
        *,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
    ) -> ResultT: ...

    async def request_raw(
        self,
        method: str,
        params: dict[str, Any],
        *,
        run: str | None = None,
        progress: ProgressFnT | None = None,
        caller: Caller | None = None,
        blocking: bool = False,
        touch: bool = True,
    ) -> tuple[dict[str, Any], str]: ...

    async def roots_changed(self, client: object) -> None: ...
