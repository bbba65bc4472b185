"""Who gets to the dashboard, over plain HTTP against a real daemon: the one-time code, the
cookie, the policy on every answer, same-origin JSON for every request that acts, read-only
sessions, and the bounds on its event streams."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from supervisor.dashboard.pages import COALESCE, LOG_TAIL, MAX_STREAMS
from supervisor.gateway.http.guard import Guard
from tests.dashboard import call, session
from tests.harness.daemon import TOKEN, Daemon, until
from tests.harness.servers import extension_settings
from tests.harness.timing import patience
from tests.process.sandbox.test_sandbox import attempt

ECHO = {"echo": extension_settings("rich.py")}  # the standard library's: no SDK to import
pytestmark = pytest.mark.timeout(90)


def events(response: httpx2.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a server-sent event stream."""
    name = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield name, json.loads(line.removeprefix("data: "))


class TestTheCode:
    def test_the_command_opens_the_listener_and_its_code_works_once(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        """With the HTTP gateway off, `dashboard` opens the listener for the page alone."""
        daemon = daemons(ECHO, settings={"gateway": {"http": {"port": 0}}})
        assert not daemon.find("gateway.http_listening")  # nobody asked: no port open
        printed = daemon.cli("dashboard", "--no-browser")
        assert printed.returncode == 0, printed.stderr
        url = printed.stdout.strip()
        assert "works once" in printed.stderr and url.startswith("http://127.0.0.1:")
        base = url.split("/dashboard/")[0]
        client = httpx2.Client(timeout=10)

        assert client.get(base + "/").status_code == 401  # no session yet: how to get one
        opened = client.get(url, follow_redirects=False)
        assert opened.status_code == 303 and opened.headers["location"] == "/"  # the code leaves the URL
        cookie = opened.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        page = client.get(base + "/")
        assert page.status_code == 200 and 'src="/dashboard/static/app.js"' in page.text
        assert "<script>" not in page.text  # no inline script anywhere

        again = httpx2.get(url, follow_redirects=False, timeout=10)  # the same link, another browser
        assert again.status_code == 403 and "used or has expired" in again.text
        assert "set-cookie" not in again.headers
        assert httpx2.get(base + "/mcp", headers={"Authorization": "Bearer x"}, timeout=10).status_code in (
            401,
            404,
        )  # the MCP endpoint is not served: only the page was asked for
        assert httpx2.get(base + "/healthz", timeout=10).status_code == 200

    def test_a_daemon_with_the_dashboard_off_says_so(self, daemons: Callable[..., Daemon]) -> None:
        daemon = daemons(ECHO, settings={"dashboard": {"enabled": False}, "gateway": {"http": {"port": 0}}})
        result = daemon.cli("dashboard", "--no-browser")
        assert result.returncode == 1
        assert "dashboard is off" in result.stderr and "dashboard.enabled" in result.stderr
        assert not daemon.find("gateway.http_listening")


class TestEveryAnswer:
    def test_carries_a_strict_policy(self, daemons: Callable[..., Daemon]) -> None:
        daemon = daemons(ECHO, http={})
        base, client = session(daemon)
        anonymous = httpx2.Client(timeout=10)
        answers = [
            client.get(base + "/"),
            client.get(base + "/dashboard/static/app.js"),
            client.get(base + "/dashboard/static/app.css"),
            client.get(base + "/dashboard/static/../passes.py"),
            client.get(base + "/dashboard/nothing"),
            anonymous.get(base + "/"),
            anonymous.post(base + "/dashboard/rpc", json={}),
            client.delete(base + "/dashboard/rpc"),
        ]
        assert [a.status_code for a in answers] == [200, 200, 200, 404, 404, 401, 401, 405]
        for answer in answers:
            policy = answer.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy
            assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["referrer-policy"] == "no-referrer"
        assert answers[1].headers["content-type"].startswith("text/javascript")
        assert answers[2].headers["content-type"].startswith("text/css")

    def test_the_token_does_not_open_the_page_nor_the_cookie_the_gateway(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        daemon = daemons(ECHO, http={})
        base, client = session(daemon)
        assert httpx2.get(base + "/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
        refused = client.post(base + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401  # the page's cookie is not the gateway's token
        assert client.get(base + "/metrics").status_code == 401


class TestWhoIsServed:
    def test_not_the_daemon_s_own_extensions_even_with_the_person_s_cookie(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        """A `gateway: true` extension may call the gateway, not the page: a page of its own on
        another loopback port would receive the person's cookie (sent to every port of a host)."""
        allowed = extension_settings("hostile.py", sandbox={"gateway": True})
        daemon = daemons({"allowed": allowed}, http={})
        daemon.wait_running("allowed")
        base, client = session(daemon)
        cookie = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
        assert client.get(base + "/").status_code == 200  # the person's own browser
        done = attempt(daemon, "allowed", "http_get_cookie", f"{base}/ {cookie}")
        assert "HTTP 403" in done and "own extensions" in done, done
        assert client.get(base + "/").status_code == 200

    def test_a_body_nested_too_deep_is_a_parse_error(self, daemons: Callable[..., Daemon]) -> None:
        daemon = daemons(ECHO, http={})
        base, client = session(daemon)
        deep = client.post(
            base + "/dashboard/rpc",
            content=b"[" * 60_000,
            headers={"Origin": base, "Content-Type": "application/json"},
        )
        assert deep.status_code == 200 and deep.json()["error"]["code"] == -32700, deep.text
        assert not daemon.problems()

    def test_another_page_of_the_host_cannot_open_the_event_stream(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        daemon = daemons(ECHO, http={})
        base, client = session(daemon)
        foreign = client.get(base + "/dashboard/events", headers={"Sec-Fetch-Site": "same-site"})
        assert foreign.status_code == 403  # an <img src> on another port: not our page's fetch


class TestRequestsThatAct:
    def test_come_from_the_page_as_json_with_a_session(self, daemons: Callable[..., Daemon]) -> None:
        daemon = daemons(ECHO, http={})
        daemon.wait_running("echo")
        base, client = session(daemon)
        body = {"jsonrpc": "2.0", "id": 1, "method": "restart", "params": {"name": "echo", "wait": False}}
        rpc = base + "/dashboard/rpc"
        assert client.post(rpc, json=body).status_code == 403  # no Origin: not from a page
        assert client.post(rpc, json=body, headers={"Origin": "http://evil.example"}).status_code == 403
        same_site = {"Origin": base, "Sec-Fetch-Site": "same-site"}
        assert client.post(rpc, json=body, headers=same_site).status_code == 403
        form = client.post(
            rpc, content=json.dumps(body), headers={"Origin": base, "Content-Type": "text/plain"}
        )
        assert form.status_code == 403  # what a cross-site form could send
        assert httpx2.post(rpc, json=body, headers={"Origin": base}).status_code == 401  # no cookie
        assert (
            client.post(
                rpc, content=b"x" * (70 << 10), headers={"Origin": base, "Content-Type": "application/json"}
            ).status_code
            == 413
        )
        assert not daemon.find("extension.state") or all(
            e["state"] != "stopping" for e in daemon.find("extension.state")
        )  # none of them restarted anything

        assert call(client, base, "restart", name="echo", wait=False)["result"]["name"] == "echo"
        # It answers before the restart begins: "running" read now may be the old run's.
        until(lambda: any(e["state"] == "stopping" for e in daemon.find("extension.state")))
        daemon.wait_running("echo")

        malformed = client.post(
            rpc, content=b"{", headers={"Origin": base, "Content-Type": "application/json"}
        )
        assert malformed.json()["error"]["code"] == -32700  # the control protocol's own words
        unknown = call(client, base, "call", name="echo", tool="echo", arguments={"text": "x"})
        assert "not a dashboard method" in unknown["error"]["message"]

    def test_a_read_only_session_looks_and_does_not_act(self, daemons: Callable[..., Daemon]) -> None:
        daemon = daemons(ECHO, http={})
        daemon.wait_running("echo")
        base, looker = session(daemon, read_only=True)
        assert call(looker, base, "status")["result"]["extensions"][0]["name"] == "echo"
        assert call(looker, base, "logs", name="echo", lines=5)["result"]["lines"]
        for method, params in [("restart", {"name": "echo"}), ("stop", {"name": "echo"}), ("reload", {})]:
            refused = call(looker, base, method, **params)
            assert "read-only" in refused["error"]["message"], refused
        assert daemon.status()["echo"]["restarts"] == 0 and daemon.status()["echo"]["state"] == "running"

    def test_a_config_made_read_only_by_a_reload_binds_open_sessions(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        daemon = daemons(ECHO, http={})
        base, client = session(daemon)
        daemon.write(ECHO, dashboard={"read_only": True})
        assert call(client, base, "reload")["result"]["unchanged"] == ["echo"]
        assert "read-only" in call(client, base, "stop", name="echo")["error"]["message"]
        assert daemon.request("dashboard")["read_only"] is True


class TestClients:
    @pytest.mark.anyio
    async def test_an_http_client_is_listed_with_its_requests_in_flight(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        daemon = daemons(ECHO, http={})
        daemon.wait_running("echo")
        async with Client(daemon.mcp(), mode="legacy") as client:
            await client.list_tools()
            (listed,) = await anyio.to_thread.run_sync(lambda: daemon.request("clients")["clients"])
            assert listed["listener"] == "http" and listed["protocol"] == "2025-11-25", listed
            assert isinstance(listed["in_flight"], int), listed
        await anyio.to_thread.run_sync(lambda: until(lambda: daemon.request("clients")["clients"] == [], 10))


class TestLive:
    def test_a_restart_reaches_an_open_page_as_it_happens(self, daemons: Callable[..., Daemon]) -> None:
        lasting = extension_settings("slow_start.py", env={"SLOW_START_SECONDS": "1"})  # its start is seen
        daemon = daemons({"echo": lasting}, http={})
        daemon.wait_running("echo")
        base, client = session(daemon)
        seen: list[str] = []
        with client.stream("GET", base + "/dashboard/events?logs=echo", timeout=patience(20)) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            restarted = False
            for event, data in events(stream):
                if event == "logs":
                    assert data["lines"][0] == "\x1b[32mdownloading\x1b[0m 1"  # as the child wrote it
                if event != "status":
                    continue
                seen.append(data["result"]["extensions"][0]["state"])
                if not restarted:
                    assert call(client, base, "restart", name="echo", wait=False)["result"]
                    restarted = True
                elif seen[-1] == "running":
                    break
        assert seen[0] == "running" and "running" in seen[1:]
        assert {"stopping", "starting"} & set(seen[1:]), seen  # the page saw it go, then come back

    def test_a_flood_of_changes_and_log_lines_reaches_a_page_coalesced(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        """A crash loop (a state change every few ms) and a stderr flood: whatever comes, a page
        gets at most one status and one log tail per coalescing window, the tail at most 200 lines."""
        crashing = extension_settings("exit_now.py", backoff={"initial": 0, "max": 0, "jitter": 0})
        daemon = daemons({**ECHO, "crashing": crashing}, http={})
        daemon.wait_running("echo")
        base, client = session(daemon)
        counted: dict[str, int] = {"status": 0, "logs": 0}
        window = 3.0
        with client.stream("GET", base + "/dashboard/events?logs=echo", timeout=patience(20)) as stream:
            started = None
            for event, data in events(stream):
                if event == "logs":
                    assert len(data["lines"]) <= LOG_TAIL
                if started is None:
                    daemon.request("call", {"name": "echo", "tool": "stderr", "arguments": {"lines": 20000}})
                    started = time.monotonic()
                    continue
                if event in counted:
                    counted[event] += 1
                if time.monotonic() - started > window:
                    break
        elapsed = time.monotonic() - started
        assert daemon.status()["crashing"]["restarts"] > 5  # it was a flood (restarts take a spawn each)
        for event, count in counted.items():
            assert 1 <= count <= elapsed / COALESCE + 2, (event, count, elapsed)

    def test_streams_are_bounded_and_one_silent_page_holds_up_no_other(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        """Past the cap the oldest stream is closed; a page that never reads its stream leaves
        another page's requests and stream served."""
        daemon = daemons(ECHO, http={})
        base, client = session(daemon)
        ended = threading.Event()

        def oldest() -> None:
            with client.stream("GET", base + "/dashboard/events", timeout=patience(30)) as stream:
                for _ in events(stream):
                    pass
            ended.set()

        first = threading.Thread(target=oldest, daemon=True)
        first.start()
        held = [httpx2.Client(timeout=10, cookies=client.cookies) for _ in range(MAX_STREAMS)]
        opened = []
        try:
            for other in held:  # never read: each sits in the daemon's send buffer
                request = other.build_request("GET", base + "/dashboard/events")
                opened.append(other.send(request, stream=True))
            assert ended.wait(patience(15)), "the oldest stream was not closed at the cap"
            figures = daemon.request("health")["dashboard"]
            assert figures["streams"] == MAX_STREAMS and figures["sessions"] == 1, figures
            started = time.monotonic()
            assert call(client, base, "status")["result"]["extensions"][0]["name"] == "echo"
            assert time.monotonic() - started < patience(5)
        finally:
            for response in opened:
                response.close()
            for other in held:
                other.close()


def test_a_listener_bound_to_every_address_takes_its_page_s_requests_from_loopback() -> None:
    """The dashboard's URL names 127.0.0.1 when the listener is bound to 0.0.0.0 or ::; its page's
    Origin is then that, not the bound address (pure: the Guard alone)."""
    for host in ("0.0.0.0", "::"):
        guard = Guard(lambda *_: None, host=host, port=8765, token=None)  # type: ignore[arg-type,return-value]
        for origin in (b"http://127.0.0.1:8765", b"http://localhost:8765", b"http://[::1]:8765"):
            assert guard.admits({"path": "/dashboard/rpc", "headers": [(b"origin", origin)]}), (host, origin)
        assert not guard.admits({"path": "/dashboard/rpc", "headers": [(b"origin", b"http://evil.example")]})
