"""Media hidden in structured output: found anywhere in a result, spooled once, kept schema-valid."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.upstream import media
from supervisor.upstream.spool import Spool, SpoolStats

LIMIT = 1000


def b64(size: int, fill: int = 7) -> str:
    return base64.b64encode(bytes([fill]) * size).decode()


def result(content: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"content": content, **extra}}


def path_of(uri: str) -> Path:
    assert uri.startswith("file:///"), uri
    return Path(uri.removeprefix("file://"))


def strict(properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema as zod and pydantic write them: every key required, no others allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


class Tool:
    def __init__(self, name: str, output_schema: dict[str, Any] | None) -> None:
        self.name, self.output_schema = name, output_schema


IMAGE_ITEM = strict({"type": {"const": "image"}, "data": {"type": "string"}, "mimeType": {"type": "string"}})
ITEMS_SCHEMA = strict({"content": {"type": "array", "items": IMAGE_ITEM}})
BASE64_ONLY = strict(
    {
        "shot": strict(
            {"data": {"type": "string", "pattern": "^[A-Za-z0-9+/]*={0,2}$"}, "mimeType": {"type": "string"}}
        )
    }
)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(
        tmp_path / "spool", instance="abc", max_inline_bytes=LIMIT, max_total_bytes=100 * LIMIT, min_age=0
    )


def validate(schema: dict[str, Any], instance: Any) -> None:
    """What the SDK's ClientSession does with a tool result's structured content."""
    from jsonschema.validators import validator_for
    from referencing import Registry

    validator_for(schema)(schema, registry=Registry()).validate(instance)


class TestWhatIsMedia:
    @pytest.mark.parametrize(
        "node",
        [
            {"type": "image", "data": "x", "mimeType": "image/png"},
            {"type": "audio", "data": "x"},
            {"data": "x", "mimeType": "image/png"},
            {"data": "x", "mimeType": "application/pdf"},
            {"data": "x", "mimeType": "video/mp4; codecs=avc1"},
            {"blob": "x"},
            {"uri": "mem://a", "blob": "x", "mimeType": "text/plain"},
        ],
    )
    def test_marked_base64_is_media(self, node: dict[str, Any]) -> None:
        """data beside type image/audio or a binary mimeType, and any blob, are media."""
        assert media.media_field(node) is not None

    @pytest.mark.parametrize(
        "node",
        [
            {"data": "x"},
            {"data": "x", "mimeType": "application/json"},
            {"data": "x", "mimeType": "application/ld+json"},
            {"data": "x", "mimeType": "text/csv"},
            {"type": "text", "text": "x"},
            {"log": "x", "mimeType": "image/png"},
            {"data": 3, "mimeType": "image/png"},
        ],
    )
    def test_unmarked_or_textual_strings_are_not(self, node: dict[str, Any]) -> None:
        """A string with no marker, or one marked as text, is never taken for base64."""
        assert media.media_field(node) is None


class TestRewrite:
    def test_the_same_payload_in_content_and_structured_is_one_file(self, spool: Spool) -> None:
        """A content image and its copy nested in structuredContent share a file; the copy keeps its keys."""
        data = b64(LIMIT + 1)
        item = {"type": "image", "data": data, "mimeType": "image/png"}
        message = result([dict(item)], structuredContent={"content": [dict(item)]})
        assert spool.rewrite(message, "fx") == 2
        link = message["result"]["content"][0]
        nested = message["result"]["structuredContent"]["content"][0]
        assert link["type"] == "resource_link" and nested == {**item, "data": link["uri"]}
        assert spool.stats() == SpoolStats(1, LIMIT + 1)
        assert path_of(link["uri"]).read_bytes() == base64.b64decode(data)
        validate(ITEMS_SCHEMA, message["result"]["structuredContent"])

    def test_fields_blobs_and_meta_at_any_depth(self, spool: Spool) -> None:
        """data+mimeType objects, blobs and _meta payloads are replaced wherever they sit, in place."""
        shot, blob = b64(2 * LIMIT, 1), b64(2 * LIMIT, 2)
        structured = {"a": [{"b": {"shot": {"data": shot, "mimeType": "image/png"}}}], "file": {"blob": blob}}
        message = result(
            [{"type": "text", "text": "hi"}], structuredContent=structured, _meta={"x": {"blob": blob}}
        )
        assert spool.rewrite(message, "fx") == 3
        out = message["result"]
        uri = out["structuredContent"]["a"][0]["b"]["shot"]["data"]
        assert path_of(uri).read_bytes() == bytes([1]) * 2 * LIMIT
        assert out["structuredContent"]["file"]["blob"] == out["_meta"]["x"]["blob"] != uri
        assert spool.stats().files == 2

    def test_small_payloads_and_unmarked_strings_stay(self, spool: Spool) -> None:
        """Payloads within the limit, long text and base64 without a marker are left as they are."""
        structured = {
            "small": {"data": b64(LIMIT), "mimeType": "image/png"},
            "log": "A" * 10 * LIMIT,
            "digest": b64(5 * LIMIT),
            "json": {"data": b64(5 * LIMIT), "mimeType": "application/json"},
        }
        before = json.dumps(structured)
        message = result([], structuredContent=structured)
        assert spool.rewrite(message, "fx") == 0
        assert json.dumps(message["result"]["structuredContent"]) == before and spool.stats().files == 0

    def test_a_json_text_item_follows_the_structured_content(self, spool: Spool) -> None:
        """The spec's text copy of structuredContent is rewritten too, to the same file."""
        structured = {"shot": {"data": b64(2 * LIMIT), "mimeType": "image/png"}}
        text = {"type": "text", "text": json.dumps(structured, indent=2)}
        message = result([text, {"type": "image", "data": b64(2 * LIMIT), "mimeType": "image/png"}])
        message["result"]["structuredContent"] = json.loads(text["text"])
        assert spool.rewrite(message, "fx") == 3
        out = message["result"]
        assert json.loads(out["content"][0]["text"]) == out["structuredContent"]
        assert out["structuredContent"]["shot"]["data"] == out["content"][1]["uri"]
        assert "\n" in out["content"][0]["text"] and spool.stats().files == 1

    def test_text_that_is_not_json_stays(self, spool: Spool) -> None:
        """A long text that merely starts like JSON is left alone."""
        text = "{" + b64(2 * LIMIT)
        message = result([{"type": "text", "text": text}])
        assert spool.rewrite(message, "fx") == 0 and message["result"]["content"][0]["text"] == text

    def test_a_result_with_only_structured_content(self, spool: Spool) -> None:
        """A result without a content list is still a tool result."""
        message = {"id": 1, "result": {"structuredContent": {"blob": b64(2 * LIMIT)}}}
        assert spool.rewrite(message, "fx") == 1
        assert message["result"]["structuredContent"]["blob"].startswith("file:///")

    def test_resource_contents_are_not_tool_results(self, spool: Spool) -> None:
        """A resources/read answer (contents, not content) is untouched: the client asked for the bytes."""
        message = {"id": 1, "result": {"contents": [{"uri": "mem://a", "blob": b64(2 * LIMIT)}]}}
        assert spool.rewrite(message, "fx") == 0


