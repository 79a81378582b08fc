"""Start-up stays light: ``wasinn run`` of a core module imports neither gRPC nor the component
front end, and the package has no import cycles (counting imports inside functions and
``TYPE_CHECKING`` blocks, which hide a cycle from the interpreter but not from a reader)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "wasinn_host"

CHECK = """
import sys
import wasinn_host.cli
print(sorted(m for m in sys.modules if m.split(".")[0] == "grpc" or m.startswith("wasinn_host.wit")
             or m.startswith("wasinn_host.rpc.") and m != "wasinn_host.rpc.targets"))
"""


def test_importing_the_cli_imports_neither_grpc_nor_the_component_front_end() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _module_names() -> dict[str, pathlib.Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its text."""
    modules = _module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
                targets += submodules
                if len(submodules) < len(node.names):
                    targets.append(module)
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
