"""The package's shape: public surfaces are declared, and imports flow one way."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import supervisor

PACKAGE = Path(supervisor.__file__).parent
MODULES = sorted(  # dotted, relative to the package: "daemon", "gateway", "gateway.names", ...
    info.name.removeprefix("supervisor.")
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="supervisor.")
    if not info.name.endswith("__main__")
)
NODES = sorted({m.split(".")[0] for m in MODULES})  # a subpackage is one node of the import graph


def source(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def runtime_imports(module: str) -> set[str]:
    """The top-level supervisor modules *module* imports at run time (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(source(module).read_text())
    depth = module.count(".") + (1 if source(module).name == "__init__.py" else 0)
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's place in the package
                base = module.split(".")[: max(0, depth + 1 - node.level)] if node.level <= depth + 1 else []
                target = [*base, *(node.module.split(".") if node.module else [])]
                found.update([target[0]] if target else [alias.name for alias in node.names])
            elif node.module and node.module.startswith("supervisor"):
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("supervisor."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return (found & set(NODES)) - {module.split(".")[0]}


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


class TestImports:
    def test_only_the_config_file_reader_reads_yaml(self) -> None:
        """Nothing but configfile.py imports YAML; config.py and the import command use configfile."""
        readers = [m for m in MODULES if "import yaml" in source(m).read_text()]
        assert readers == ["configfile"]
        assert {m for m in MODULES if "configfile" in runtime_imports(m)} == {"config", "importer", "migrate"}

    def test_config_is_imported_only_by_the_edges(self) -> None:
        """At run time only daemon and cli import config; extension gets a plain value."""
        assert {m for m in MODULES if "config" in runtime_imports(m)} <= {"daemon", "cli"}

    def test_no_cycles(self) -> None:
        """The import graph is acyclic: data flows one way."""
        graph: dict[str, set[str]] = {node: set() for node in NODES}
        for module in MODULES:
            graph[module.split(".")[0]] |= runtime_imports(module)
        visiting: list[str] = []
        done: set[str] = set()

        def walk(module: str) -> None:
            assert module not in visiting, f"import cycle: {' -> '.join([*visiting, module])}"
            if module in done:
                return
            visiting.append(module)
            for dependency in graph[module]:
                walk(dependency)
            visiting.pop()
            done.add(module)

        for node in NODES:
            walk(node)

    @pytest.mark.parametrize("leaf", ["state", "errors", "backoff", "paths"])
    def test_leaves_stay_leaves(self, leaf: str) -> None:
        """The vocabulary modules depend on nothing above them."""
        assert runtime_imports(leaf) <= {"state", "errors"}
