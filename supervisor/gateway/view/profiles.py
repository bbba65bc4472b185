"""Client views: what one gateway client sees (``connect --profile NAME``, ``/mcp/NAME``) and how.

A :class:`View` is a profile from the config (or :data:`EVERYTHING`, for a client that names
none): the extensions it shows, allow/deny globs on tool names, ``list`` or ``search`` mode and
the tool budget it is warned about. :class:`Views` holds the configured ones and, per catalog,
a :class:`Projection` of each: the catalog's entries the view admits, what ``tools/list``
answers, and (search mode) the search index, built once per catalog change, not per query.

How a request names its view: on ``mcp.sock`` the connection's first line may be a
``mcp-supervisor/profile`` request (what ``connect --profile`` sends), and every message of
the connection then carries a :class:`Chosen`; over HTTP the path ``/mcp/NAME`` puts the name in
the ASGI scope under :data:`SCOPE_KEY`. :meth:`Views.of` reads either off the SDK's request
context. Per-extension ``tools`` filters apply to every view (the catalog never holds those
tools); :func:`hidden_reason` names the filter when a client calls one.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import structlog

from supervisor.gateway.catalog import Catalog, visible
from supervisor.gateway.names import expose, parse_uri
from supervisor.gateway.view import search

__all__ = (
    "DEFAULT_MAX_TOOLS",
    "EVERYTHING",
    "META_TOOLS",
    "SCOPE_KEY",
    "Chosen",
    "Projection",
    "View",
    "Views",
    "call_meta",
    "hidden_reason",
)

log = structlog.get_logger(__name__)

DEFAULT_MAX_TOOLS = 128  # as the config's default: many clients take at most 128 tools
SCOPE_KEY = "mcp_supervisor.profile"  # the ASGI scope key /mcp/NAME sets
MAX_SEARCH_LIMIT = 50
DEFAULT_SEARCH_LIMIT = 8


@dataclass(frozen=True, slots=True)
class Chosen:
    """The request context of every message on a mcp.sock connection that chose a profile."""

    profile: str


def _matches(names: Sequence[str], patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


@dataclass(frozen=True, slots=True)
class View:
    """One way of seeing the catalog. ``name`` None: the default view (everything, listed)."""

    name: str | None = None
    extensions: frozenset[str] | None = None  # None: every extension
    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()
    mode: str = "list"
    max_tools: int = DEFAULT_MAX_TOOLS
    removed: bool = False  # the profile left the config while a client still uses it

    @classmethod
    def from_profile(cls, name: str, profile: Any) -> View:
        """The view of a ``ProfileConfig`` value (duck-typed: the gateway does not import config)."""
        extensions = None if profile.extensions is None else frozenset(profile.extensions)
        return cls(
            name,
            extensions,
            tuple(profile.tools.allow),
            tuple(profile.tools.deny),
            profile.mode,
            profile.max_tools,
        )

    @property
    def label(self) -> str:
        return "(default)" if self.name is None else self.name

    def sees(self, extension: str) -> bool:
        return self.extensions is None or extension in self.extensions

    def admits(self, extension: str, original: str, exposed: str) -> bool:
        """Whether a catalog tool is in this view: its extension, then the globs (own or exposed name)."""
        return self.why_not(extension, original, exposed) is None

    def why_not(self, extension: str, original: str, exposed: str) -> str | None:
        if not self.sees(extension):
            return f"extension {extension!r} is not in profile {self.label!r}"
        names = (original, exposed)
        if not _matches(names, self.allow):
            return f"profile {self.label!r} allows only {list(self.allow)}"
        denied = [p for p in self.deny if _matches(names, (p,))]
        if denied:
            return f"profile {self.label!r} denies {denied}"
        return None


EVERYTHING = View()


def _tool(name: str, description: str, properties: dict[str, Any], *required: str) -> types.Tool:
    schema = {"type": "object", "properties": properties, "required": list(required)}
    return types.Tool(name=name, description=description, input_schema=schema)


META_TOOLS = (
    _tool(
        "search_tools",
        "Search the tools available here by what they do; returns the best matches with their "
        "names, descriptions and input schemas. Call one with call_tool.",
        {
            "query": {"type": "string", "description": "what you want to do, in a few words"},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT, "default": 8},
        },
        "query",
    ),
    _tool(
        "describe_tool",
        "The whole definition of one tool (input and output schemas, annotations) by its name.",
        {"name": {"type": "string"}},
        "name",
    ),
    _tool(
        "call_tool",
        "Call a tool found with search_tools, by its name, with its arguments.",
        {"name": {"type": "string"}, "arguments": {"type": "object"}},
        "name",
    ),
)
_META_NAMES = frozenset(t.name for t in META_TOOLS)


@dataclass(slots=True)
class Projection:
    """One view of one catalog: what the view admits, what ``tools/list`` answers, the search index."""

    view: View
    tools: tuple[types.Tool, ...]  # the catalog's tools in this view, in the catalog's order
    prompts: tuple[types.Prompt, ...]
    resources: tuple[types.Resource, ...]
    templates: tuple[types.ResourceTemplate, ...]
    _index: search.Index | None = field(default=None, repr=False)
    _by_name: dict[str, types.Tool] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, catalog: Catalog, view: View) -> Projection:
        if view.extensions is None and view.allow == ("*",) and not view.deny:
            return cls(view, catalog.tools, catalog.prompts, catalog.resources, catalog.templates)
        resolve = catalog.tool_names.resolve
        tools = tuple(
            t for t in catalog.tools if (target := resolve(t.name)) and view.admits(*target, t.name)
        )
        prompts = tuple(
            p
            for p in catalog.prompts
            if (target := catalog.prompt_names.resolve(p.name)) and view.sees(target[0])
        )

        def seen(uri: str) -> bool:
            target = parse_uri(uri)
            return target is not None and view.sees(target[0])

        resources = tuple(r for r in catalog.resources if seen(r.uri))
        templates = tuple(t for t in catalog.templates if seen(t.uri_template))
        return cls(view, tools, prompts, resources, templates)

    @property
    def listed(self) -> tuple[types.Tool, ...]:
        return META_TOOLS if self.view.mode == "search" else self.tools

    def tool(self, name: str) -> types.Tool | None:
        if not self._by_name and self.tools:
            self._by_name = {t.name: t for t in self.tools}
        return self._by_name.get(name)

    def search(self, query: str, limit: int) -> list[tuple[types.Tool, float]]:
        if self._index is None:  # once per catalog change and view, on the first query
            self._index = search.Index((t.name, _searchable(t)) for t in self.tools)
        return [(self.tools[doc], score) for doc, score in self._index.search(query, limit)]


def _searchable(tool: types.Tool) -> str:
    """The text a tool is found by besides its name: title, description, parameter names."""
    properties = tool.input_schema.get("properties") if isinstance(tool.input_schema, dict) else None
    parameters = " ".join(properties) if isinstance(properties, dict) else ""
    return " ".join(part for part in (tool.title, tool.description, parameters) if part)


class Views:
    """The configured profiles, and each one's projection of the current catalog (cached)."""

    def __init__(self, profiles: Mapping[str, Any] | None = None) -> None:
        self._views: dict[str, View] = {}
        self._catalog: Catalog | None = None
        self._projections: dict[str | None, Projection] = {}
        self._warned: dict[str | None, tuple[int, int]] = {}  # view -> (listed, max) last warned about
        self.configure(profiles or {})

    def configure(self, profiles: Mapping[str, Any]) -> bool:
        """Take the config's profiles (``ProfileConfig`` values); True if any view changed."""
        views = {name: View.from_profile(name, profile) for name, profile in profiles.items()}
        changed = views != self._views
        self._views = views
        if changed:
            self._projections.clear()
        return changed

    def names(self) -> list[str]:
        return sorted(self._views)

    def get(self, name: str | None) -> View | None:
        """The view called *name* (None: the default one), or None if no profile has that name."""
        return EVERYTHING if name is None else self._views.get(name)

    def choose(self, name: object) -> View | str:
        """The view of profile *name*, or what to tell a client that asked for one there is not."""
        view = self._views.get(name) if isinstance(name, str) else None
        if view is None:
            known = ", ".join(self.names()) or "none"
            log.info("gateway.unknown_profile", profile=str(name)[:100])
            return f"unknown profile {name!r} (configured: {known})"
        return view

    def of(self, request: Any) -> View:
        """The view of a request, from the SDK's request context (see the module's docstring)."""
        if isinstance(request, Chosen):
            name: str | None = request.profile
        else:
            scope = getattr(request, "scope", None)
            name = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
        view = self.get(name)
        return view if view is not None else View(name, frozenset(), removed=True)

    def project(self, catalog: Catalog, view: View) -> Projection:
        if catalog is not self._catalog:
            self._catalog, self._projections = catalog, {}
        projection = self._projections.get(view.name)
        if projection is None or projection.view != view:
            projection = Projection.build(catalog, view)
            if not view.removed:
                self._projections[view.name] = projection
        return projection

    def summary(self, catalog: Catalog) -> list[dict[str, Any]]:
        """Per view: its name (None: the default view), mode, tools in it, tools listed, budget."""
        out = []
        for view in (EVERYTHING, *(self._views[name] for name in self.names())):
            projection = self.project(catalog, view)
            listed = len(projection.listed)
            out.append(
                {
                    "name": view.name,
                    "mode": view.mode,
                    "extensions": None if view.extensions is None else sorted(view.extensions),
                    "tools": len(projection.tools),
                    "listed": listed,
                    "max_tools": view.max_tools,
                    "over_budget": listed > view.max_tools,
                }
            )
        return out

    def warn_over_budget(self, catalog: Catalog) -> None:
        """Log ``gateway.view_over_budget`` once per change for each view that lists too many tools."""
        for record in self.summary(catalog):
            key = (record["listed"], record["max_tools"])
            if not record["over_budget"]:
                self._warned.pop(record["name"], None)
            elif self._warned.get(record["name"]) != key:
                self._warned[record["name"]] = key
                log.warning(
                    "gateway.view_over_budget",
                    profile=record["name"] or "(default)",
                    tools=record["listed"],
                    max_tools=record["max_tools"],
                    hint="clients that cap their list drop the rest; narrow the profile or use search mode",
                )


