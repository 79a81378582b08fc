"""The package keeps its layers: each package imports only the packages below it in :data:`LAYERS`.

Every module of ``wasinn_host`` is parsed, and every import counts wherever it is: at the top, inside a
function (a lazy import is still a dependency) or under ``TYPE_CHECKING``.  A name imported from the
package root (``from wasinn_host import WasiNN``) counts as an import of the module that defines it.
The root itself stands in the host's layer (it re-exports the host's public names, and a plain
``import wasinn_host`` must not depend on the test tooling or the command line); the modules its
``_LAZY`` table imports on first use count as its imports.  A backend's own library counts as its
package (:data:`BACKEND_LIBRARIES`: ``import llama_cpp`` is an import of ``llama/``), so ``core/`` and
the front ends import no llama.cpp.
The front ends share a layer, never import each other and reach the models only through ``backend/``
(never ``llama/``); the one exception is the gRPC server, which serves the ``wasi_ephemeral_nn`` ABI and
so uses that ABI's rules (:data:`EXCEPTIONS`), never its wasm binding.  A new package must be given its
place in the table.
Inside ``core/``, the sub-packages (its rooms: :data:`CORE_ROOMS`) import each other downwards only; the
modules at the top of ``core/`` are shared by every room and stand in none.
"""

from __future__ import annotations

import ast
import pathlib
import shutil

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "wasinn_host"
ROOT = "wasinn_host"

LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("bench",),
    ("pytest_plugin", "testing"),
    ("host", "session", "aio"),
    ("launch",),
    ("ephemeral", "wit", "rpc", "sockets"),
    ("guest",),
    ("backend",),
    ("llama",),
    ("core",),
    ("observability",),
]
"""The packages (and top-level modules), top layer first."""
BACKEND_LIBRARIES = {"llama_cpp": "llama"}
"""Third-party packages a backend wraps -> that backend's package: importing one counts as importing it."""
LEAVES = frozenset({"models"})
"""Imported by anyone, importing nothing of the package (the demo model's data)."""
SAME_LAYER = frozenset(
    {
        ("pytest_plugin", "testing"),
        ("host", "session"),
        ("host", "aio"),
        ("aio", "session"),
        ("", "host"),
        ("", "session"),
        ("", "aio"),
    }
)
"""(importer, imported) pairs of one layer that may import each other in this direction."""
FRONT_ENDS = frozenset({"ephemeral", "wit", "rpc", "sockets"})
FRONT_END_BELOW = frozenset({"guest", "backend", "core", "observability"})
"""All a front end may import below it: never the llama.cpp backend (it reaches models through backend/)."""
EXCEPTIONS = frozenset(
    {
        ("rpc", "wasinn_host.ephemeral.errno"),
        ("rpc", "wasinn_host.ephemeral.execution"),
        ("rpc", "wasinn_host.ephemeral.handles"),
        ("rpc", "wasinn_host.ephemeral.tensor_check"),
    }
)
"""(importer package, imported module): the gRPC server serves the ``wasi_ephemeral_nn`` ABI with its
handle tables, execution contexts, tensor checks and errno mapping."""
CORE_ROOMS: list[tuple[str, ...]] = [
    ("scheduling", "tts"),
    ("config",),
    ("prompt_cache",),
]
"""``core/``'s sub-packages, top first: a room imports only rooms below it (a room of the same line: never)."""
LAYER = {name: index for index, names in enumerate(LAYERS) for name in names}
ROOM = {name: index for index, names in enumerate(CORE_ROOMS) for name in names}
ROOT_LAYER = LAYER["host"]
"""The root's layer (its unit is ``''``): it re-exports the host's public names, and names below."""
LAZY_TABLE = "_LAZY"
"""The root's table of names imported on first use (name -> module): each entry counts as an import."""


