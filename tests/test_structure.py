"""The package's shape: public surfaces are declared, and imports flow one way, down the layers.

The layers, bottom first (:data:`LAYERS`): a module may import modules of its own layer's
packages and of the layers below, never above, type-only imports included. Inside a package the same holds
for its declared order (:data:`INSIDE`). No module is part of an import cycle.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import supervisor

PACKAGE = Path(supervisor.__file__).parent
MODULES = sorted(  # dotted, relative to the package: "daemon", "gateway.names", ...
    info.name.removeprefix("supervisor.")
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="supervisor.")
    if not info.name.endswith("__main__")
)

# Bottom first. Foundations, then the way a request travels: config values, processes, the MCP
# session every upstream kind shares, a child's stdio, the extension that owns it, the gateway
# and the control socket that reach extensions, the daemon that composes them, the CLI.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "paths", "peers", "privatefiles"),
    ("logs", "streams", "sockets"),
    ("config",),
    ("process",),
    ("upstream",),
    ("child", "remote"),
    ("extension",),
    ("gateway",),
    ("control",),
    ("dashboard",),
    ("daemon",),
    ("cli",),
)


# Inside each package, bottom first: a module imports its own layer's modules or lower ones, never
# higher. Together with LAYERS this is the architecture; docs/architecture.md draws it.
INSIDE: dict[str, tuple[tuple[str, ...], ...]] = {
    "config": (
        ("secrets", "clientkeys", "runners", "snippets", "file", "sandboxes", "remotes"),
        ("fields",),
        ("extension",),
        ("settings", "importer"),
        ("migrate",),
    ),
    "process": (
        (
            "tree", "cgroups", "sandbox.install", "sandbox.system", "sandbox.landlock", "sandbox.mounts",
            "sandbox.seccomp", "sandbox.pidsgroup",
        ),
        ("reaper", "guardian", "usage", "sandbox.policy", "sandbox.launch", "sandbox.host", "sandbox.caches"),
        ("spawner", "sandbox"),
        ("teardown",),
        ("children",),
        ("containment",),
    ),
    "upstream": (("listing", "wire", "media", "scan", "raw"), ("diverted",), ("session", "spool")),
    "remote": (
        ("deadlines", "traffic", "tokens", "explain"),
        ("http",),
        ("rawcalls",),
        ("upstream",),
        ("auth", "connection"),
        ("login",),
        ("device",),
    ),
    "child": (
        ("wire",),
        ("rawcalls",),
        ("pipes",),
        ("connection",),
    ),
    "extension": (
        ("upstream",),
        ("state", "asking", "saved", "startup", "liveness", "launch", "pinfile"),
        ("backoff", "pins", "demand", "inline", "run"),
        ("childrun", "remoterun"),
        ("calls", "watcher", "served"),
        ("supervised",),
        ("instances",),
    ),
    "gateway": (
        (
            "names", "toolerrors", "progress", "owner", "hello", "spoollinks", "http.limits",
            "tasks.ids", "tasks.owners", "asks.requeststate", "view.search", "notify.downstream",
            "notify.bus", "handoff.journal", "handoff.offer", "replies", "outbound", "fast.parse",
        ),
        ("handoff.stream", "handoff.backchannel"),
        ("catalog", "links"),
        ("fast.answers",),
        ("view.profiles",),
        ("session",),
        ("router", "asks.callers", "handoff.handed"),
        ("asks.parked",),
        ("asks.inputrequired", "notify.requestlogs", "notify.releases"),
        ("notify.fanout",),
        ("notify.listen", "fast.runner", "tasks.router", "handlers"),
        ("server",),
        ("stdio",),
        ("unix", "http.connections", "http.bodies", "http.sessions", "http.guard"),
        ("http.fastcalls",),
        ("http.quick",),
        ("http.listener",),
        ("http",),
    ),
    "control": (("codes", "methods", "client"), ("rpc",), ("server",)),
    "dashboard": (("passes", "live"), ("asgi",), ("pages",)),
    "daemon": (
        (
            "fdlimits", "health", "metrics", "systemd", "reload", "identity", "callers", "httptoken",
            "logins", "recent", "web",
        ),
        ("headstart", "facade"),
        ("root",),
        ("run",),
    ),
    "cli": (
        ("render", "demo", "connect.lines", "connect.loop"),
        ("connect.resume",),
        ("connect.pump", "connect.handoff", "connect.dial"),
        ("connect", "main"),
        ("remote", "local"),
    ),
}  # fmt: skip
MAX_LINES = 400  # a module longer than this is two concerns: split it along its seams


def source(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@cache
def runtime_imports(module: str, *, typing: bool = False) -> frozenset[str]:
    """The supervisor modules *module* imports at run time (with *typing*: in TYPE_CHECKING blocks
    too), dotted."""
    tree = ast.parse(source(module).read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing:
            return
        if isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: relative import (the package uses absolute ones)"
            if node.module and node.module.startswith("supervisor"):
                base = node.module.removeprefix("supervisor").removeprefix(".")
                for alias in node.names:
                    name = f"{base}.{alias.name}" if base else alias.name
                    found.add(name if name in MODULES else base)
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("supervisor.") for a in node.names if a.name.startswith("supervisor.")
            )
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return frozenset(found - {module, ""})


def layer(module: str) -> int:
    top = module.split(".")[0]
    return next(n for n, names in enumerate(LAYERS) if top in names)


def bare_face(module: str) -> bool:
    """A package's ``__init__`` that imports nothing: a docstring naming its modules."""
    return source(module).name == "__init__.py" and not runtime_imports(module, typing=True)