def hidden_reason(catalog: Catalog, view: View, name: str, budget: int) -> str | None:
    """Why a tool called *name* is not callable in *view*, naming the filter, or None if none hides it."""
    if view.removed:
        return f"profile {view.label!r} is no longer configured; reconnect with another profile"
    target = catalog.tool_names.resolve(name)
    if target is not None:
        why = view.why_not(*target, name)
        return None if why is None else f"tool {name!r} is hidden from this client: {why}"
    for source in catalog.sources:
        for tool in source.listing.tools:
            if expose(source.prefix, tool.name, budget) == name and not visible(
                tool.name, source.allow, source.deny
            ):
                return (
                    f"tool {tool.name!r} of extension {source.extension!r} is hidden from gateway clients "
                    f"by its tools filter (allow {list(source.allow)}, deny {list(source.deny)}); "
                    f"`mcp-supervisor call {source.extension} {tool.name}` still reaches it"
                )
    return None


Forward = Callable[[types.CallToolRequestParams], Awaitable[types.CallToolResult]]


async def call_meta(
    projection: Projection, params: types.CallToolRequestParams, forward: Forward
) -> types.CallToolResult | None:
    """Answer a search-mode meta-tool call; None if *params* names no meta-tool of this view.

    ``call_tool`` goes through *forward* (the gateway's own call path: progress, spool, errors).
    """
    if projection.view.mode != "search" or params.name not in _META_NAMES:
        return None
    args = params.arguments or {}
    if params.name == "search_tools":
        query, limit = args.get("query"), args.get("limit", DEFAULT_SEARCH_LIMIT)
        if not isinstance(query, str) or not isinstance(limit, int) or isinstance(limit, bool):
            return _error("search_tools takes a string 'query' and an integer 'limit'")
        found = [
            {
                "name": t.name,
                "description": t.description or "",
                "inputSchema": t.input_schema,
                "score": score,
            }
            for t, score in projection.search(query, max(1, min(limit, MAX_SEARCH_LIMIT)))
        ]
        return _json({"tools": found})
    name = args.get("name")
    tool = projection.tool(name) if isinstance(name, str) else None
    if tool is None:
        return _error(f"no tool named {name!r} here; search_tools gives the names")
    if params.name == "describe_tool":
        return _json(tool.model_dump(by_alias=True, exclude_none=True, mode="json"))
    arguments = args.get("arguments") or {}
    if not isinstance(arguments, dict):
        return _error("call_tool takes 'arguments' as an object")
    return await forward(params.model_copy(update={"name": tool.name, "arguments": arguments}))


def _json(value: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