def module_names(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package at ``package``."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import of the package in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if name == ROOT and isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(isinstance(t, ast.Name) and t.id == LAZY_TABLE for t in node.targets):
                for k, v in zip(node.value.keys, node.value.values):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                        found.append((v.value, [str(k.value)], v.lineno))
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [a.name for a in node.names]
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            found += [(sub, [], node.lineno) for sub in submodules]
            rest = [n for n in names if f"{module}.{n}" not in modules]
            if rest:
                found.append((module, rest, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
    roots = (ROOT, *BACKEND_LIBRARIES)
    return [(module, names, line) for module, names, line in found if module.split(".")[0] in roots]


def root_exports(modules: dict[str, pathlib.Path]) -> dict[str, str]:
    """Name -> the module defining it, for the names the package root imports (``__version__``: the root)."""
    return {n: module for module, names, _ in imports_of(ROOT, modules[ROOT], modules) for n in names}


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to; '' for the root; a backend's library: the
    backend's package."""
    parts = module.split(".")
    if parts[0] in BACKEND_LIBRARIES:
        return BACKEND_LIBRARIES[parts[0]]
    return parts[1] if len(parts) > 1 else ""


def room(module: str) -> str:
    """The room of ``core/`` a module is in ('' for any other module, ``core/``'s top-level ones included)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == [ROOT, "core"] and parts[2] in ROOM else ""


def room_allowed(importer: str, target: str) -> bool:
    """Whether module ``importer`` may import module ``target`` as far as ``core/``'s rooms go."""
    mine, theirs = room(importer), room(target)
    return not (mine and theirs and mine != theirs) or ROOM[theirs] > ROOM[mine]


def allowed(importer: str, target: str) -> bool:
    """Whether a module of package ``importer`` may import module ``target``."""
    to = unit(target)
    if to in ("", importer) or to in LEAVES:
        return True
    if (importer, to) in SAME_LAYER or (importer, target) in EXCEPTIONS:
        return True
    if importer in FRONT_ENDS and to not in FRONT_END_BELOW:
        return False
    return LAYER[to] > (ROOT_LAYER if importer == "" else LAYER[importer])


def violations(package: pathlib.Path) -> list[str]:
    """``module:line imports target`` for every import that does not point down the table."""
    modules = module_names(package)
    exports = root_exports(modules)
    found = []
    for name, path in modules.items():
        importer = unit(name)
        if importer == "__main__":
            continue  # ``python -m wasinn_host`` is the command line: it stands above every layer
        for module, names, line in imports_of(name, path, modules):
            targets = [exports.get(n, ROOT) for n in names] if module == ROOT else [module]
            found += [
                f"{name}:{line} imports {t}" for t in targets if not (allowed(importer, t) and room_allowed(name, t))
            ]
    return found


def test_every_package_has_its_place_in_the_table() -> None:
    units = {unit(name) for name in module_names(PACKAGE)} - {"", "__main__"}
    assert units - set(LAYER) - LEAVES == set()
    assert set(LAYER) | LEAVES <= units  # and the table names no package that is gone


def test_every_room_of_core_has_its_place_in_the_table() -> None:
    core = PACKAGE / "core"
    assert {p.parent.name for p in core.glob("*/__init__.py")} == set(ROOM)


def test_every_import_points_down_the_layers() -> None:
    assert violations(PACKAGE) == []


def test_the_ephemeral_modules_rpc_uses_stay_off_the_wasm_binding() -> None:
    """The exception stays narrow: the ABI modules the gRPC server uses import, of their own package, only
    each other (so never ``ephemeral/imports.py`` and guest memory)."""
    modules = module_names(PACKAGE)
    shared = {target for _, target in EXCEPTIONS}
    for name in shared:
        own = {m for m, _, _ in imports_of(name, modules[name], modules) if unit(m) == "ephemeral"}
        assert own <= shared, name


PLANTED = [
    (
        "core/registry.py",
        "def _runtime() -> object:\n    from ..llama.runtime import LlamaRuntime\n\n    return LlamaRuntime\n",
    ),
    ("core/inference.py", "from ..backend.status import model_status\n"),
    ("observability/metrics.py", "from ..core.registry import ModelRegistry\n"),
    ("backend/fake.py", "from ..testing.successor import successor_of\n"),
    ("testing/guest_harness.py", "from ..cli.run import run_command\n"),
    ("wit/imports.py", "from ..ephemeral.handles import HandleTables\n"),
    ("wit/store_state.py", "from ..ephemeral import errno\n"),
    ("sockets/table.py", "import wasinn_host.ephemeral.imports\n"),
    ("rpc/sessions.py", "from ..ephemeral.imports import WasiNNImports\n"),
    (
        "ephemeral/imports.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..rpc.client import RemoteBackend\n",
    ),
    ("guest/stdout.py", "from ..launch.runner import EXIT_TRAP\n"),
    ("launch/runner.py", "from wasinn_host import WasiNN\n"),
    ("llama/runtime.py", "from ..backend.protocol import Backend\n"),
    ("wit/llm_mapping.py", "from ..llama.bindings import llama_cpp\n"),
    ("session.py", "from .host import WasiNN\n"),
    (
        "core/config/keys.py",
        "def _gbnf(schema: str) -> str:\n"
        "    from llama_cpp.llama_grammar import json_schema_to_gbnf\n\n"
        "    return str(json_schema_to_gbnf(schema))\n",
    ),
    ("core/chat_template.py", "import llama_cpp\n"),
    ("wit/imports.py", "from llama_cpp import llama_cpp as bindings\n"),
    ("__init__.py", "if TYPE_CHECKING:\n    from .testing.guest_harness import RunGuest\n"),
    ("__init__.py", '_LAZY = {**_LAZY, "GuestResult": "wasinn_host.testing.guest_harness"}\n'),
    ("__init__.py", "from .cli import main\n"),
    ("core/config/params.py", "from ..scheduling.decode_parts import parts\n"),
    ("core/prompt_cache/entry.py", "from ..config.params import ModelParams\n"),
    ("core/tts/graph.py", "from ..scheduling.stop_rules import cut_at_stop\n"),
    ("core/scheduling/stop_rules.py", "from ..tts.text import normalize_text\n"),
]
"""Imports that would undo the layout, one per kind of issue 29's upward and sideways imports and of issue 39's
(llama.cpp in ``core/``, the test tooling in the package root, a room of ``core/`` importing upwards or
sideways)."""


@pytest.mark.parametrize(("module", "line"), PLANTED, ids=[m for m, _ in PLANTED])
def test_a_planted_upward_import_is_found(tmp_path: pathlib.Path, module: str, line: str) -> None:
    copy = tmp_path / ROOT
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.gguf"))
    path = copy / module
    path.write_text(path.read_text() + "\n" + line)
    found = violations(copy)
    assert len(found) == 1, found
    parts = [ROOT, *module.removesuffix(".py").split("/")]
    assert found[0].startswith(".".join(parts[:-1] if parts[-1] == "__init__" else parts) + ":")