class TestSchemas:
    def test_a_schema_that_wants_base64_keeps_the_payload_inline(self, spool: Spool) -> None:
        """If the tool's schema accepts the original but not the URI, structuredContent stays as sent."""
        schemas = media.OutputSchemas()
        schemas.follow(lambda: (Tool("shot", BASE64_ONLY),))
        data = b64(2 * LIMIT)
        structured = {"shot": {"data": data, "mimeType": "image/png"}}
        message = result(
            [{"type": "image", "data": data, "mimeType": "image/png"}], structuredContent=structured
        )
        with capture_logs() as logs:
            assert spool.rewrite(message, "fx", schemas=schemas) == 1
        assert message["result"]["structuredContent"]["shot"]["data"] == data
        validate(BASE64_ONLY, message["result"]["structuredContent"])
        assert message["result"]["content"][0]["type"] == "resource_link"  # the content item still moves
        assert [e["event"] for e in logs] == ["spool.kept_inline"] and "$.shot.data" in logs[0]["reason"]
        assert spool.stats().files == 1

    def test_an_undone_payload_leaves_no_file(self, spool: Spool) -> None:
        """A payload only in structuredContent, put back for the schema, leaves no file and no quota used."""
        schemas = media.OutputSchemas()
        schemas.follow(lambda: (Tool("shot", BASE64_ONLY),))
        message = result([], structuredContent={"shot": {"data": b64(2 * LIMIT), "mimeType": "image/png"}})
        assert spool.rewrite(message, "fx", schemas=schemas) == 0
        assert spool.stats() == SpoolStats(0, 0) and not [p for p in spool.run_dir.rglob("*") if p.is_file()]

    def test_the_answering_tool_is_known_by_the_request_id(self, spool: Spool) -> None:
        """Only the called tool's schema counts; for an unknown id every schema of the extension does."""
        schemas = media.OutputSchemas()
        lenient = strict({"shot": strict({"data": {"type": "string"}, "mimeType": {"type": "string"}})})
        schemas.follow(lambda: (Tool("lenient", lenient), Tool("base64", BASE64_ONLY), Tool("plain", None)))

        def answer(request_id: int) -> dict[str, Any]:
            shot = {"data": b64(2 * LIMIT, request_id), "mimeType": "image/png"}
            return {"id": request_id, "result": {"content": [], "structuredContent": {"shot": shot}}}

        schemas.sent(7, "tools/call", {"name": "lenient", "arguments": {}})
        schemas.sent(8, "tools/call", {"name": "plain"})
        assert spool.rewrite(answer(7), "fx", schemas=schemas) == 1
        assert spool.rewrite(answer(8), "fx", schemas=schemas) == 1  # no schema: nothing to keep valid
        assert spool.rewrite(answer(9), "fx", schemas=schemas) == 0  # unknown: base64's schema counts too

    def test_remembered_calls_are_bounded(self) -> None:
        """Requests whose answers never reach the spool are forgotten past REMEMBERED_CALLS."""
        schemas = media.OutputSchemas()
        for request_id in range(3 * media.REMEMBERED_CALLS):
            schemas.sent(request_id, "tools/call", {"name": "t"})
        assert len(schemas._calls) == media.REMEMBERED_CALLS

    def test_a_broken_schema_never_breaks_the_rewrite(self, spool: Spool) -> None:
        """An invalid schema or a dangling $ref is skipped or counts as 'cannot validate'; no exception."""
        schemas = media.OutputSchemas()
        broken = {"type": 7}
        dangling = {"$ref": "#/$defs/nowhere"}
        schemas.follow(lambda: (Tool("a", broken), Tool("b", dangling)))
        message = result([], structuredContent={"blob": b64(2 * LIMIT)})
        assert spool.rewrite(message, "fx", schemas=schemas) == 1


