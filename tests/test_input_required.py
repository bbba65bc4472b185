"""A child's questions mid-call, for 2026-07-28 clients: input-required results and their retries.

A real daemon runs ``tests/servers/asker.py``, whose tools ask their client mid-call. Real SDK
``Client`` objects in the 2026-07-28 mode call through ``mcp.sock`` and streamable HTTP: their
input-required driver answers the questions and retries, unchanged. Some tests drive the rounds
by hand (``client.session.call_tool(..., allow_input_required=True)``) to check each rule.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError

from .conftest import eventually, extension_settings, first_text
from .gateway_client import unix_transport
from .test_daemon import Daemon, daemons  # noqa: F401 - the fixture
from .test_gateway import gateway, mcp_sock  # noqa: F401 - the fixture
from .test_gateway_http import http_gateway  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),  # roots and sampling
]

ASKER = extension_settings("asker.py")
MODERN = "2026-07-28"


async def elicit_yes(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"answer": f"yes to {params.message}"})


async def sample_hi(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", content=types.TextContent(text="hi"), model="m1")


async def list_home(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///home/client", name="client")])


ANSWERING = {
    "elicitation_callback": elicit_yes,
    "sampling_callback": sample_hi,
    "list_roots_callback": list_home,
}


def logs(daemon: Daemon) -> str:
    return daemon.cli("logs", "asker").stdout


@asynccontextmanager
async def modern(daemon: Daemon, **callbacks: Any) -> AsyncIterator[Client]:
    """A 2026-07-28 SDK Client on the daemon's mcp.sock."""
    async with Client(unix_transport(mcp_sock(daemon)), mode=MODERN, **callbacks) as client:
        await client.list_tools()
        yield client


async def ask(client: Client, tool: str, **arguments: Any) -> types.CallToolResult | types.InputRequiredResult:
    """One round by hand: the call's result or its input-required result."""
    result = await client.session.call_tool(f"asker__{tool}", arguments, allow_input_required=True)
    assert isinstance(result, types.CallToolResult | types.InputRequiredResult), result
    return result


async def retry(
    client: Client, tool: str, state: str | None, answers: dict[str, Any] | None = None, **arguments: Any
) -> types.CallToolResult | types.InputRequiredResult:
    result = await client.session.call_tool(
        f"asker__{tool}",
        arguments,
        input_responses=answers,
        request_state=state,
        allow_input_required=True,
    )
    assert isinstance(result, types.CallToolResult | types.InputRequiredResult), result
    return result


ACCEPT = types.ElicitResult(action="accept", content={"answer": "by hand"})


class TestDriver:
    async def test_a_stock_client_completes_each_kind_of_question_on_mcp_sock(self, gateway) -> None:
        daemon = gateway({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            elicited = await client.call_tool("asker__elicit", {"message": "go?"})
            assert first_text(elicited) == 'accept {"answer": "yes to go?"}'
            assert first_text(await client.call_tool("asker__sample", {"prompt": "hello"})) == "m1 hi"
            roots = await client.call_tool("asker__roots", {})
            assert json.loads(first_text(roots)) == ["file:///home/client"]
        assert "asker: elicit -> accept" in logs(daemon)

    async def test_a_stock_client_completes_the_call_over_http(self, http_gateway) -> None:
        http = http_gateway({"asker": ASKER})
        async with Client(http.url + "/mcp", mode=MODERN, **ANSWERING) as client:
            elicited = await client.call_tool("asker__elicit", {"message": "over http?"})
            assert first_text(elicited) == 'accept {"answer": "yes to over http?"}'
            assert first_text(await client.call_tool("asker__sample", {"prompt": "x"})) == "m1 hi"


class TestRounds:
    async def test_the_retry_resumes_the_same_child_call(self, gateway) -> None:
        daemon = gateway({"asker": ASKER})
        async with modern(daemon, **ANSWERING) as client:
            first = await ask(client, "elicit", message="once?")
            assert isinstance(first, types.InputRequiredResult) and first.input_requests
            [(key, request)] = first.input_requests.items()
            assert isinstance(request, types.ElicitRequest) and request.params.message == "once?"
            done = await retry(client, "elicit", first.request_state, {key: ACCEPT}, message="once?")
            assert isinstance(done, types.CallToolResult)
            assert first_text(done) == 'accept {"answer": "by hand"}'
        assert logs(daemon).count("asker: elicit ->") == 1  # one child call, never replayed
