"""Long strings of a remote answer kept on disk as it streams (:mod:`supervisor.upstream.scan`,
:mod:`supervisor.upstream.diverted`): the text passes byte for byte but for them, however the
bytes are cut, and they come back as they were, or as spool files where they are media."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from supervisor.upstream.diverted import MAX_PENDING, PREFIX, Diversions
from supervisor.upstream.scan import Scanner
from supervisor.upstream.spool import Spool

LONG = 64  # the tests' threshold: longer strings under data/blob are diverted


class _Sink:
    def __init__(self, sinks: list[_Sink]) -> None:
        self.data = bytearray()
        self.ended = False
        self.name = f"<{len(sinks)}>"
        sinks.append(self)

    def write(self, data: bytes) -> None:
        assert not self.ended
        self.data += data

    def end(self) -> bytes:
        self.ended = True
        return self.name.encode()

    def abandon(self) -> None:
        self.ended = True


def _feed(scanner: Scanner, text: bytes, cuts: list[int]) -> bytes:
    out = bytearray()
    for start, stop in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out += scanner.feed(text[start:stop])
    scanner.close()
    return bytes(out)


def _chunkings(text: bytes, seed: int) -> list[list[int]]:
    """Ways to cut *text*: in one piece, byte by byte, and at random places."""
    rng = random.Random(seed)
    ways: list[list[int]] = [[], list(range(1, len(text)))]
    for _ in range(20):
        ways.append(sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))))
    return ways


def _scan(text: bytes, *, seed: int = 0) -> tuple[bytes, list[bytes]]:
    """What *text* becomes, and what went to sinks; the same for every way of cutting it."""
    results = set()
    for cuts in _chunkings(text, seed):
        sinks: list[_Sink] = []
        out = _feed(Scanner(LONG, functools.partial(_Sink, sinks)), text, cuts)
        assert all(sink.ended for sink in sinks)
        results.add((out, tuple(bytes(sink.data) for sink in sinks)))
    assert len(results) == 1, "the cuts changed the outcome"
    out, diverted = results.pop()
    return out, list(diverted)


def _b64(size: int, seed: int = 1) -> str:
    return base64.b64encode(random.Random(seed).randbytes(size)).decode()


def _answer(**result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()


class TestJson:
    def test_a_long_image_is_diverted_and_everything_else_passes(self) -> None:
        image, text = _b64(300), "t" * 300
        body = _answer(
            content=[
                {"type": "image", "data": image, "mimeType": "image/png"},
                {"type": "text", "text": text},
                {"type": "resource", "resource": {"uri": "x://y", "blob": "c2hvcnQ="}},
            ]
        )
        out, diverted = _scan(body)
        assert diverted == [image.encode()]
        assert out == body.replace(image.encode(), b"<0>")

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param({"type": "data", "text": "x" * 200}, id="data as a value"),
            pytest.param({"database": "x" * 200}, id="a key starting with data"),
            pytest.param({"data": "x" * LONG}, id="exactly the threshold"),
            pytest.param({"data": ["x" * 200]}, id="a list under data"),
            pytest.param({"a": "data", "b": "x" * 200}, id="data, then another key"),
            pytest.param({"da\\u0074a": "x" * 200}, id="an escaped key"),
        ],
    )
    def test_nothing_else_is_diverted(self, value: dict[str, Any]) -> None:
        body = json.dumps(value).replace("\\\\u", "\\u").encode()
        assert _scan(body) == (body, [])

    def test_each_long_string_has_its_own_sink_and_escapes_stay_as_sent(self) -> None:
        first, second = "A" * 100 + '\\"q\\\\' + "B" * 10, "C\\/D" * 40
        body = f'{{"blob" : "{first}", "n": [1, {{"data":\n"{second}"}}], "data": "short"}}'.encode()
        out, diverted = _scan(body)
        assert diverted == [first.encode(), second.encode()]
        assert out == b'{"blob" : "<0>", "n": [1, {"data":\n"<1>"}], "data": "short"}'

    def test_strings_stay_in_the_text_when_no_sink_takes_them(self) -> None:
        body = _answer(content=[{"type": "image", "data": _b64(300), "mimeType": "image/png"}])
        for cuts in _chunkings(body, 5):
            assert _feed(Scanner(LONG, lambda: None), body, cuts) == body

    def test_a_string_broken_off_ends_its_sink(self) -> None:
        """At a line break (no string holds one), and at the answer's end."""
        sinks: list[_Sink] = []
        scanner = Scanner(LONG, functools.partial(_Sink, sinks))
        passed = scanner.feed(b'{"data": "' + b"A" * 200 + b'\n{"data": "short"}')
        assert passed == b'{"data": "<0>\n{"data": "short"}'
        assert sinks[0].ended and bytes(sinks[0].data) == b"A" * 200
        scanner.feed(b'{"blob": "' + b"B" * 200)
        scanner.close()
        assert sinks[1].ended and bytes(sinks[1].data) == b"B" * 200

    def test_a_key_whose_quote_is_escaped_opens_nothing(self) -> None:
        body = b'{"k \\"data": "' + b"x" * 200 + b'", "t": "a \\"data\\": \\"' + b"y" * 200 + b'"}'
        assert json.loads(body)  # valid JSON: a key and a text that merely look like one
        assert _scan(body) == (body, [])