def inner_layer(module: str) -> int | None:
    """*module*'s layer inside its package (None: the package's face, or a foundation module)."""
    package, _, rest = module.partition(".")
    if not rest or rest.endswith("__main__") or bare_face(module):
        return None
    return next(n for n, names in enumerate(INSIDE[package]) if rest in names)


class TestPublicSurface:
    @pytest.mark.parametrize("name", MODULES)
    def test_all_is_a_complete_tuple(self, name: str) -> None:
        """Each module declares __all__ as a tuple naming every public class and function it defines."""
        module = importlib.import_module(f"supervisor.{name}")
        assert isinstance(getattr(module, "__all__", None), tuple), f"{name} has no __all__ tuple"
        defined = {
            attr
            for attr, value in vars(module).items()
            if not attr.startswith("_")
            and (inspect.isclass(value) or inspect.isfunction(value))
            and value.__module__ == module.__name__
        }
        missing = defined - set(module.__all__)
        assert not missing, f"{name}: missing from __all__: {missing}"


class TestLayers:
    def test_every_package_has_a_layer(self) -> None:
        assert {m.split(".")[0] for m in MODULES} == {name for names in LAYERS for name in names}

    @pytest.mark.parametrize("name", MODULES)
    def test_imports_go_down_the_layers(self, name: str) -> None:
        """No module imports from a layer above its own, type-only imports included: a drawing
        of the imports shows those too."""
        upward = sorted(m for m in runtime_imports(name, typing=True) if layer(m) > layer(name))
        assert not upward, f"{name} imports from above: {upward}"

    def test_every_module_has_a_place_in_its_package(self) -> None:
        declared = {
            f"{package}.{name}" for package, layers in INSIDE.items() for names in layers for name in names
        }
        inner = {m for m in MODULES if "." in m and not m.endswith("__main__") and not bare_face(m)}
        assert inner == declared

    @pytest.mark.parametrize("name", [m for m in MODULES if "." in m])
    def test_imports_go_down_inside_a_package(self, name: str) -> None:
        """Inside a package, no module imports one declared above it (type-only imports count)."""
        own = inner_layer(name)
        package = name.split(".")[0]
        same = [m for m in runtime_imports(name, typing=True) if m.startswith(f"{package}.")]
        upward = sorted(
            m for m in same if (theirs := inner_layer(m)) is not None and own is not None and theirs > own
        )
        assert not upward, f"{name} imports from above it in {package}: {upward}"

    @pytest.mark.parametrize("name", MODULES)
    def test_modules_stay_small(self, name: str) -> None:
        lines = len(source(name).read_text().splitlines())
        assert lines <= MAX_LINES, f"{name} is {lines} lines: split it along its seams"

    def test_no_cycles(self) -> None:
        """The module import graph is acyclic, type-only imports included: data flows one way."""
        visiting: list[str] = []
        done: set[str] = set()

        def walk(module: str) -> None:
            assert module not in visiting, f"import cycle: {' -> '.join([*visiting, module])}"
            if module in done:
                return
            visiting.append(module)
            for dependency in sorted(runtime_imports(module, typing=True)):
                walk(dependency)
            visiting.pop()
            done.add(module)

        for module in MODULES:
            walk(module)


