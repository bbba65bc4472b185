"""The name table: exposed names are safe, stable, unique and reversible, whatever the inputs."""

from __future__ import annotations

import random

import pytest

from supervisor.gateway.names import NAME_PATTERN, NameTable, expose, expose_uri, parse_uri

NASTY = [
    "echo",
    "read.file",
    "a" * 200,
    "ünïcode tool",
    "slash/and:colon",
    "",
    "-",
    "x" * 63,
    "tab\tand\nnewline",
    "\ud800lone",
]


class TestExpose:
    @pytest.mark.parametrize("name", NASTY)
    @pytest.mark.parametrize("budget", [16, 40, 64])
    def test_every_name_matches_the_pattern_within_budget(self, name: str, budget: int) -> None:
        """Whatever a server calls its tool, the exposed name is one every client accepts."""
        exposed = expose("ext", name, budget)
        assert NAME_PATTERN.match(exposed), exposed
        assert len(exposed) <= budget

    def test_short_names_are_prefix_double_underscore_name(self) -> None:
        assert expose("fs", "read_file") == "fs__read_file"
        assert expose("fs", "read.file") == "fs__read_file"

    def test_long_names_keep_a_readable_start_and_a_stable_suffix(self) -> None:
        """An over-long name keeps its start; the suffix is the same in every run."""
        long = "get_the_weather_forecast_for_a_given_city_and_date_in_detail_please"
        exposed = expose("weather", long, 64)
        assert exposed.startswith("weather__get_the_weather_forecast")
        assert exposed == expose("weather", long, 64)
        assert exposed != expose("weather", long + "_v2", 64)  # different originals, different tags


class TestNameTable:
    def test_same_names_in_any_input_order(self) -> None:
        """Start order (which server lists first) never changes a name."""
        entries = [("a", "a", f"tool{i}") for i in range(20)] + [("b", "b", "tool1"), ("a_b", "a.b", "t")]
        names = NameTable.build(entries)
        for _ in range(10):
            random.shuffle(entries)
            shuffled = NameTable.build(entries)
            assert all(shuffled.exposed(e, o) == names.exposed(e, o) for e, _, o in entries)

    def test_collisions_are_resolved_reported_and_never_fatal(self) -> None:
        """Two extensions with one prefix: both tools stay reachable, the collision is recorded."""
        table = NameTable.build([("first", "p", "echo"), ("second", "p", "echo")])
        assert table.exposed("first", "echo") == "p__echo"  # sorts first, keeps the plain name
        other = table.exposed("second", "echo")
        assert other != "p__echo" and NAME_PATTERN.match(other)
        assert table.resolve(other) == ("second", "echo")
        [collision] = table.collisions
        assert collision.loser == ("second", "echo") and collision.given == other
        assert "second/echo" in collision.describe()

    def test_sanitising_collisions_are_resolved_too(self) -> None:
        table = NameTable.build([("e", "e", "a.b"), ("e", "e", "a_b"), ("e", "e", "a b")])
        exposed = {table.exposed("e", o) for o in ("a.b", "a_b", "a b")}
        assert len(exposed) == 3 and len(table.collisions) == 2

    def test_truncation_collisions_are_resolved_at_any_budget(self) -> None:
        """Many long names sharing a 60-character start all get distinct names within 16 chars."""
        entries = [("ext", "ext", "x" * 60 + str(i)) for i in range(500)]
        table = NameTable.build(entries, budget=16)
        exposed = [table.exposed(e, o) for e, _, o in entries]
        assert len(set(exposed)) == 500
        assert all(name is not None and NAME_PATTERN.match(name) and len(name) <= 16 for name in exposed)
        assert all(table.resolve(name) == (e, o) for name, (e, _, o) in zip(exposed, entries, strict=True))

    def test_unknown_names_resolve_to_nothing(self) -> None:
        table = NameTable.build([("e", "e", "x")])
        assert table.resolve("e__y") is None and table.exposed("e", "y") is None


class TestUris:
    @pytest.mark.parametrize(
        "uri", ["file:///etc/hosts", "note://abc", "file:///{path}", "https://x/y?z=1#f", "weird"]
    )
    def test_round_trip(self, uri: str) -> None:
        exposed = expose_uri("notes", uri)
        assert parse_uri(exposed) == ("notes", uri)

    @pytest.mark.parametrize(
        "uri", ["file:///x", "mcp-supervisor://", "mcp-supervisor://ext", "mcp-supervisor:///x"]
    )
    def test_foreign_uris_are_not_ours(self, uri: str) -> None:
        assert parse_uri(uri) is None

    def test_templates_stay_templates(self) -> None:
        assert expose_uri("fs", "file:///{path}") == "mcp-supervisor://fs/file:///{path}"
