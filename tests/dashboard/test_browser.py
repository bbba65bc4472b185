"""The dashboard in a real browser: Debian's Chromium, driven by Playwright.

Each test opens the page the way a person does (the URL `mcp-supervisor dashboard` prints) and
acts through the page: the keyboard and clicks, never the page's own functions. With
``DASHBOARD_SCREENSHOTS=DIR`` they also save the screenshots that ``docs/dashboard.md`` shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession

from tests.harness.daemon import Daemon, until
from tests.harness.gateway_client import gateway_session
from tests.harness.servers import extension_settings
from tests.harness.timing import patience
from tests.remote.test_oauth import Protected

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("DASHBOARD_SCREENSHOTS")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="no Chromium on this host: `apt-get install chromium` (.ci/run does it)"
    ),
    pytest.mark.timeout(120),
]
WAIT = patience(20) * 1000  # Playwright's waits, in ms
LISTEN = {"gateway": {"http": {"port": 0}}}  # the dashboard's listener: any free port
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'

if CHROMIUM is not None:
    from playwright.sync_api import Browser, Page, expect, sync_playwright


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield opened
    context.close()
    assert not errors, errors  # no script error, no CSP violation


def visit(page: Page, daemon: Daemon, hash_: str = "") -> None:
    url = daemon.request("dashboard")["url"]
    page.goto(url)
    expect(page).to_have_url(url.split("/dashboard/")[0] + "/", timeout=WAIT)  # the code left the URL
    if hash_:
        page.goto(url.split("/dashboard/")[0] + "/" + hash_)
    expect(page.locator("#connection")).to_have_text("live", timeout=WAIT)


def shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def state_of(page: Page, name: str) -> Any:
    return page.locator(f'tr[data-name="{name}"] .state')


def record_states(page: Page, name: str) -> None:
    """Have the page note every state its row of *name* shows (read with :func:`seen_states`)."""
    page.evaluate(
        """(name) => {
            window.seenStates = [];
            const note = () => {
              const badge = document.querySelector(`tr[data-name="${name}"] .state`);
              const text = badge && badge.getAttribute("data-state");
              if (text && window.seenStates.at(-1) !== text) window.seenStates.push(text);
            };
            const main = document.getElementById("main");
            new MutationObserver(note).observe(main, {subtree: true, childList: true});
            note();
        }""",
        name,
    )


@contextlib.contextmanager
def connected(
    daemon: Daemon, first: Callable[[ClientSession], Awaitable[Any]], **session_args: Any
) -> Iterator[None]:
    """A gateway client on mcp.sock that has done *first*, held until the block ends. It runs in a
    portal's loop: Playwright's own runs in this thread."""
    with anyio.from_thread.start_blocking_portal() as portal:
        leave, ready = portal.call(anyio.Event), portal.call(anyio.Event)

        async def client() -> None:
            async with gateway_session(daemon.mcp_sock, **session_args) as session:
                await first(session)
                ready.set()
                await leave.wait()

        future = portal.start_task_soon(client)
        portal.call(ready.wait)
        try:
            yield
        finally:
            portal.call(leave.set)
            future.result(timeout=patience(10))


def seen_states(page: Page) -> list[str]:
    return list(page.evaluate("window.seenStates"))


class TestServers:
    def test_restart_from_the_keyboard_shows_stopping_then_running(
        self, daemons: Callable[..., Daemon], page: Page
    ) -> None:
        stubborn = extension_settings("stubborn.py", stop_timeout=2)  # its stop lasts 2 s: seen
        daemon = daemons({"stubborn": stubborn, "echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("stubborn", "echo")
        visit(page, daemon)
        expect(state_of(page, "stubborn")).to_have_text("running", timeout=WAIT)
        shot(page, "servers")
        record_states(page, "stubborn")
        for _ in range(60):  # Tab through the page to its Restart button, as a keyboard user does
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.getAttribute('aria-label')") == "Restart stubborn":
                break
        else:
            pytest.fail("Restart stubborn is not reachable with Tab")
        page.keyboard.press("Enter")
        expect(state_of(page, "stubborn")).to_have_text("stopping", timeout=WAIT)
        expect(state_of(page, "stubborn")).to_have_text("running", timeout=WAIT)
        states = seen_states(page)
        assert states[0] == "running" and states[-1] == "running" and "stopping" in states, states
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Restart stubborn"
        assert daemon.status()["stubborn"]["restarts"] == 0  # asked for: not counted as a crash
        assert daemon.status()["echo"]["state"] == "running"

    def test_stopping_a_server_with_calls_in_flight_asks_first(
        self, daemons: Callable[..., Daemon], page: Page
    ) -> None:
        daemon = daemons({"echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("echo")
        visit(page, daemon)
        # the page is driven from this thread only: the held call runs in a portal's loop
        with anyio.from_thread.start_blocking_portal() as portal:
            future = portal.start_task_soon(_hold, daemon)
            expect(page.locator('tr[data-name="echo"] td[data-label="Calls"]')).to_have_text(
                "1", timeout=WAIT
            )
            asked: list[str] = []

            def decline(dialog: Any) -> None:
                asked.append(dialog.message)
                dialog.dismiss()

            page.once("dialog", decline)
            page.get_by_role("button", name="Stop echo").click()
            expect(page.locator("#notice")).to_have_text("", timeout=WAIT)
            assert asked and "serving 1 call" in asked[0]
            assert daemon.status()["echo"]["state"] == "running"  # declined: nothing stopped
            future.cancel()


async def _hold(daemon: Daemon) -> None:
    async with gateway_session(daemon.mcp_sock) as session:
        await session.call_tool("echo__wait", {"seconds": 30})


class TestOneServer:
    def test_a_log_line_appears_live(self, daemons: Callable[..., Daemon], page: Page) -> None:
        daemon = daemons({"echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("echo")
        visit(page, daemon, "#/ext/echo")
        log = page.locator("#logs pre")
        expect(log).to_contain_text("rich: ready", timeout=WAIT)
        daemon.call("echo", "stderr", lines=2)
        expect(log).to_contain_text("rich: stderr line 2", timeout=WAIT)
        expect(page.locator("#tools details")).to_have_count(
            len(daemon.request("tools", {"name": "echo"})["tools"])
        )
        shot(page, "server")

    def test_a_changed_tool_is_approved_and_clients_see_it_again(
        self, daemons: Callable[..., Daemon], page: Page, short_tmp: Path
    ) -> None:
        definitions = short_tmp / "shifty" / "tools.json"
        definitions.parent.mkdir()
        schema = {"type": "object", "properties": {"name": {"type": "string"}}}
        definitions.write_text(json.dumps({"greet": {"description": "Say hi.", "inputSchema": schema}}))
        shifty = extension_settings(
            "shifty.py",
            env={"SHIFTY_TOOLS": str(definitions)},
            sandbox={"read": [str(definitions.parent)]},
            tools_on_change="hold",
        )
        daemon = daemons({"fx": shifty}, state=True, settings=LISTEN)
        daemon.wait_running("fx")
        assert "fx__greet" in listed(daemon)
        definitions.write_text(
            json.dumps({"greet": {"description": "Say hi, then more.", "inputSchema": schema}})
        )
        daemon.call("fx", "announce")
        until(lambda: bool(daemon.status()["fx"]["tools_changed"]))  # the daemon lists again
        assert "fx__greet" not in listed(daemon)  # held until approved
        visit(page, daemon, "#/ext/fx")
        tool = page.locator('details[data-tool="greet"]')
        expect(tool).to_contain_text("changed: description (held)", timeout=WAIT)
        expect(tool).to_contain_text("Say hi, then more.")
        expect(tool.locator(".diff .del")).to_have_text(["- Say hi."])  # against the pinned text
        expect(tool.locator(".diff .ins")).to_have_text(["+ Say hi, then more."])
        shot(page, "changed-tool")
        tool.get_by_role("button", name="Approve greet").click()
        expect(page.locator("#notice")).to_have_text("approved: greet", timeout=WAIT)
        expect(tool).not_to_contain_text("changed", timeout=WAIT)
        assert "fx__greet" in listed(daemon)

    def test_server_text_is_shown_as_text(
        self, daemons: Callable[..., Daemon], page: Page, short_tmp: Path
    ) -> None:
        definitions = short_tmp / "shifty" / "tools.json"
        definitions.parent.mkdir()
        definitions.write_text(json.dumps({"greet": {"title": HOSTILE, "description": HOSTILE}}))
        shifty = extension_settings(
            "shifty.py", env={"SHIFTY_TOOLS": str(definitions)}, sandbox={"read": [str(definitions.parent)]}
        )
        daemon = daemons({"fx": shifty}, settings=LISTEN)
        daemon.wait_running("fx")
        visit(page, daemon, "#/ext/fx")
        tool = page.locator('details[data-tool="greet"]')
        tool.locator("summary").click()
        expect(tool.locator(".tool-description")).to_have_text(HOSTILE, timeout=WAIT)
        expect(tool.locator("summary")).to_contain_text(HOSTILE)
        assert page.evaluate("window.pwned") is None
        assert page.locator("#main img, #main script").count() == 0


class TestInstances:
    def test_a_per_client_server_lists_each_client_s_instance(
        self, daemons: Callable[..., Daemon], page: Page
    ) -> None:
        echo = extension_settings("rich.py", instances="per-client")
        daemon = daemons({"echo": echo}, settings=LISTEN)
        visit(page, daemon, "#/ext/echo")
        with connected(daemon, lambda session: session.call_tool("echo__echo", {"text": "mine"})):
            rows = page.locator("#summary tbody tr")
            expect(rows).to_have_count(1, timeout=WAIT)
            expect(rows.first.locator('td[data-label="State"]')).to_have_text("running")


class TestRemote:
    def test_log_in_from_the_page(self, daemons: Callable[..., Daemon], page: Page) -> None:
        """A remote server waiting for its login: Log in opens the authorization page (the
        fixture consents at once and sends the browser to the daemon's loopback receiver)."""
        server = Protected()
        try:
            daemon = daemons({"far": server.entry()}, state=True, settings=LISTEN)
            daemon.wait_state("far", "needs-login")
            visit(page, daemon, "#/ext/far")
            badge = page.locator("#summary .state")
            expect(badge).to_have_text("needs-login", timeout=WAIT)
            expect(page.locator("#summary")).to_contain_text(server.url)
            with page.context.expect_page(timeout=WAIT) as opened:
                page.get_by_role("button", name="Log in").click()
            opened.value.wait_for_load_state()
            expect(badge).to_have_text("running", timeout=WAIT)
            expect(page.locator("#summary")).to_contain_text("logged in")
            opened.value.close()
        finally:
            server.kill()


def listed(daemon: Daemon) -> list[str]:
    """The tool names a gateway client lists now."""

    async def names() -> list[str]:
        async with gateway_session(daemon.mcp_sock) as session:
            return [tool.name for tool in (await session.list_tools()).tools]

    with anyio.from_thread.start_blocking_portal() as portal:  # Playwright's loop runs in this thread
        return portal.call(names)


class TestClients:
    def test_a_connected_client_is_listed_with_its_name_and_protocol(
        self, daemons: Callable[..., Daemon], page: Page
    ) -> None:
        daemon = daemons({"echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("echo")
        visit(page, daemon, "#/clients")
        expect(page.locator("main")).to_contain_text("No client is connected.", timeout=WAIT)
        info = types.Implementation(name="<b>editor</b>", version="9.9")
        with connected(daemon, lambda session: session.list_tools(), client_info=info):
            row = page.locator("tbody tr")
            expect(row).to_have_count(1, timeout=WAIT)
            expect(row.locator('td[data-label="Client"]')).to_have_text("<b>editor</b>")
            expect(row.locator('td[data-label="Transport"]')).to_have_text("mcp.sock")
            expect(row.locator('td[data-label="Protocol"]')).to_have_text("2025-11-25")
            expect(row.locator('td[data-label="Profile"]')).to_have_text("(all)")
            shot(page, "clients")
        expect(page.locator("main")).to_contain_text("No client is connected.", timeout=WAIT)


class TestDaemon:
    def test_a_broken_config_is_shown_with_its_field_and_nothing_changes(
        self, daemons: Callable[..., Daemon], page: Page
    ) -> None:
        daemon = daemons({"echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("echo")
        visit(page, daemon, "#/daemon")
        expect(page.get_by_role("button", name="Reload the config")).to_be_visible(timeout=WAIT)
        broken = {"socket": daemon.socket, **LISTEN, "extensions": {"echo": {"command": 5}}}
        daemon.config.write_text(json.dumps(broken, indent=2))  # "command" on line 10
        page.get_by_role("button", name="Reload the config").click()
        alert = page.get_by_role("alert")
        expect(alert).to_contain_text("extensions.echo.command", timeout=WAIT)
        expect(alert).to_contain_text("line 10")
        shot(page, "daemon-broken-config")

    def test_calls_show_in_the_chart(self, daemons: Callable[..., Daemon], page: Page) -> None:
        daemon = daemons({"echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("echo")
        for _ in range(20):
            daemon.call("echo", "echo", text="hi")
        visit(page, daemon, "#/daemon")
        row = page.locator('table.calls tr[data-name="echo"]')
        expect(row.locator('td[data-label="Calls"]')).to_have_text("20", timeout=WAIT)
        expect(row.locator('td[data-label="p99"]')).to_contain_text("ms")
        expect(row.locator("svg polyline.spark-calls")).to_have_count(1)
        assert "calls a second" in (row.locator("svg").get_attribute("aria-label") or "")
        shot(page, "daemon")
        assert daemon.status()["echo"]["state"] == "running" and daemon.status()["echo"]["restarts"] == 0


class TestUsable:
    def test_a_phone_sized_screen_and_the_dark_preference(
        self, daemons: Callable[..., Daemon], browser: Browser
    ) -> None:
        """320 px wide is also what 1280 px shows at 400% zoom: nothing may need a sideways scroll."""
        daemon = daemons({"echo": extension_settings("rich.py")}, settings=LISTEN)
        daemon.wait_running("echo")
        context = browser.new_context(viewport={"width": 320, "height": 640}, color_scheme="dark")
        try:
            small = context.new_page()
            visit(small, daemon)
            expect(state_of(small, "echo")).to_have_text("running", timeout=WAIT)
            assert small.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            background = small.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(13, 17, 23)", background  # the dark palette
            shot(small, "servers-phone-dark")
        finally:
            context.close()
