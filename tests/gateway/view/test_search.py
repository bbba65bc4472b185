"""The search ranking (pure) and the views' projections of a catalog (pure): no daemon needed."""

from __future__ import annotations

import random
import sys
import time
from types import SimpleNamespace

import mcp_types as types
import pytest

from supervisor.gateway import catalog as catalogs
from supervisor.gateway.view.profiles import EVERYTHING, META_TOOLS, View, Views, hidden_reason
from supervisor.gateway.view.search import Index, stem, tokenize
from supervisor.upstream.listing import Listing
from tests.harness import SERVERS

sys.path.insert(0, str(SERVERS))
import toolbank  # a fixture data module beside the servers


def bank_documents(copies: int = 1) -> list[tuple[str, str]]:
    """The bank as the gateway exposes it: GROUP__NAME (a second copy: GROUP2__NAME_2)."""
    docs = []
    for copy in range(copies):
        for tool in toolbank.tools():
            group = toolbank.group_of(tool["name"].split("_")[0]) + (str(copy + 1) if copy else "")
            docs.append((f"{group}__{tool['name']}", tool["description"]))
    return docs


class TestTokens:
    def test_names_split_on_separators_and_case(self) -> None:
        assert tokenize("github__createPullRequest") == ["github", "creat", "pull", "request"]
        assert tokenize("s3_list-HTTPBuckets2") == ["3", "s3", "list", "http", "bucket", "2", "httpbuckets2"]
        assert "k8s" in tokenize("scale k8s pods") and "ec2" in tokenize("an EC2 instance")

    def test_word_forms_meet(self) -> None:
        assert stem("files") == stem("file")
        assert stem("deleting") == stem("deleted") == stem("delete") == stem("deletes")
        assert stem("repositories") == stem("repository")
        assert stem("stopped") == stem("stop")

    def test_stop_words_are_dropped(self) -> None:
        assert tokenize("what is on the calendar for me") == ["calendar"]


class TestIndex:
    def test_ranked_by_name_and_description_ties_by_name(self) -> None:
        index = Index(
            [
                ("b__send_message", "Send a message to a channel."),
                ("a__send_message", "Send a message to a channel."),
                ("c__delete_file", "Delete a file; mentions a message once."),
            ]
        )
        ranked = [index.names[doc] for doc, _ in index.search("send message", 3)]
        assert ranked == ["a__send_message", "b__send_message", "c__delete_file"]

    def test_nothing_matches_nothing(self) -> None:
        index = Index([("a__x", "an x")])
        assert index.search("zebra", 5) == [] and index.search("", 5) == []
        assert Index([]).search("x", 5) == []

    def test_an_action_synonym_counts_less_than_the_word_itself(self) -> None:
        index = Index([("fs__remove_file", "Remove a file."), ("fs__delete_file", "Delete a file.")])
        assert [index.names[d] for d, _ in index.search("remove file", 2)] == [
            "fs__remove_file",
            "fs__delete_file",
        ]
        assert [index.names[d] for d, _ in index.search("erase a file", 1)] == ["fs__delete_file"]

    def test_deterministic_whatever_the_input_order(self) -> None:
        docs = bank_documents()
        shuffled = docs[:]
        random.Random(7).shuffle(shuffled)
        one, two = Index(docs), Index(shuffled)
        for query, _ in toolbank.QUERIES:
            assert [one.names[d] for d, _ in one.search(query, 5)] == [
                two.names[d] for d, _ in two.search(query, 5)
            ]

    def test_hit_rate_on_the_bank(self) -> None:
        """The same floors as the end-to-end test, on the pure index (quick to iterate on)."""
        index = Index(bank_documents())
        ranked = {
            q: [index.names[d].partition("__")[2] for d, _ in index.search(q, 5)] for q, _ in toolbank.QUERIES
        }
        at_1 = sum(ranked[q][:1] == [want] for q, want in toolbank.QUERIES) / len(toolbank.QUERIES)
        at_5 = sum(want in ranked[q] for q, want in toolbank.QUERIES) / len(toolbank.QUERIES)
        assert at_1 >= 0.65 and at_5 >= 0.85, (at_1, at_5)

    def test_a_query_over_1000_tools_takes_under_5_ms(self) -> None:
        """The bound of the issue, with a wide margin: the slowest of the queries, best of 3 rounds."""
        index = Index(bank_documents(copies=2))
        assert len(index) == 1008
        slowest = 0.0
        for query, _ in toolbank.QUERIES:
            best = min(_timed(index, query) for _ in range(3))
            slowest = max(slowest, best)
        assert slowest < 0.005, f"slowest query {slowest * 1000:.2f} ms"