class TestBoundaries:
    def test_only_the_config_file_reader_reads_yaml(self) -> None:
        """Nothing but config/file.py imports YAML; settings and the client-file commands use it."""
        readers = [m for m in MODULES if "import yaml" in source(m).read_text()]
        assert readers == ["config.file"]
        users = {m for m in MODULES if "config.file" in runtime_imports(m)}
        assert users == {"config.settings", "config.importer", "config.migrate"}

    def test_settings_are_loaded_only_at_the_edges(self) -> None:
        """At run time only the daemon and the CLI import the settings; the rest gets plain values."""
        users = {m.split(".")[0] for m in MODULES if "config.settings" in runtime_imports(m)}
        assert users <= {"config", "daemon", "cli"}

    def test_the_guardian_imports_the_standard_library_only(self) -> None:
        """It runs in a bare ``python -I -S``: its own modules, and nothing that pulls in more."""
        reached, todo = set(), ["process.guardian"]
        while todo:
            module = todo.pop()
            reached.add(module)
            todo += [m for m in runtime_imports(module) if m not in reached]
        assert reached <= {"process", "process.guardian", "process.tree", "process.cgroups"}


class TestConnect:
    def test_connect_imports_only_what_a_pump_needs(self) -> None:
        """``mcp-supervisor connect`` runs in every client's process tree: no pydantic, no MCP SDK, no
        logging framework, and no asyncio (whose import of ``ssl`` maps OpenSSL: 8 of connect's
        22 MiB); it starts in a fraction of the daemon's import time (issue 19)."""
        probe = (
            "import sys\n"
            "import importlib\n"
            "importlib.import_module('supervisor.cli.main')._parse(['connect'])\n"
            "import supervisor.cli.connect\n"
            "print(' '.join(sorted(sys.modules)))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
        )
        loaded = set(done.stdout.split())
        heavy = {"pydantic", "pydantic_core", "mcp", "mcp_types", "structlog", "yaml", "psutil", "uvicorn"}
        heavy |= {"asyncio", "anyio", "ssl", "concurrent", "threading"}
        assert not heavy & {module.split(".")[0] for module in loaded}
        ours = {m.removeprefix("supervisor.") for m in loaded if m.startswith("supervisor.")}
        allowed = {"cli", "cli.main", "cli.connect", "errors", "paths", "peers", "gateway", "gateway.hello"}
        allowed |= {"cli.connect.lines", "cli.connect.loop", "cli.connect.pump", "cli.connect.resume"}
        allowed |= {"cli.connect.handoff", "cli.connect.dial", "gateway.handoff", "gateway.handoff.journal"}
        allowed |= {"extension", "extension.backoff"}
        assert ours <= allowed, sorted(ours - allowed)


class TestTestsLayout:
    def test_test_folders_mirror_the_package(self) -> None:
        """A module's tests sit in the folder of its package, so a newcomer finds them by name:
        ``supervisor/gateway/http/`` is tested in ``tests/gateway/http/``. Besides the mirror:
        the harness, the fixture servers, the published servers (interop) and their data."""
        tests = Path(__file__).resolve().parent
        apart = {"harness", "servers", "interop", "data"}
        strays = [
            str(folder.relative_to(tests))
            for folder in sorted({path.parent for path in tests.rglob("test_*.py")})
            if folder != tests
            and folder.relative_to(tests).parts[0] not in apart
            and not (PACKAGE / folder.relative_to(tests)).is_dir()
        ]
        assert not strays, f"test folders with no package of that name: {strays}"
