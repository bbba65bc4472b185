"""Fast raw-protocol server returning the same PNG as content AND inside ``structuredContent``.

Like servers built on the SDKs' output schemas (browser screenshot tools and the like), each
tool declares an ``outputSchema`` written the way generators write them (zod, pydantic:
``additionalProperties: false``, every field required). Every size is the DECODED byte count
of a PNG (``media.payload("image", bytes, seed)``); tools take ``bytes`` and ``seed``:

* ``items``: content ``[text "shot", image]``; structured ``{"title": "shot", "content":
  [<the same image item>]}`` (content items nested in the structured object).
* ``field``: content ``[image]``; structured ``{"screenshot": {"data", "mimeType"}, "width":
  640, "file": {"uri", "mimeType", "blob"}}`` (a data+mimeType object and a resource-contents
  object holding the same bytes).
* ``fastmcp``: as ``field``, plus a first text item holding ``json.dumps(structured, indent=2)``,
  as the spec asks of servers returning structured content.
* ``strict``: as ``field``, but the schema insists ``data`` is base64 (a ``pattern``), so a
  URI there would not validate.
* ``deep(depth)``: no output schema; structured content nested ``depth`` levels (dicts in
  lists) with an image object at the bottom.
* ``sha256``: the hex digest of the PNG the others return for the same arguments.
"""

from __future__ import annotations

import _raw
from media import payload

PNG = "image/png"
_ARGS = {"bytes": {"type": "integer", "minimum": 0}, "seed": {"type": "integer"}}


def _png(args: _raw.Args) -> bytes:
    return payload("image", int(args.get("bytes", 1024)), int(args.get("seed", 0)))


def _strict_object(properties: dict[str, object]) -> dict[str, object]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


_IMAGE_ITEM = _strict_object(
    {"type": {"const": "image"}, "data": {"type": "string"}, "mimeType": {"type": "string"}}
)
_DATA = _strict_object({"data": {"type": "string"}, "mimeType": {"type": "string"}})
_BLOB = _strict_object(
    {"uri": {"type": "string"}, "mimeType": {"type": "string"}, "blob": {"type": "string"}}
)
_FIELD_SCHEMA = _strict_object({"screenshot": _DATA, "width": {"type": "integer"}, "file": _BLOB})
_STRICT_DATA = _strict_object(
    {"data": {"type": "string", "pattern": "^[A-Za-z0-9+/]*={0,2}$"}, "mimeType": {"type": "string"}}
)


class SchemaTool(_raw.Tool):
    """A tool whose listing carries an ``outputSchema``."""

    __slots__ = ("output_schema",)

    def __init__(self, fn: _raw.ToolFn, description: str, output_schema: dict[str, object] | None) -> None:
        super().__init__(fn, description, _ARGS)
        self.output_schema = output_schema

    def describe(self, name: str) -> dict[str, object]:
        described = super().describe(name)
        if self.output_schema is not None:
            described["outputSchema"] = self.output_schema
        return described


def items(args: _raw.Args) -> dict[str, object]:
    png = _png(args)
    image = {"type": "image", "data": _raw.Base64(png), "mimeType": PNG}
    structured = {"title": "shot", "content": [{"type": "image", "data": _raw.Base64(png), "mimeType": PNG}]}
    return {"content": [_raw.text("shot"), image], "structuredContent": structured}


def _field(png: bytes, encode: object) -> dict[str, object]:
    return {
        "screenshot": {"data": encode(png), "mimeType": PNG},  # type: ignore[operator]
        "width": 640,
        "file": {"uri": "file:///shot.png", "mimeType": PNG, "blob": encode(png)},  # type: ignore[operator]
    }


def field(args: _raw.Args) -> dict[str, object]:
    png = _png(args)
    image = {"type": "image", "data": _raw.Base64(png), "mimeType": PNG}
    return {"content": [image], "structuredContent": _field(png, _raw.Base64)}


def fastmcp(args: _raw.Args) -> dict[str, object]:
    import base64
    import json

    png = _png(args)
    structured = _field(png, lambda data: base64.b64encode(data).decode())
    image = {"type": "image", "data": _raw.Base64(png), "mimeType": PNG}
    return {"content": [_raw.text(json.dumps(structured, indent=2)), image], "structuredContent": structured}


def deep(args: _raw.Args) -> dict[str, object]:
    import sys

    sys.setrecursionlimit(max(1000, 4 * int(args.get("depth", 10)) + 100))  # so json.dumps can write it
    node: object = {"type": "image", "data": _raw.Base64(_png(args)), "mimeType": PNG}
    for _ in range(int(args.get("depth", 10))):
        node = {"next": [node]}
    return {"content": [_raw.text("deep")], "structuredContent": {"root": node}}


def sha256(args: _raw.Args) -> _raw.Content:
    import hashlib

    return [_raw.text(hashlib.sha256(_png(args)).hexdigest())]


TOOLS = {
    "items": SchemaTool(
        items,
        "A PNG as content and as content items in structuredContent.",
        _strict_object({"title": {"type": "string"}, "content": {"type": "array", "items": _IMAGE_ITEM}}),
    ),
    "field": SchemaTool(field, "A PNG as content and in structured fields.", _FIELD_SCHEMA),
    "fastmcp": SchemaTool(fastmcp, "As field, plus the structured JSON as text.", _FIELD_SCHEMA),
    "strict": SchemaTool(
        field,
        "As field, with a schema that wants base64 in data.",
        _strict_object({"screenshot": _STRICT_DATA, "width": {"type": "integer"}, "file": _BLOB}),
    ),
    "deep": SchemaTool(deep, "A PNG at the bottom of deeply nested structured content.", None),
    "sha256": SchemaTool(sha256, "sha256 of the PNG the other tools return.", None),
}
TOOLS["deep"].properties["depth"] = {"type": "integer"}


def main() -> None:
    """Serve until stdin closes."""
    _raw.serve("screenshot", TOOLS)


if __name__ == "__main__":
    main()
