"""wasi:nn components written in Python (componentize-py, standard bindings) on this host, for
0.2.0-rc-2024-10-28 and 0.2.0-rc-2024-08-19, and the compile cache on a guest that is expensive to
compile (about 18 MB)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

SOURCE = GUESTS / "components" / "python"


def build_python_guest(build: pathlib.Path, module: str, world: str) -> pathlib.Path:
    """guest_examples/components/python/MODULE.py built for WORLD as its docstring says (about 15-30 s)."""
    shutil.copytree(GUESTS / "components" / "wit" / "deps", build / "wit" / "deps")
    shutil.copy(SOURCE / "world.wit", build / "wit" / "world.wit")
    out = build / f"{module}.wasm"
    command = ["componentize-py", "-d", str(build / "wit"), "-w", world, "componentize", module]
    subprocess.run([*command, "-o", str(out)], cwd=SOURCE, check=True, capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def py_complete(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    """py_complete.py for wasi:nn 0.2.0-rc-2024-10-28."""
    yield build_python_guest(tmp_path_factory.mktemp("pyguest"), "py_complete", "py-command")


def run(nn: WasiNN, guest: object, tmp_path: pathlib.Path, *args: str) -> tuple[int, str, str]:
    out, err = tmp_path / "out", tmp_path / "err"
    code = nn.run(guest, list(args), RunOptions(stdout=str(out), stderr=str(err)))  # type: ignore[arg-type]
    return code, out.read_text(), err.read_text()


def test_python_component_guest(py_complete: pathlib.Path, registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    nn = WasiNN(registry=registry, compile_cache=tmp_path / "cache")
    start = time.perf_counter()
    guest = nn.load_guest(py_complete)
    cold = time.perf_counter() - start
    code, out, err = run(nn, guest, tmp_path, "succ", "hello")
    assert (code, out.splitlines()[0]) == (0, f"output: {successor_text('hello')}</s>")
    assert out.splitlines()[1].startswith('metadata: {"input_tokens": 6, "output_tokens": 12, ')
    # Hayride's convention: an options tensor, one output named Output
    code, out, err = run(nn, guest, tmp_path, "succ", "hello", '{"max_predict": 4, "temperature": 0}')
    assert (code, out) == (0, f"Output: {successor_text('hello', 4)}\n")
    code, out, err = run(nn, guest, tmp_path, "nope", "hello")
    assert (code, out) == (1, "")
    assert err.startswith("NOT_FOUND: load-by-name: model name 'nope' is not preloaded; known names: ")

    again = WasiNN(registry=registry, compile_cache=tmp_path / "cache")
    start = time.perf_counter()
    cached = again.load_guest(py_complete)
    warm = time.perf_counter() - start
    assert again.compile_cache is not None and (again.compile_cache.hits, again.compile_cache.misses) == (1, 0)
    assert warm < cold / 10, (cold, warm)  # here: about 10 s to compile, 0.1 s from the cache
    code, out, err = run(again, cached, tmp_path, "succ", "m")
    assert (code, out.splitlines()[0]) == (0, f"output: {successor_text('m')}</s>")


def test_python_guest_built_for_2024_08_19(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    # bindings componentize-py generates from the 08-19 WIT: set-input, compute(), get-output
    nn = WasiNN(registry=registry)
    guest = nn.load_guest(build_python_guest(tmp_path / "build", "py_set_input", "py-command-2024-08-19"))
    current = run(nn, GUESTS / "components" / "nn_complete.wasm", tmp_path, "succ", "hello")[:2]
    assert current == (0, successor_text("hello") + "</s>\n")
    assert run(nn, guest, tmp_path, "succ", "hello")[:2] == current
    assert run(nn, guest, tmp_path, "succ", "m", '{"n-predict": 3}')[:2] == (0, successor_text("m", 3) + "\n")
    code, out, err = run(nn, guest, tmp_path, "nope", "m")
    assert (code, out) == (1, "")
    assert err.startswith("NOT_FOUND: load-by-name: model name 'nope' is not preloaded; known names: ")