class TestEvents:
    @pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
    def test_data_lines_are_scanned_and_the_framing_passes(self, newline: str) -> None:
        image = _b64(300)
        first = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"data": image}})
        events = [
            f": a comment{newline}event: message{newline}id: 1{newline}data: {first}{newline}{newline}",
            f'data:{{"data": "{"x" * 100}{newline}{newline}',  # broken off mid-string: ended there
            f'data: {{"data":{newline}data: "{image}"}}{newline}{newline}',  # a value over two lines: kept
            f"retry: 100{newline}data{newline}{newline}",
        ]
        stream = "".join(events).encode()
        out, diverted = _scan(stream, seed=len(newline))
        assert diverted == [image.encode(), b"x" * 100]
        assert out == stream.replace(image.encode(), b"<0>", 1).replace(b"x" * 100, b"<1>", 1)

    def test_a_long_field_name_or_other_field_is_passed_as_it_is(self) -> None:
        stream = ("x" * 40 + f': "dat":"{"A" * 200}"\n' + f'event: "blo":"{"A" * 200}"\n\n').encode()
        assert _scan(stream) == (stream, [])


class TestDiversions:
    @pytest.fixture
    def spool(self, tmp_path: Path) -> Spool:
        return Spool(tmp_path / "spool", instance="t", max_inline_bytes=LONG, max_total_bytes=1 << 30)

    def _parsed(self, diversions: Diversions, body: bytes, cuts: int = 7) -> Any:
        scanner = diversions.scanner()
        step = max(1, len(body) // cuts)
        return json.loads(_feed(scanner, body, list(range(step, len(body), step))))

    def test_media_is_spooled_from_its_file_and_the_rest_put_back(self, spool: Spool) -> None:
        extension = spool.for_extension("far")
        diversions = extension.diversions()
        picture = random.Random(3).randbytes(5000)
        text = "not media, only long: " + "z" * 300
        body = _answer(
            content=[{"type": "image", "data": base64.b64encode(picture).decode(), "mimeType": "image/png"}],
            structuredContent={"data": text, "kind": "note"},
        )
        message = self._parsed(diversions, body)
        assert len(diversions) == 2 and str(message).count(PREFIX) == 2
        diversions.spool(message)
        (link,) = message["result"]["content"]
        assert link["type"] == "resource_link" and link["size"] == len(picture)
        path = Path(link["uri"].removeprefix("file://"))
        assert path.read_bytes() == picture and link["_meta"]["sha256"] == hashlib.sha256(picture).hexdigest()
        assert message["result"]["structuredContent"] == {"data": text, "kind": "note"}
        assert len(diversions) == 0
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # the diverted files went

    def test_an_escaped_payload_is_read_back_through_json(self, spool: Spool) -> None:
        diversions = spool.for_extension("far").diversions()
        data = base64.b64encode(random.Random(4).randbytes(600)).decode()
        body = _answer(content=[{"type": "audio", "data": data, "mimeType": "audio/wav"}])
        escaped = body.replace(b"/", b"\\/")  # as PHP's json_encode writes every slash
        message = self._parsed(diversions, escaped)
        diversions.spool(message)
        (link,) = message["result"]["content"]
        assert Path(link["uri"].removeprefix("file://")).read_bytes() == base64.b64decode(data)

    def test_other_messages_get_their_text_back(self, spool: Spool) -> None:
        diversions = spool.for_extension("far").diversions()
        blob = _b64(400)
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 2, "error": {"code": -1, "message": "m", "data": blob}}
        ).encode()
        message = types.JSONRPCError.model_validate(self._parsed(diversions, body))
        assert message.error.data != blob
        diversions.put_back(message)
        assert message.error.data == blob and len(diversions) == 0
        read = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"contents": [{"uri": "a", "blob": blob}]}})
        response = types.JSONRPCResponse.model_validate(self._parsed(diversions, read.encode()))
        diversions.put_back(response)
        assert response.result == {"contents": [{"uri": "a", "blob": blob}]}

    def test_at_most_a_few_wait_on_disk_and_the_runs_end_removes_them(self, spool: Spool) -> None:
        extension = spool.for_extension("far")
        diversions = extension.diversions()
        items = [{"type": "image", "data": _b64(300, seed), "mimeType": "image/png"} for seed in range(12)]
        message = self._parsed(diversions, _answer(content=items), cuts=40)
        assert len(diversions) == MAX_PENDING  # the rest stayed in the text
        assert sum(PREFIX in item["data"] for item in message["result"]["content"]) == MAX_PENDING
        directory = spool.run_dir / extension.directory
        assert len(os.listdir(directory)) == MAX_PENDING
        assert {oct(os.stat(directory / name).st_mode & 0o777) for name in os.listdir(directory)} == {"0o600"}
        diversions.close()
        assert os.listdir(directory) == [] and len(diversions) == 0

    def test_a_string_broken_off_goes_at_once_not_with_the_run(self, spool: Spool) -> None:
        """An answer cut mid-string (a call given up as it streams): its file and its slot go
        then, so more of them than the run keeps pending never turn diverting off."""
        extension = spool.for_extension("far")
        diversions = extension.diversions()
        body = _answer(content=[{"type": "image", "data": _b64(3000), "mimeType": "image/png"}])
        for _ in range(MAX_PENDING + 2):
            scanner = diversions.scanner()
            scanner.feed(body[: len(body) // 2])  # well into the image's data
            assert len(diversions) == 1
            scanner.close()
            assert len(diversions) == 0
        assert os.listdir(spool.run_dir / extension.directory) == []
        message = self._parsed(diversions, body)  # and the next answer is diverted as ever
        assert message["result"]["content"][0]["data"].startswith(PREFIX)

    def test_a_placeholder_the_server_made_up_is_left_alone(self, spool: Spool) -> None:
        diversions = spool.for_extension("far").diversions()
        self._parsed(diversions, _answer(content=[{"type": "image", "data": _b64(300), "mimeType": "x/y"}]))
        forged = {"content": [{"type": "text", "text": PREFIX + "guessed"}]}
        diversions.put_back(types.JSONRPCResponse(jsonrpc="2.0", id=9, result=forged))
        assert forged["content"][0]["text"] == PREFIX + "guessed" and len(diversions) == 1
