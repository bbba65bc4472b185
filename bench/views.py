"""Client views over 1,000 tools: listing per view, and search mode, against baselines in the same run.

Eight fixture servers (``tests/servers/many.py``: the tool bank's four groups, twice) give the
daemon 1,008 realistic tools. Through ``mcp.sock`` with the SDK's ClientSession:

  list_all      ``tools/list`` with no profile (1,008 tools), median latency and response bytes
  list_profile  the same in a profile of two servers (``dev`` and ``data``, 216 tools)
  list_search   the same in a ``mode: search`` profile (3 meta-tools)
  search_call   ``search_tools`` through the gateway (ranked in the daemon), against
                ``direct_call`` (one bank tool called by name: a round trip to its server)

In process, on the same 1,008 documents: the BM25 index build, and a query against a baseline
linear scan (each query word as a substring of every name and description, counted). Prints JSON.

    python bench/views.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from _daemon import ROOT, daemon, fixture, wait_for

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import toolbank

from supervisor.gateway.view.search import Index
from tests.harness.gateway_client import gateway_session

GROUPS = ("dev", "cloud", "office", "data")
PROFILES = {
    "two": {"extensions": ["dev", "data"], "max_tools": 1000},
    "finder": {"mode": "search"},
}


def _extensions() -> dict[str, Any]:
    out = {}
    for group in GROUPS:
        out[group] = fixture("many.py", args=[str(ROOT / "tests/servers/many.py"), group])
        out[f"{group}2"] = fixture(
            "many.py", args=[str(ROOT / "tests/servers/many.py"), group, "--copy", "2"]
        )
    return out


def _documents() -> list[tuple[str, str]]:
    docs = []
    for suffix, copy in (("", ""), ("2", "_2")):
        for tool in toolbank.tools():
            group = toolbank.group_of(tool["name"].split("_")[0])
            docs.append((f"{group}{suffix}__{tool['name']}{copy}", tool["description"]))
    return docs


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def _substring_scan(docs: list[tuple[str, str]], query: str, limit: int) -> list[int]:
    """The baseline: every query word looked for in every lower-cased name and description."""
    words = query.lower().split()
    scored = []
    for position, (name, description) in enumerate(docs):
        text = f"{name} {description}".lower()
        hits = sum(word in text for word in words)
        if hits:
            scored.append((-hits, name, position))
    scored.sort()
    return [position for _, _, position in scored[:limit]]


def in_process(rounds: int) -> dict[str, Any]:
    docs = _documents()
    builds = []
    for _ in range(5):
        start = time.perf_counter()
        index = Index(docs)
        builds.append(time.perf_counter() - start)
    queries = [query for query, _ in toolbank.QUERIES]
    bm25, scan = [], []
    for _ in range(rounds):
        for query in queries:
            start = time.perf_counter()
            index.search(query, 10)
            bm25.append(time.perf_counter() - start)
            start = time.perf_counter()
            _substring_scan(docs, query, 10)
            scan.append(time.perf_counter() - start)
    return {
        "documents": len(docs),
        "index_build_ms": _median_ms(builds),
        "query_ms": {"median": _median_ms(bm25), "max": round(max(bm25) * 1000, 3)},
        "substring_scan_ms": {"median": _median_ms(scan), "max": round(max(scan) * 1000, 3)},
        "query_vs_scan": round(statistics.median(bm25) / statistics.median(scan), 3),
    }


async def _timed(rounds: int, call: Any) -> tuple[list[float], Any]:
    samples, result = [], None
    await call()  # warm-up: the projection and the index are built on first use
    for _ in range(rounds):
        start = time.perf_counter()
        result = await call()
        samples.append(time.perf_counter() - start)
    return samples, result


async def through_gateway(path: str, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, profile in (("list_all", None), ("list_profile", "two"), ("list_search", "finder")):
        async with gateway_session(path, profile=profile) as session:
            samples, result = await _timed(rounds, session.list_tools)
        size = len(json.dumps(result.model_dump(by_alias=True, exclude_none=True, mode="json")))
        out[label] = {"tools": len(result.tools), "median_ms": _median_ms(samples), "bytes": size}
    async with gateway_session(path, profile="finder") as session:
        query = {"query": "scale the web deployment to 5 replicas", "limit": 5}
        searched, _ = await _timed(rounds, lambda: session.call_tool("search_tools", query))
    async with gateway_session(path) as session:
        await session.list_tools()  # the client validates results against the listed schemas
        scale = "cloud__kubernetes_scale_deployment"
        direct, _ = await _timed(rounds, lambda: session.call_tool(scale, {"id": "w"}))
    out["search_call"] = {"median_ms": _median_ms(searched)}
    out["direct_call"] = {"median_ms": _median_ms(direct)}
    base = out["list_all"]
    for label in ("list_profile", "list_search"):
        out[label]["latency_vs_list_all"] = round(out[label]["median_ms"] / base["median_ms"], 3)
        out[label]["bytes_vs_list_all"] = round(out[label]["bytes"] / base["bytes"], 4)
    out["search_call"]["vs_direct_call"] = round(
        out["search_call"]["median_ms"] / out["direct_call"]["median_ms"], 3
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    report: dict[str, Any] = {"in_process": in_process(args.rounds)}
    extensions = _extensions()
    with daemon(extensions, profiles=PROFILES) as running:
        wait_for(lambda: running.all_running(list(extensions)), "the extensions", within=120)
        path = str(Path(running.socket).parent / "mcp.sock")
        report["gateway"] = anyio.run(through_gateway, path, args.rounds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
