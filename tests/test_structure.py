"""The package's shape: public surfaces are declared, and imports flow one way, down the layers.

The layers, bottom first (:data:`LAYERS`): a module may import, at run time, modules of its
own layer's packages and of the layers below, never above. Inside a package the same holds
for its declared order (:data:`INSIDE`). No module is part of an import cycle.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
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

# Bottom first. Foundations, then the way a request travels: config values, processes, a
# child's stdio, the extension that owns it, the gateway and the control socket that reach
# extensions, the daemon that composes them, the CLI that drives it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "paths"),
    ("logs", "sockets"),
    ("config",),
    ("process",),
    ("child",),
    ("extension",),
    ("gateway",),
    ("control",),
    ("daemon",),
    ("cli",),
)


def source(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@cache
def runtime_imports(module: str) -> frozenset[str]:
    """The supervisor modules *module* imports at run time (TYPE_CHECKING blocks excluded), dotted."""
    tree = ast.parse(source(module).read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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
        """No module imports, at run time, from a layer above its own."""
        upward = sorted(m for m in runtime_imports(name) if layer(m) > layer(name))
        assert not upward, f"{name} imports from above: {upward}"

    def test_no_cycles(self) -> None:
        """The module import graph is acyclic: data flows one way."""
        visiting: list[str] = []
        done: set[str] = set()

        def walk(module: str) -> None:
            assert module not in visiting, f"import cycle: {' -> '.join([*visiting, module])}"
            if module in done:
                return
            visiting.append(module)
            for dependency in sorted(runtime_imports(module)):
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
