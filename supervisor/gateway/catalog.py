"""What the gateway's clients see: every live extension's listing, renamed, filtered and sorted.

Pure: :func:`build` turns :class:`Source` values (an extension's name, prefix, tool filter,
current :class:`~supervisor.extension.state.Listing` and last known one) into a :class:`Catalog`. The
gateway rebuilds it when an extension changes and compares catalogs to decide which
list_changed to send. Names are assigned over every configured extension's last known listing
as well as what is listed now, so that a name never changes owner as extensions start and stop.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import mcp_types as types

from supervisor.gateway.names import Collision, NameTable, expose_uri
from supervisor.upstream.listing import Listing

__all__ = ("KINDS", "Catalog", "Source", "build", "visible")

KINDS = ("tools", "prompts", "resources")  # the list_changed kinds; templates go with resources


@dataclass(frozen=True, slots=True)
class Source:
    """One configured extension as the catalog sees it."""

    extension: str
    prefix: str
    allow: Sequence[str]
    deny: Sequence[str]
    listing: Listing  # what clients see of it now (nothing while it is stopped)
    known: Listing | None = None  # its last known listing when that differs: its names are kept


def visible(name: str, allow: Sequence[str], deny: Sequence[str]) -> bool:
    """Whether a tool passes an allow/deny filter (globs on its original name)."""
    return any(fnmatch.fnmatchcase(name, p) for p in allow) and not any(
        fnmatch.fnmatchcase(name, p) for p in deny
    )


@dataclass(frozen=True, slots=True)
class Catalog:
    """The gateway's lists at one moment, in a deterministic order (by exposed name or URI)."""

    sources: tuple[Source, ...] = ()
    tools: tuple[types.Tool, ...] = ()
    prompts: tuple[types.Prompt, ...] = ()
    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    tool_names: NameTable = field(default_factory=lambda: NameTable({}, ()))
    prompt_names: NameTable = field(default_factory=lambda: NameTable({}, ()))

    @property
    def collisions(self) -> tuple[Collision, ...]:
        return self.tool_names.collisions + self.prompt_names.collisions

    def changed_kinds(self, newer: Catalog) -> set[str]:
        """The list_changed kinds that differ in *newer*: a run that ended or began counts."""
        old = {s.extension: s.listing for s in self.sources}
        new = {s.extension: s.listing for s in newer.sources}
        empty = Listing()
        changed: set[str] = set()
        for extension in old.keys() | new.keys():
            before, after = old.get(extension, empty), new.get(extension, empty)
            if before is after:
                continue
            if before.tools or after.tools:
                changed.add("tools")
            if before.prompts or after.prompts:
                changed.add("prompts")
            if before.resources or after.resources or before.templates or after.templates:
                changed.add("resources")
        if self.tools != newer.tools:  # a filter or a prefix changed on reload
            changed.add("tools")
        if self.prompts != newer.prompts:
            changed.add("prompts")
        return changed


def _unique(items: Iterable[types.Tool | types.Prompt]) -> list:
    """A server that lists one name twice: the first definition wins, as in the name table."""
    seen: set[str] = set()
    return [item for item in items if not (item.name in seen or seen.add(item.name))]


def _named(source: Source, kind: str) -> list:
    """What a source's names are assigned over: what it lists and what it last listed, unique."""
    items = getattr(source.listing, kind)
    if source.known is not None:
        items = (*items, *getattr(source.known, kind))
    if kind == "tools":
        items = (t for t in items if visible(t.name, source.allow, source.deny))
    return _unique(items)


def build(sources: Iterable[Source], budget: int = 64) -> Catalog:
    """The catalog of *sources*, names within *budget* characters. Pure."""
    sources = tuple(sorted(sources, key=lambda s: s.extension))
    shown = {
        s.extension: _unique(t for t in s.listing.tools if visible(t.name, s.allow, s.deny)) for s in sources
    }
    offered = {s.extension: _unique(s.listing.prompts) for s in sources}
    tool_names = NameTable.build(
        ((s.extension, s.prefix, t.name) for s in sources for t in _named(s, "tools")), budget
    )
    prompt_names = NameTable.build(
        ((s.extension, s.prefix, p.name) for s in sources for p in _named(s, "prompts")), budget
    )
    tools = [
        t.model_copy(update={"name": tool_names.exposed(s.extension, t.name)})
        for s in sources
        for t in shown[s.extension]
        if tool_names.exposed(s.extension, t.name) is not None
    ]
    prompts = [
        p.model_copy(update={"name": prompt_names.exposed(s.extension, p.name)})
        for s in sources
        for p in offered[s.extension]
    ]
    resources = [
        r.model_copy(update={"uri": expose_uri(s.extension, r.uri)})
        for s in sources
        for r in s.listing.resources
    ]
    templates = [
        t.model_copy(update={"uri_template": expose_uri(s.extension, t.uri_template)})
        for s in sources
        for t in s.listing.templates
    ]
    return Catalog(
        sources=sources,
        tools=tuple(sorted(tools, key=lambda t: t.name)),
        prompts=tuple(sorted(prompts, key=lambda p: p.name)),
        resources=tuple(sorted(resources, key=lambda r: r.uri)),
        templates=tuple(sorted(templates, key=lambda t: t.uri_template)),
        tool_names=tool_names,
        prompt_names=prompt_names,
    )
