"""2026-07-28 clients: child log messages per request, resource subscriptions per listen stream."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.shared.subscriptions import ResourceUpdated

from supervisor.gateway.notify.downstream import MAX_LOG_DATA, MAX_PENDING_LOGS, MAX_SUBSCRIPTIONS
from supervisor.gateway.notify.listen import MAX_LISTENS
from supervisor.gateway.notify.requestlogs import RequestLog
from tests.harness import RICH, Daemon, eventually, first_text, gateway_session, unix_transport
from tests.harness.timing import fail_after

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

NOTE_A, NOTE_B = "mcp-supervisor://rich/note://a", "mcp-supervisor://rich/note://b"


def modern(daemon: Daemon, **options: Any) -> Client:
    return Client(unix_transport(daemon.mcp_sock), mode="2026-07-28", **options)


def collector() -> tuple[list[types.LoggingMessageNotificationParams], Any]:
    got: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        got.append(params)

    return got, on_log


def subscribed(daemon: Daemon, uri: str, what: str = "subscribed") -> int:
    """How many times rich's runs were subscribed (or unsubscribed) to *uri* (they say so on stderr)."""
    return daemon.cli("logs", "rich").stdout.count(f"rich: {what} {uri}\n")


class TestLogMessages:
    async def test_a_childs_log_messages_reach_the_request_that_asked_at_its_level(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        asked, on_asked = collector()
        unasked, on_unasked = collector()
        async with (
            modern(daemon, log_level="warning", logging_callback=on_asked) as client,
            modern(daemon, logging_callback=on_unasked) as other,
        ):
            await other.call_tool("rich__log", {"level": "error", "message": "nobody asked"})
            await client.call_tool("rich__log", {"level": "info", "message": "too low"})
            await client.call_tool("rich__log", {"level": "error", "message": "wanted"})
            await eventually(lambda: len(asked) >= 1)
            await client.call_tool("rich__log", {"level": "critical", "message": "y" * 100_000})
            await eventually(lambda: len(asked) >= 2)
            await other.call_tool("rich__echo", {"text": "in order after anything sent before"})
        assert [(p.level, p.data, p.logger) for p in asked[:1]] == [("error", "wanted", "rich/fixture")]
        assert asked[1].data.startswith("y" * MAX_LOG_DATA)
        assert "characters cut by mcp-supervisor" in asked[1].data
        assert len(asked) == 2 and unasked == []

    async def test_a_request_to_another_extension_hears_nothing(self, gateway) -> None:
        """Log messages go to the requests in flight to the child that sent them, no other."""
        daemon = gateway({"rich": RICH, "other": RICH})
        asked, on_asked = collector()
        bystander, on_bystander = collector()
        async with (
            modern(daemon, log_level="debug", logging_callback=on_asked) as client,
            modern(daemon, log_level="debug", logging_callback=on_bystander) as other,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(other.call_tool, "other__wait", {"seconds": 30})
            await eventually(lambda: daemon.status()["other"]["in_flight"] == 1, within=10)
            await client.call_tool("rich__log", {"level": "info", "message": "for the caller"})
            await eventually(lambda: len(asked) == 1)
            tg.cancel_scope.cancel()
        assert [p.data for p in asked] == ["for the caller"] and bystander == []

    async def test_a_flood_is_bounded_and_the_rest_arrives(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        asked, on_asked = collector()
        async with modern(daemon, log_level="debug", logging_callback=on_asked) as client:
            result = await client.call_tool("rich__log", {"level": "debug", "message": "x", "count": 2000})
            assert first_text(result) == "logged"
            await eventually(lambda: len(asked) >= 1)
            assert first_text(await client.call_tool("rich__echo", {"text": "still fine"})) == "still fine"
        assert 1 <= len(asked) <= 2000

    async def test_a_requests_queue_holds_at_most_max_pending_logs(self) -> None:
        """Nobody sending (a client that stopped reading): the newest entries are kept, the rest counted."""
        request = RequestLog(frozenset({"info", "error"}), lambda: None)
        for i in range(MAX_PENDING_LOGS * 10):
            request.offer("error", i, None)
            request.offer("debug", i, None)  # not asked for: not even queued
        assert len(request) == MAX_PENDING_LOGS
        assert request.dropped == MAX_PENDING_LOGS * 9

    async def test_a_failed_send_loses_that_entry_only(self) -> None:
        """A parked call's stream may end mid-send (its retry was answered): the next retry still hears."""
        sent: list[Any] = []

        async def send_notification(notification: Any, related_request_id: Any) -> None:
            if not sent:
                sent.append(None)
                raise anyio.BrokenResourceError  # the first stream is gone
            sent.append(notification.params.data)

        session = SimpleNamespace(send_notification=send_notification)
        meta = {types.LOG_LEVEL_META_KEY: "info"}
        ctx = SimpleNamespace(protocol_version="2026-07-28", meta=meta, session=session, request_id=1)
        request = RequestLog(frozenset({"info"}), lambda: ctx)  # type: ignore[arg-type, return-value]
        async with anyio.create_task_group() as tg:
            tg.start_soon(request.run)
            request.offer("info", "lost", None)
            await eventually(lambda: sent == [None])
            request.offer("info", "heard", None)
            request.close()
            with fail_after(5):
                await request.done.wait()
        assert sent == [None, "heard"] and request.dropped == 1

    async def test_over_http_on_the_requests_own_stream(self, http_gateway) -> None:
        http = http_gateway({"rich": RICH})
        asked, on_asked = collector()
        async with Client(
            http.mcp(), mode="2026-07-28", log_level="info", logging_callback=on_asked
        ) as client:
            await client.call_tool("rich__log", {"level": "warning", "message": "over http"})
            await eventually(lambda: len(asked) == 1)
        assert (asked[0].level, asked[0].data) == ("warning", "over http")


async def next_event(subscription: Any, within: float = 10) -> Any:
    with fail_after(within):
        return await subscription.__anext__()


class TestSubscriptions:
    async def test_updates_reach_the_listener_and_not_others_and_survive_a_restart(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        async with (
            modern(daemon) as client,
            modern(daemon) as other,
            client.listen(resource_subscriptions=[NOTE_A]) as on_a,
            other.listen(resource_subscriptions=[NOTE_B]) as on_b,
        ):
            assert subscribed(daemon, "note://a") == 1 and subscribed(daemon, "note://b") == 1
            await client.call_tool("rich__touch", {"uri": "note://a"})
            assert await next_event(on_a) == ResourceUpdated(uri=NOTE_A)
            await client.call_tool("rich__touch", {"uri": "note://b"})
            assert await next_event(on_b) == ResourceUpdated(uri=NOTE_B)  # the first other hears
            await anyio.to_thread.run_sync(daemon.cli, "restart", "rich")  # the new run is subscribed again
            await eventually(lambda: subscribed(daemon, "note://a") == 2, within=10)
            await client.call_tool("rich__touch", {"uri": "note://a"})
            assert await next_event(on_a) == ResourceUpdated(uri=NOTE_A)  # not note://b's, before it

    async def test_a_per_client_instances_update_reaches_its_own_clients_streams_only(self, gateway) -> None:
        """Two mcp.sock clients, each with its own instance of a per-client extension, listening
        to the same URIs: each stream hears its own instance's update alone."""
        daemon = gateway({"rich": {**RICH, "instances": "per-client"}})
        async with (
            modern(daemon) as client,
            modern(daemon) as other,
            client.listen(resource_subscriptions=[NOTE_A, NOTE_B]) as on_client,
            other.listen(resource_subscriptions=[NOTE_A, NOTE_B]) as on_other,
        ):
            await other.call_tool("rich__touch", {"uri": "note://b"})
            assert await next_event(on_other) == ResourceUpdated(uri=NOTE_B)
            await client.call_tool("rich__touch", {"uri": "note://a"})
            assert await next_event(on_client) == ResourceUpdated(uri=NOTE_A)  # not the other's note://b
            await other.call_tool("rich__touch", {"uri": "note://b"})
            assert await next_event(on_other) == ResourceUpdated(uri=NOTE_B)  # not the client's note://a

    async def test_the_streams_end_releases_its_subscriptions(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        async with modern(daemon) as client:
            async with client.listen(resource_subscriptions=[NOTE_A]):
                assert subscribed(daemon, "note://a") == 1
            await anyio.to_thread.run_sync(daemon.cli, "restart", "rich")
            async with client.listen(resource_subscriptions=[NOTE_B]):  # after any resubscription
                assert subscribed(daemon, "note://b") == 1
        assert subscribed(daemon, "note://a") == 1  # nobody held it: the new run was not subscribed

    async def test_the_child_is_unsubscribed_once_nobody_holds_the_uri(self, gateway) -> None:
        """A handshake-era subscriber and a listen stream share the child's subscription."""
        daemon = gateway({"rich": RICH})
        updated = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                updated.set()

        async with (
            gateway_session(daemon.mcp_sock, message_handler=on_message) as session,
            modern(daemon) as client,
        ):
            await session.subscribe_resource(NOTE_A)
            async with client.listen(resource_subscriptions=[NOTE_A]):
                pass
            await session.call_tool("rich__touch", {"uri": "note://a"})  # the child is still subscribed
            with fail_after(5):
                await updated.wait()
            assert subscribed(daemon, "note://a", "unsubscribed") == 0
            await session.unsubscribe_resource(NOTE_A)
            await eventually(lambda: subscribed(daemon, "note://a", "unsubscribed") == 1, within=10)
            async with client.listen(resource_subscriptions=[NOTE_A]):  # taken again
                assert subscribed(daemon, "note://a") == 3
            await eventually(lambda: subscribed(daemon, "note://a", "unsubscribed") == 2, within=10)

    async def test_a_refused_subscription_refuses_the_stream(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        async with modern(daemon) as client:
            for uris in (["mcp-supervisor://nobody/note://a"], ["file:///etc/passwd"], [NOTE_A, "x" * 5000]):
                with pytest.raises(MCPError):
                    async with client.listen(resource_subscriptions=uris):
                        pass
            async with client.listen(resource_subscriptions=[NOTE_B]) as on_b:  # the connection goes on
                await client.call_tool("rich__touch", {"uri": "note://b"})
                assert await next_event(on_b) == ResourceUpdated(uri=NOTE_B)

    async def test_at_most_max_subscriptions_per_client_over_its_streams(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        half = MAX_SUBSCRIPTIONS // 2
        uris = [f"mcp-supervisor://rich/note://{i}" for i in range(MAX_SUBSCRIPTIONS + 1)]
        async with modern(daemon) as client, modern(daemon) as other:
            with pytest.raises(MCPError, match=f"at most {MAX_SUBSCRIPTIONS}"):
                async with client.listen(resource_subscriptions=uris):
                    pass
            assert subscribed(daemon, "note://0") == 0  # refused before any reached the child
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(client.listen(resource_subscriptions=uris[:half]))
                with pytest.raises(MCPError, match=f"at most {MAX_SUBSCRIPTIONS}"):
                    async with client.listen(resource_subscriptions=uris[half:]):
                        pass
                async with other.listen(resource_subscriptions=uris[half:]):  # another client's own
                    pass
            async with client.listen(resource_subscriptions=uris[half:-1]):  # the first one's were released
                pass


class TestFairness:
    async def test_a_child_that_never_answers_a_subscribe_delays_no_other_uri(self, gateway) -> None:
        """Subscribes to one extension used to queue behind each other, each for its call_timeout."""
        daemon = gateway({"rich": {**RICH, "call_timeout": 5}})
        async with (
            gateway_session(daemon.mcp_sock) as stuck,
            gateway_session(daemon.mcp_sock) as other,
            anyio.create_task_group() as tg,
        ):
            for n in range(3):
                tg.start_soon(_subscribe_quietly, stuck, f"mcp-supervisor://rich/note://hang{n}")
            await eventually(lambda: daemon.status()["rich"]["in_flight"] == 3, within=10)
            with fail_after(3):  # well inside one call_timeout
                await other.subscribe_resource(NOTE_A)
            assert subscribed(daemon, "note://a") == 1
            with fail_after(3), pytest.raises(MCPError):  # an unknown extension answers at once too
                await other.subscribe_resource("mcp-supervisor://nobody/note://a")
            tg.cancel_scope.cancel()

    async def test_at_most_max_listens_streams_per_client_and_the_others_still_listen(self, gateway) -> None:
        daemon = gateway({"rich": RICH})
        async with modern(daemon) as client, modern(daemon) as other, contextlib.AsyncExitStack() as stack:
            for _ in range(MAX_LISTENS):
                await stack.enter_async_context(client.listen(tools_list_changed=True))
            with pytest.raises(MCPError, match=f"at most {MAX_LISTENS} listen streams at once per client"):
                async with client.listen(tools_list_changed=True):
                    pass
            async with other.listen(resource_subscriptions=[NOTE_B]) as on_b:  # another client is not refused
                await other.call_tool("rich__touch", {"uri": "note://b"})
                assert await next_event(on_b) == ResourceUpdated(uri=NOTE_B)
            await stack.aclose()
            async with client.listen(tools_list_changed=True):  # its slots came back with its streams
                pass


async def _subscribe_quietly(session: Any, uri: str) -> None:
    with contextlib.suppress(MCPError):
        await session.subscribe_resource(uri)
