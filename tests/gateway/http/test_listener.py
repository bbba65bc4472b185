"""The gateway over streamable HTTP: both eras, /metrics, /healthz, the token and the Origin check."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from tests.harness import RICH, Streams, eventually, first_text
from tests.harness.daemon import TOKEN

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]


class TestEras:
    @pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
    async def test_list_and_call(self, http_gateway, mode: str) -> None:
        http = http_gateway({"rich": RICH})
        async with Client(http.mcp(), mode=mode) as client:
            assert "rich__echo" in [t.name for t in (await client.list_tools()).tools]
            assert first_text(await client.call_tool("rich__echo", {"text": mode})) == mode
            prompt = await client.get_prompt("rich__greet", {"name": "HTTP"})
            assert prompt.messages[0].content.text == "Hello, HTTP!"  # type: ignore[union-attr]

    async def test_progress_over_http(self, http_gateway) -> None:
        http = http_gateway({"rich": RICH})
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        async with Client(http.mcp(), mode="legacy") as client:
            await client.call_tool("rich__progress", {"steps": 2}, progress_callback=on_progress)
        assert seen == [1, 2]


class TestEndpoints:
    async def test_metrics_and_healthz(self, http_gateway) -> None:
        http = http_gateway({"rich": RICH})
        async with Client(http.mcp(), mode="legacy") as client:
            await client.call_tool("rich__echo", {"text": "count me"})
        metrics = await anyio.to_thread.run_sync(http.get, "/metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        assert 'mcp_supervisor_tool_calls_total{extension="rich",tool="echo"} 1.0' in metrics.text
        health = (await anyio.to_thread.run_sync(http.get, "/healthz")).json()
        assert health["status"] == "ok" and health["extensions"] == {"running": 1}


class TestGuard:
    async def test_foreign_origin_and_host_are_refused(self, http_gateway) -> None:
        http = http_gateway({"rich": RICH})
        port = http.url.rsplit(":", 1)[1]
        assert http.get("/healthz", Origin="http://evil.example").status_code == 403
        assert http.get("/healthz", Host=f"evil.example:{port}").status_code == 421  # DNS rebinding
        assert http.get("/healthz", Origin=f"http://localhost:{port}").status_code == 200

    async def test_token_is_required_when_configured(self, http_gateway) -> None:
        http = http_gateway({"rich": RICH}, host="0.0.0.0", token="s3cret-token-0123456789")
        local = http.url = http.url.replace("0.0.0.0", "127.0.0.1")
        assert httpx2.get(local + "/metrics", timeout=10).status_code == 401
        assert http.get("/metrics", Authorization="Bearer wrong").status_code == 401
        assert http.get("/metrics", Authorization="Bearer s3cret-token-0123456789").status_code == 200
        assert httpx2.get(local + "/healthz", timeout=10).status_code == 200  # probes carry no secret
        headers = {"Authorization": "Bearer s3cret-token-0123456789"}
        async with httpx2.AsyncClient(headers=headers) as authorised:
            from mcp.client.streamable_http import streamable_http_client

            async with (
                streamable_http_client(local + "/mcp", http_client=authorised) as streams,
                Client(Streams(streams), mode="legacy") as client,
            ):
                assert (
                    first_text(await client.call_tool("rich__echo", {"text": "authorised"})) == "authorised"
                )
        secret_logged = "s3cret-token-0123456789" in http.log.read_text()
        assert not secret_logged

    async def test_a_busy_port_is_a_clear_error(self, http_gateway, daemons, short_tmp: Path) -> None:
        first = http_gateway({})
        port = int(first.url.rsplit(":", 1)[1])
        (short_tmp / "second").mkdir(mode=0o700)
        second = daemons({}, start=False, directory=short_tmp / "second")
        gateway = {"http": {"enabled": True, "port": port, "token": TOKEN}}
        second.config.write_text(json.dumps({"socket": second.socket, "gateway": gateway, "extensions": {}}))
        second.start()
        assert second.proc is not None and second.proc.wait(timeout=20) == 1
        await eventually(lambda: "cannot listen on http://127.0.0.1" in second.log.read_text())
