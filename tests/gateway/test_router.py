"""The router: exposed names to extensions, within each client's view, cached per catalog and view."""

from __future__ import annotations

from types import SimpleNamespace

import mcp_types as types

from supervisor.extension.state import State
from supervisor.gateway.router import MAX_ROUTES, Router
from supervisor.gateway.view.profiles import Chosen, Views
from supervisor.upstream.listing import Listing


def _listing(*names: str) -> Listing:
    tools = tuple(
        types.Tool(name=n, description=f"The {n} tool.", input_schema={"type": "object"}) for n in names
    )
    return Listing.of(tools=tools)


def _profile(**fields: object) -> SimpleNamespace:
    defaults = {
        "extensions": None,
        "tools": SimpleNamespace(allow=["*"], deny=[]),
        "mode": "list",
        "max_tools": 128,
    }
    return SimpleNamespace(**{**defaults, **fields})


class TestRoute:
    def test_the_fast_path_route_honours_views(self) -> None:
        """Router.route: a direct target only when the client's view admits it; else the handler decides."""

        def ext(name: str, *tools: str) -> SimpleNamespace:
            config = SimpleNamespace(prefix=None, tools=SimpleNamespace(allow=["*"], deny=["rm*"]))
            listing = _listing(*tools)
            return SimpleNamespace(
                name=name,
                config=config,
                state=State.RUNNING,
                listing=lambda: listing,
                offered=lambda: listing,
                known_listing=lambda: listing,
            )

        backend = SimpleNamespace(extensions=lambda: [ext("fs", "read_file", "rm_file"), ext("git", "log")])
        router = Router(backend, Views({"git": _profile(extensions=["git"]), "s": _profile(mode="search")}))
        assert router.route("fs__read_file") == ("fs", "read_file")
        assert router.route("fs__rm_file") is None  # the extension's own filter
        assert router.route("fs__read_file", Chosen("git")) is None
        assert router.route("git__log", Chosen("git")) == ("git", "log")
        assert router.route("search_tools", Chosen("s")) is None  # a meta-tool: the handler's
        assert router.route("git__log", Chosen("gone")) is None

    def test_cached_routes_follow_the_catalog_and_the_profiles_and_stay_bounded(self) -> None:
        """The fast path's route cache: a listing change, a profile change, and its size bound."""

        tools = ["read_file"]
        config = SimpleNamespace(prefix=None, tools=SimpleNamespace(allow=["*"], deny=[]))
        listing = lambda: _listing(*tools)  # noqa: E731
        fs = SimpleNamespace(
            name="fs",
            config=config,
            state=State.RUNNING,
            listing=listing,
            offered=listing,
            known_listing=listing,
        )
        router = Router(SimpleNamespace(extensions=lambda: [fs]), Views({}))
        assert router.route("fs__read_file") == ("fs", "read_file")
        assert router.route("fs__read_file") == ("fs", "read_file")  # now from the cache
        tools[:] = ["write_file"]  # the child's tools changed
        router.invalidate()
        assert router.route("fs__read_file") is None
        assert router.route("fs__write_file") == ("fs", "write_file")
        router.views.configure({"p": _profile(tools=SimpleNamespace(allow=["*"], deny=["*write*"]))})
        assert router.route("fs__write_file", Chosen("p")) is None
        router.views.configure({"p": _profile()})  # a reload allows it again, same catalog
        assert router.route("fs__write_file", Chosen("p")) == ("fs", "write_file")
        for n in range(2 * MAX_ROUTES):  # as many views as clients could make up
            assert router.route("fs__write_file", Chosen(f"x{n}")) is None
            assert router.route(f"fs__made_up_{n}") is None  # unknown names are never kept
        assert len(router) <= MAX_ROUTES