class TestBounds:
    def test_deep_nesting_does_not_recurse(self, spool: Spool) -> None:
        """A result nested 100,000 deep is walked without recursion; media past MAX_DEPTH is not sought."""
        bottom: dict[str, Any] = {"blob": b64(2 * LIMIT)}
        node: Any = bottom
        for _ in range(100_000):
            node = [{"n": node}]
        near = {"blob": b64(2 * LIMIT, 3)}
        near_node: Any = near
        for _ in range(50):
            near_node = {"n": [near_node]}
        message = result([], structuredContent={"deep": node, "near": near_node})
        started = time.monotonic()
        assert spool.rewrite(message, "fx") == 1
        assert time.monotonic() - started < 2
        assert near["blob"].startswith("file:///") and not bottom["blob"].startswith("file:")

    def test_the_walk_visits_each_container_once(self) -> None:
        """The walk is linear: each dict and list of 50,000 is looked into exactly once, counted
        (not timed: a loaded machine's times say nothing)."""
        visits = {"dict": 0, "list": 0}

        class Dict(dict):  # type: ignore[type-arg]
            def values(self) -> Any:
                visits["dict"] += 1
                return super().values()

        class List(list):  # type: ignore[type-arg]
            def __iter__(self) -> Any:
                visits["list"] += 1
                return super().__iter__()

        n = 50_000
        tree = {"structuredContent": List(Dict(k=List([i, Dict(x="y")])) for i in range(n)), "content": []}
        media.find(tree, LIMIT)
        assert visits == {"dict": 2 * n, "list": n + 1}

    def test_the_result_is_not_copied(self, spool: Spool) -> None:
        """Containers keep their identity: the rewrite changes them in place."""
        structured = {"a": {"blob": b64(2 * LIMIT)}, "b": [1, 2]}
        inner, listed = structured["a"], structured["b"]
        message = result([], structuredContent=structured)
        spool.rewrite(message, "fx")
        out = message["result"]["structuredContent"]
        assert out is structured and out["a"] is inner and out["b"] is listed


def test_sha256_of_a_file_is_its_link_digest(spool: Spool) -> None:
    """The content link's sha256 describes the one file structuredContent points to as well."""
    data = b64(3 * LIMIT, 9)
    message = result(
        [{"type": "image", "data": data, "mimeType": "image/png"}],
        structuredContent={"s": {"data": data, "mimeType": "image/png"}},
    )
    spool.rewrite(message, "fx")
    link = message["result"]["content"][0]
    assert link["_meta"]["sha256"] == hashlib.sha256(base64.b64decode(data)).hexdigest()
    assert message["result"]["structuredContent"]["s"]["data"] == link["uri"]
