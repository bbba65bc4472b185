"""The HTTP gateway serves the daemon's user alone, and none of its own extensions (issue 32, §3).

Every extension could reach the listener on loopback (`network: all`, or `outbound`'s TCP
connect) and call every other extension's tools through it, a `sandbox: false` one's included:
the gateway as their deputy. The kernel names a loopback peer's socket (its owner's uid, its
inode): a connection held by a process of the daemon's trees is refused, with the token or
without, unless the extension's sandbox says `gateway: true`; one of another user is refused.
The token is always there: the config's, else one made once in the state directory.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from mcp import Client

from tests.harness import CLI, RICH, Daemon, extension_settings, first_text, zygote
from tests.harness.timing import patience
from tests.process.sandbox.test_sandbox import attempt

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _hostile(**sandbox: Any) -> dict[str, Any]:
    return extension_settings("hostile.py", sandbox=sandbox or True)


class TestExtensionsAreNoCallers:
    async def test_an_extension_is_refused_even_with_the_token_and_an_honest_client_is_served(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        http = http_gateway(
            {
                "confined": _hostile(),
                "outbound": _hostile(network="outbound"),
                "free": extension_settings("hostile.py", sandbox=False),
                "allowed": _hostile(gateway=True),
                "rich": RICH,
            }
        )
        http.wait_running("confined", "outbound", "free", "allowed", "rich")
        target = f"{http.url}/mcp {http.token}"  # as if it had read the token somewhere
        async with Client(http.mcp(), mode="legacy") as honest:  # a client of the user's, served throughout
            for name in ("confined", "outbound", "free"):
                for kind in ("http_post", "http_post_from_child"):
                    done = attempt(http, name, kind, target)
                    assert done.startswith("refused") and "HTTP 403" in done, (name, kind, done)
                    assert "own extension" in done, done
                assert first_text(await honest.call_tool("rich__echo", {"text": name})) == name
            assert attempt(http, "allowed", "http_post", target) == "ok"
            assert attempt(http, "allowed", "http_post_from_child", target) == "ok"
        refused = http.find("gateway.http_caller_refused")
        assert refused and "confined" in refused[0]["reason"], refused

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
    def test_another_users_connection_is_refused_before_its_request_is_read(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        http = http_gateway({})
        code = (
            "import sys, urllib.request, urllib.error\n"
            "headers = {'Authorization': 'Bearer ' + sys.argv[2]}\n"
            "request = urllib.request.Request(sys.argv[1], headers=headers)\n"
            "try:\n    print(urllib.request.urlopen(request, timeout=10).status)\n"
            "except urllib.error.HTTPError as exc:\n    print(exc.code, exc.read().decode())\n"
        )
        nobody = subprocess.run(
            ["/usr/bin/python3", "-I", "-c", code, http.url + "/metrics", http.token],
            capture_output=True,
            text=True,
            timeout=30,
            user=65534,
            group=65534,
            extra_groups=[],
            check=True,
        )
        assert nobody.stdout.startswith("403") and "another user (uid 65534)" in nobody.stdout
        assert http.get("/metrics").status_code == 200  # the daemon's user: served


class TestTheToken:
    def test_one_is_made_once_kept_private_and_printed_for_clients(
        self, daemons: Callable[..., Daemon]
    ) -> None:
        daemon = daemons({}, http={"token": None}, state=True, end="exit 0")
        path = daemon.state / "http-token"
        token = path.read_text().strip()
        assert len(token) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert token not in daemon.log.read_text()  # where it is, never what
        assert httpx2.get(daemon.url + "/metrics", timeout=10).status_code == 401
        assert daemon.get("/metrics").status_code == 200
        config = json.loads(daemon.config.read_text())
        config["gateway"]["http"]["port"] = daemon.port  # as a user's config names it
        daemon.config.write_text(json.dumps(config))
        printed = zygote.run(
            [*CLI, "client-config", "--client", "cursor", "--http", "-c", str(daemon.config)],
            timeout=patience(30),
            env=daemon.env,
        )
        assert printed.returncode == 0, printed.stderr
        entry = json.loads(printed.stdout)["mcpServers"]["supervisor"]
        assert entry == {"url": f"{daemon.url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
        assert daemon.terminate() == 0
        daemon.start()
        assert path.read_text().strip() == token  # a restart keeps it: clients keep working
        assert daemon.get("/metrics").status_code == 200
