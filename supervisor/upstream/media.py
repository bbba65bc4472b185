"""Where base64 media hides in a tool result, and whether rewriting it keeps the result valid.

Pure lookups over plain JSON (the dicts and lists the parser made); :mod:`supervisor.upstream.spool`
decides sizes, writes files and applies the rewrite. What counts as media:

* **A content item** (``result.content[i]``): ``image`` or ``audio`` with a string ``data``,
  or ``resource`` whose ``resource`` has a string ``blob``. The spool replaces the whole item
  by a ``resource_link``: every client accepts that in ``content``.
* **Anywhere else** (``structuredContent`` at any depth, ``_meta``, inside other content
  items, and inside a text item that is a JSON document, as the spec asks servers to send
  alongside structured output): an object with a string ``blob`` (the shape of resource
  contents), or with a string ``data`` next to ``type`` ``image``/``audio`` or a binary
  ``mimeType`` (``image/*``, ``audio/*``, ``video/*``, ``font/*``, ``model/*``, or
  ``application/*`` other than JSON, XML, YAML, JavaScript and the like). Only that one
  string is replaced, by the file's URI; the object keeps its keys, so a schema that types
  the field as a string still holds (see :class:`OutputSchemas` for the rest).

Long strings without those markers are never touched: nothing tells base64 from text (a
hex digest or a word is valid base64), a text replaced by a link changes its meaning, and
there would be no MIME type to serve the file with.

Bounds: the walk is iterative (a hostile result cannot exhaust the stack), visits each node
once, copies nothing, and stops at :data:`MAX_DEPTH` (the JSON parser stops near 200 anyway).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic_core

# Imported at start, not at the first structured result (as the SDK's ClientSession does): a daemon
# that has run out of fds could import nothing then, and a valid result was refused as invalid.
from jsonschema import SchemaError
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for
from referencing import Registry

__all__ = (
    "MAX_DEPTH",
    "REMEMBERED_CALLS",
    "Applied",
    "Found",
    "OutputSchemas",
    "Spot",
    "Stored",
    "TextDocument",
    "apply",
    "find",
    "is_binary_mime",
    "media_field",
    "resource_link",
)

MAX_DEPTH = 256  # containers deeper than this are not looked into
REMEMBERED_CALLS = 1024  # request ids whose tool is known when the answer comes
MEDIA_TYPES = ("image", "audio")
_MEDIA_MAJORS = frozenset({"image", "audio", "video", "font", "model"})
_TEXT_SUBTYPES = frozenset(
    {
        "json",
        "xml",
        "javascript",
        "ecmascript",
        "x-javascript",
        "yaml",
        "x-yaml",
        "toml",
        "x-www-form-urlencoded",
        "sql",
        "graphql",
        "x-sh",
        "csv",
        "x-ndjson",
    }
)


@dataclass(slots=True, eq=False)  # compared by identity: holders may be huge
class Spot:
    """One base64 payload, at ``holder[key]``.

    *where* is ``content`` (the content item ``result.content[index]`` as a whole),
    ``structured`` (under ``structuredContent``), ``text`` (inside the JSON document of the
    text item ``result.content[index]``) or ``other`` (``_meta``, fields of other items).
    """

    holder: dict[str, Any]
    key: str
    kind: str  # image, audio or resource for a content item; else image, audio, blob or data
    mime: str | None
    where: str
    index: int = -1


@dataclass(slots=True)
class TextDocument:
    """A text item of ``result.content`` parsed as JSON, to be written back if a spot in it moves."""

    index: int
    document: Any
    indented: bool


@dataclass(slots=True)
class Found:
    spots: list[Spot] = field(default_factory=list)
    texts: list[TextDocument] = field(default_factory=list)


def is_binary_mime(mime: str) -> bool:
    """Whether a ``data`` string next to this MIME type is base64 of binary content."""
    major, _, sub = mime.strip().lower().partition("/")
    sub = sub.split(";")[0].strip()
    if major in _MEDIA_MAJORS:
        return True
    if major != "application" or not sub:
        return False
    return sub not in _TEXT_SUBTYPES and not sub.endswith(("+json", "+xml", "+yaml"))


def media_field(node: dict[str, Any]) -> tuple[str, str, str | None] | None:
    """``(key, kind, mime)`` when *node* carries base64 media by the rules above, else None."""
    mime = node.get("mimeType")
    mime = mime if isinstance(mime, str) else None
    if isinstance(node.get("blob"), str):
        return "blob", "blob", mime
    if isinstance(node.get("data"), str):
        kind = node.get("type")
        if kind in MEDIA_TYPES:
            return "data", kind, mime
        if mime is not None and is_binary_mime(mime):
            return "data", "data", mime
    return None


def find(result: dict[str, Any], longer_than: int, diverted: Container[str] = ()) -> Found:
    """Every media payload in the tool *result* whose base64 is longer than *longer_than* chars,
    or is a placeholder of one kept on disk (*diverted*: see :mod:`.diverted`).

    Shorter strings cannot decode to more than *longer_than* bytes, so they are skipped
    without a look; so are text items no longer than that.
    """
    found = Found()
    long = _Long(longer_than, diverted)
    for key, value in result.items():
        if key == "content" and isinstance(value, list):
            _content(value, long, found)
        else:
            found.spots += _walk(value, long, "structured" if key == "structuredContent" else "other")
    return found


@dataclass(frozen=True, slots=True)
class _Long:
    longer_than: int
    diverted: Container[str]

    def __call__(self, text: str) -> bool:
        return len(text) > self.longer_than or (bool(self.diverted) and text in self.diverted)


def _content(items: list[Any], long: _Long, found: Found) -> None:
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        holder = item.get("resource") if kind == "resource" else item
        key = "blob" if kind == "resource" else "data"
        if (
            kind in (*MEDIA_TYPES, "resource")
            and isinstance(holder, dict)
            and isinstance(holder.get(key), str)
        ):
            if long(holder[key]):
                mime = holder.get("mimeType")
                found.spots.append(
                    Spot(holder, key, kind, mime if isinstance(mime, str) else None, "content", index)
                )
            continue
        text = item.get("text") if kind == "text" else None
        if isinstance(text, str) and len(text) > long.longer_than and text.lstrip()[:1] in ("{", "["):
            document = _parse(text)
            spots = _walk(document, long, "text", index) if document is not None else []
            if spots:
                found.spots += spots
                found.texts.append(TextDocument(index, document, "\n" in text[:200]))
            continue
        found.spots += _walk(item, long, "other")


def _parse(text: str) -> Any:
    try:
        return pydantic_core.from_json(text)
    except ValueError:  # not JSON after all, or nested past the parser's limit
        return None


def _walk(root: Any, long: _Long, where: str, index: int = -1) -> list[Spot]:
    spots: list[Spot] = []
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            continue
        if isinstance(node, dict):
            media = media_field(node)
            if media is not None and long(node[media[0]]):
                spots.append(Spot(node, media[0], media[1], media[2], where, index))
            stack.extend((value, depth + 1) for value in node.values() if isinstance(value, dict | list))
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node if isinstance(value, dict | list))
    return spots


@dataclass(frozen=True, slots=True)
class Stored:
    """Where one payload went."""

    path: Path
    digest: str  # sha256 of the decoded bytes
    size: int  # decoded bytes


@dataclass(slots=True)
class Applied:
    replaced: list[Spot]
    rejection: str | None = None  # why the structuredContent rewrite was undone
    undone: int = 0  # payloads in structuredContent put back


def apply(
    result: dict[str, Any],
    found: Found,
    payloads: dict[str, list[Spot]],
    stored: dict[str, Stored],
    schemas: OutputSchemas | None,
    request_id: Any = None,
) -> Applied:
    """Put links and URIs in *result* in place of the *stored* payloads (base64 text -> file).

    A content item becomes a ``resource_link``; any other spot gets the file's URI in place of
    its base64 string. If *schemas* rejects the rewritten ``structuredContent``, every spot in
    it gets its original back. Text items whose JSON changed are serialized again.
    """
    applied = Applied([])
    structured: list[tuple[Spot, str, str]] = []  # (spot, original, uri)
    for data, spots in payloads.items():
        saved = stored.get(data)
        if saved is None:
            continue
        for spot in spots:
            if spot.where == "content":
                content = result["content"]
                content[spot.index] = resource_link(content[spot.index], spot, saved)
            else:
                spot.holder[spot.key] = saved.path.as_uri()
                if spot.where == "structured":
                    structured.append((spot, data, saved.path.as_uri()))
            applied.replaced.append(spot)
    if structured and schemas is not None:

        def toggle(rewritten: bool) -> None:
            for spot, original, uri in structured:
                spot.holder[spot.key] = uri if rewritten else original

        applied.rejection = schemas.rejection(result["structuredContent"], toggle, request_id)
        if applied.rejection is not None:
            toggle(False)
            undone = {id(spot) for spot, _, _ in structured}
            applied.replaced = [spot for spot in applied.replaced if id(spot) not in undone]
            applied.undone = len(undone)
    changed = {spot.index for spot in applied.replaced if spot.where == "text"}
    for text in found.texts:
        if text.index in changed:
            indent = 2 if text.indented else None
            result["content"][text.index]["text"] = json.dumps(
                text.document, indent=indent, ensure_ascii=False
            )
    return applied


def resource_link(item: dict[str, Any], spot: Spot, saved: Stored) -> dict[str, Any]:
    """The ``resource_link`` that replaces the content item *item*, whose payload is at *spot*."""
    link: dict[str, Any] = {
        "type": "resource_link",
        "uri": saved.path.as_uri(),
        "name": saved.path.name,
        "size": saved.size,
        "description": f"{spot.kind} content ({saved.size} bytes) spooled to disk by mcp-supervisor",
        "_meta": {"sha256": saved.digest, "originalType": spot.kind},
    }
    if spot.mime:
        link["mimeType"] = spot.mime
    if spot.kind == "resource" and isinstance(spot.holder.get("uri"), str):
        link["_meta"]["originalUri"] = spot.holder["uri"]
    if isinstance(item.get("annotations"), dict):
        link["annotations"] = item["annotations"]
    return link


class OutputSchemas:
    """One extension's tool output schemas, compiled once per listing, for checking a rewrite.

    A rewrite of ``structuredContent`` is kept unless the output schema of the tool that
    answered accepts the original and rejects the rewrite: then the client's check (the SDK's
    ``ClientSession`` validates every result) would fail because of us. The tool is found
    from the request id (:meth:`sent` notes each request on its way to the child). When the
    id is not known (more than :data:`REMEMBERED_CALLS` calls ago), every output schema of
    the extension counts: the tool's own is among them. Validation is the SDK's: the
    schema's own draft, no format assertions, ``$ref`` only within the schema.

    Thread-safe: requests are noted on the event loop, rewrites run in worker threads.
    """

    def __init__(self) -> None:
        self._source: Callable[[], Sequence[Any]] | None = None
        self._lock = threading.Lock()
        self._tools: Sequence[Any] | None = None
        self._validators: dict[str, Any] = {}
        self._calls: OrderedDict[Any, str | None] = OrderedDict()  # request id -> tool (None: not a call)

    def follow(self, tools: Callable[[], Sequence[Any]]) -> None:
        """Read the current tools (objects with ``name`` and ``output_schema``) from *tools*."""
        self._source = tools

    def sent(self, request_id: Any, method: str, params: Any) -> None:
        """Note a request to the child, so that its answer finds its tool. Sync, O(1)."""
        name = params.get("name") if method == "tools/call" and isinstance(params, dict) else None
        with self._lock:
            self._calls[request_id] = name if isinstance(name, str) else None  # a reused id: the newest
            self._calls.move_to_end(request_id)
            if len(self._calls) > REMEMBERED_CALLS:  # answers that went past the spool are never taken
                self._calls.popitem(last=False)

    def validators(self, request_id: Any = None) -> list[Any]:
        """The validators that apply to the answer to *request_id*: its tool's, or every one."""
        if self._source is None:
            return []
        tools = self._source()
        with self._lock:  # also taken on the event loop: held for dict operations only
            tool = self._calls.pop(request_id, None) if isinstance(request_id, str | int) else None
            validators = self._validators if tools is self._tools else None
        if validators is None:  # a listing is replaced whole, never changed: compile once per listing
            validators = dict(_compile(tools))
            with self._lock:
                self._tools, self._validators = tools, validators
        if tool is not None and any(t.name == tool for t in tools):
            return [validators[tool]] if tool in validators else []
        return list(validators.values())

    def rejection(self, instance: Any, toggle: Callable[[bool], None], request_id: Any = None) -> str | None:
        """Why the rewritten *instance* would fail a schema that its original passes, or None.

        *toggle* (False) puts the original values back in *instance*, (True) the rewrite.
        """
        for validator in self.validators(request_id):
            error = _error(validator, instance)
            if error is None:
                continue
            toggle(False)
            try:
                original_passes = _error(validator, instance) is None
            finally:
                toggle(True)
            if original_passes:
                return error
        return None


def _compile(tools: Sequence[Any]) -> Iterator[tuple[str, Any]]:
    for tool in tools:
        schema = getattr(tool, "output_schema", None)
        if not isinstance(schema, dict):
            continue
        cls = validator_for(schema)
        try:
            cls.check_schema(schema)
        except SchemaError:  # the client cannot validate with it either: it constrains nothing here
            continue
        yield tool.name, cls(schema, registry=Registry())


def _error(validator: Any, instance: Any) -> str | None:
    try:
        error = best_match(validator.iter_errors(instance))
    except Exception as exc:  # a child's schema must not break the pump: RecursionError, Unresolvable, ...
        return f"cannot validate: {type(exc).__name__}"
    return None if error is None else f"{error.json_path}: {error.message[:200]}"
