"""The upstream: the connection one run of an extension talks MCP over, whatever its kind.

An :class:`~supervisor.extension.supervised.Extension` runs over one upstream at a time. Its
kinds: a stdio child (:class:`supervisor.child.connection.Connection`, with ``process/`` for
spawning, containment and the sandbox) and a remote server, over streamable HTTP or HTTP+SSE
(:class:`supervisor.remote.upstream.RemoteConnection`). What is the child's alone (its pid,
marker, cgroup, sandbox run, stdout spool) stays with the child's launch; the extension's
calls, listings, questions and guards use only this.

Concurrency: any task may send requests; only the task that opened the upstream ends it
(:meth:`Upstream.end` marks it ended, which that task then tears down).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import anyio
    import mcp_types as types
    from mcp.shared.dispatcher import ProgressFnT

    from supervisor.upstream.listing import Listing
    from supervisor.upstream.raw import Raw
    from supervisor.upstream.wire import Watched

__all__ = ("Upstream",)

ResultT = TypeVar("ResultT")


class Upstream(Protocol):
    """One run's MCP session upstream: handshake, lists, calls (decoded and raw), requests both
    ways, notifications (by the callbacks it was opened with), and why it ended."""

    capabilities: types.ServerCapabilities  # what its initialize declared
    ended: anyio.Event  # the run is over: exited, disconnected, or ended by a guard
    failure: str | None  # why it ended, when the run's end alone does not say
    raw: Raw | None  # plain-JSON calls beside the session (the fast path); None: decoded only
    watched: Watched  # requests the extension stopped waiting for: their late answers, dropped

    @property
    def run(self) -> str:
        """This run's id: what tells it from the extension's earlier and later runs."""

    def end(self, failure: str | None = None) -> None:
        """Mark the run over (*failure*: why), once; the task that opened it tears it down."""

    async def handshake(self, on_step: Callable[[str], None] | None = None) -> Listing:
        """``initialize``, then every list it declares; usable once this returns."""

    def offers(self, kind: str) -> bool:
        """Whether it declared *kind* (tools, prompts, resources, templates)."""

    async def list(self, kind: str) -> list[Any]:
        """Every page of one listing, bounded."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None, *, progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        """One tool call, decoded; cancelling the caller cancels it upstream."""

    async def call_tool_raw(
        self, name: str, arguments: dict[str, Any] | None, *, progress: ProgressFnT
    ) -> dict[str, Any]:
        """One tool call as plain JSON (needs :attr:`raw`)."""

    async def request_raw(
        self, method: str, params: dict[str, Any], *, progress: ProgressFnT
    ) -> dict[str, Any]:
        """Any request as plain JSON, its result unvalidated (needs :attr:`raw`)."""

    async def request(
        self, request: types.ClientRequest, result_type: type[ResultT], *, progress: ProgressFnT | None = None
    ) -> ResultT:
        """Any client request as is (prompts/get, resources/read, completion/complete, ...)."""

    async def ping(self) -> None:
        """One ping; returns on its answer (raises on an error answer, which is an answer too)."""

    async def roots_changed(self) -> None:
        """Tell it the roots changed."""
