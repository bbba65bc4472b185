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
MODULES = sorted(info.name for info in pkgutil.iter_modules([str(PACKAGE)]) if info.name != "__main__")


def runtime_imports(module: str) -> set[str]:
    """The supervisor modules *module* imports at run time (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("supervisor"):
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("supervisor."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & set(MODULES)


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
        """Nothing but configfile.py imports YAML, and only config.py imports configfile."""
        readers = [m for m in MODULES if "import yaml" in (PACKAGE / f"{m}.py").read_text()]
        assert readers == ["configfile"]
        assert {m for m in MODULES if "configfile" in runtime_imports(m)} == {"config"}

    def test_config_is_imported_only_by_the_edges(self) -> None:
        """At run time only daemon and cli import config; extension gets a plain value."""
        assert {m for m in MODULES if "config" in runtime_imports(m)} <= {"daemon", "cli"}

    def test_no_cycles(self) -> None:
        """The import graph is acyclic: data flows one way."""
        graph = {m: runtime_imports(m) for m in MODULES}
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

        for module in MODULES:
            walk(module)

    @pytest.mark.parametrize("leaf", ["state", "errors", "backoff", "paths"])
    def test_leaves_stay_leaves(self, leaf: str) -> None:
        """The vocabulary modules depend on nothing above them."""
        assert runtime_imports(leaf) <= {"state", "errors"}
