"""Tests of the dashboard: its access rules over plain HTTP, its pages in a real browser."""

from __future__ import annotations

from typing import Any

import httpx2

from tests.harness.daemon import Daemon


def session(daemon: Daemon, **params: Any) -> tuple[str, httpx2.Client]:
    """The listener's base URL, and a client holding a fresh dashboard session's cookie."""
    url = daemon.request("dashboard", params)["url"]
    base = url.split("/dashboard/")[0]
    client = httpx2.Client(timeout=10)
    answer = client.get(url, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return base, client


def call(client: httpx2.Client, base: str, method: str, **params: Any) -> dict[str, Any]:
    """One control method from the dashboard's endpoint, as its page sends it; the JSON-RPC reply."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = client.post(base + "/dashboard/rpc", json=body, headers={"Origin": base})
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]