def _timed(index: Index, query: str) -> float:
    start = time.perf_counter()
    index.search(query, 10)
    return time.perf_counter() - start


def _listing(*names: str) -> Listing:
    tools = tuple(
        types.Tool(name=n, description=f"The {n} tool.", input_schema={"type": "object"}) for n in names
    )
    prompts = (types.Prompt(name="greet"),)
    resources = (types.Resource(uri="note://a", name="a"),)
    return Listing(tools=tools, prompts=prompts, resources=resources)


def _catalog() -> catalogs.Catalog:
    return catalogs.build(
        [
            catalogs.Source("fs", "fs", ["*"], ["rm*"], _listing("read_file", "write_file", "rm_file")),
            catalogs.Source("git", "git", ["*"], [], _listing("log", "push")),
        ]
    )


def _profile(**fields: object) -> SimpleNamespace:
    defaults = {
        "extensions": None,
        "tools": SimpleNamespace(allow=["*"], deny=[]),
        "mode": "list",
        "max_tools": 128,
    }
    return SimpleNamespace(**{**defaults, **fields})


class TestProjections:
    def test_the_default_view_is_the_catalog(self) -> None:
        catalog = _catalog()
        projection = Views().project(catalog, EVERYTHING)
        assert projection.tools is catalog.tools and projection.listed is catalog.tools

    def test_a_profile_filters_by_extension_and_by_own_or_exposed_name(self) -> None:
        catalog = _catalog()
        views = Views(
            {
                "git": _profile(extensions=["git"]),
                "reads": _profile(tools=SimpleNamespace(allow=["read_*", "git__*"], deny=["push"])),
            }
        )
        git = views.project(catalog, views.of(SimpleNamespace(scope={"mcp_supervisor.profile": "git"})))
        assert [t.name for t in git.tools] == ["git__log", "git__push"]
        assert [p.name for p in git.prompts] == ["git__greet"]
        assert [r.uri for r in git.resources] == ["mcp-supervisor://git/note://a"]
        reads = views.project(catalog, views.get("reads"))  # type: ignore[arg-type]
        assert [t.name for t in reads.tools] == ["fs__read_file", "git__log"]

    def test_search_mode_lists_the_meta_tools(self) -> None:
        views = Views({"s": _profile(mode="search")})
        projection = views.project(_catalog(), views.get("s"))  # type: ignore[arg-type]
        assert projection.listed == META_TOOLS and len(projection.tools) == 4
        assert projection.search("push", 1)[0][0].name == "git__push"

    def test_projections_are_cached_per_catalog_and_profile_change(self) -> None:
        catalog = _catalog()
        views = Views({"s": _profile(mode="search")})
        first = views.project(catalog, views.get("s"))  # type: ignore[arg-type]
        assert views.project(catalog, views.get("s")) is first  # type: ignore[arg-type]
        assert not views.configure({"s": _profile(mode="search")})  # the same: nothing changes
        assert views.configure({"s": _profile(mode="list")})
        assert views.project(catalog, views.get("s")) is not first  # type: ignore[arg-type]
        newer = _catalog()
        assert views.project(newer, views.get("s")).tools == newer.tools  # type: ignore[arg-type]

    def test_hidden_reasons_name_the_filter(self) -> None:
        catalog = _catalog()
        reason = hidden_reason(catalog, EVERYTHING, "fs__rm_file", 64)
        assert reason is not None and "tools filter (allow ['*'], deny ['rm*'])" in reason
        assert hidden_reason(catalog, EVERYTHING, "fs__nothing", 64) is None
        view = View("git", frozenset({"git"}))
        assert "extension 'fs' is not in profile 'git'" in (
            hidden_reason(catalog, view, "fs__read_file", 64) or ""
        )
        gone = Views().of(SimpleNamespace(scope={"mcp_supervisor.profile": "old"}))
        assert gone.removed and "no longer configured" in (hidden_reason(catalog, gone, "git__log", 64) or "")


@pytest.mark.parametrize("limit", [1, 5, 50])
def test_search_limit_is_honoured(limit: int) -> None:
    index = Index(bank_documents())
    assert len(index.search("list all the things in github", limit)) <= limit
