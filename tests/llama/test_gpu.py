"""The execution target through the host on this CPU build, layer fitting wired to llama.cpp, ``wasinn info``.

A guest's target (``load``'s argument, or the ``--nn-preload`` target for ``load_by_name``) becomes
the model's offloaded layer count; on a build without offload a GPU target logs one warning and
still runs.  An offload build is simulated by answering llama.cpp's offload and free-memory
questions with made-up values: the CPU build ignores the layer count, but the choice is the host's.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import pathlib
import struct
import subprocess
import sys
from collections.abc import Iterator

import llama_cpp
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.config.limits import Limits
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.config.preload import Target
from wasinn_host.core.registry import LoadedModel
from wasinn_host.llama import devices
from wasinn_host.llama.gguf_layout import read_layout
from wasinn_host.llama.model import LlamaModel, model_sizes
from wasinn_host.llama.offload import ALL_LAYERS, margin_for
from wasinn_host.llama.version import LLAMA_COMMIT
from wasinn_host.rpc.server import NNServer, ServeOptions
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.gguf_models import write_random_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUCC_A = "bcdefghijklmnopqrstuvwxyz</s>"
cpu_build = pytest.mark.skipif(devices.can_offload(), reason="describes a llama.cpp build without GPU offload")


@pytest.fixture
def target_registry(successor_path: pathlib.Path) -> Iterator[ModelRegistry]:
    """The successor model under one name per target, in a registry of its own."""
    reg = ModelRegistry([f"{t}:GGML:{t}:{successor_path}" for t in ("cpu", "gpu", "auto", "tpu")])
    yield reg
    reg.close()


def _model(reg: ModelRegistry, name: str | None = None) -> LoadedModel:
    models = [m for m in reg.loaded() if name is None or m.name == name]
    assert len(models) == 1
    return models[0]


def _layers(model: LoadedModel) -> int:
    assert isinstance(model.weights, LlamaModel)
    return model.weights.n_gpu_layers


def _offload_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "offload" in r.getMessage()]


@cpu_build
def test_gpu_target_on_a_cpu_build_warns_once_and_runs(
    target_registry: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    guest = AbiGuest.create(WasiNN(registry=target_registry))
    with caplog.at_level(logging.INFO, logger="wasinn_host"):
        rc, graph = guest.load_by_name("gpu")
        assert rc == 0
        assert guest.generate(graph, "a") == (0, SUCC_A)
        assert guest.load_by_name("gpu")[0] == 0, "the cached name: no second load, no second warning"
    (warning,) = _offload_warnings(caplog)
    assert "execution target GPU" in warning and "cannot offload" in warning and "running on the CPU" in warning
    assert 'CMAKE_ARGS="-DGGML_CUDA=on" pip install' in warning and "wasinn info" in warning
    model = _model(target_registry, "gpu")
    assert model.params.target is Target.GPU and model.params.n_gpu_layers is None
    assert _layers(model) == 0


@cpu_build
@pytest.mark.parametrize("name", ["cpu", "auto", "tpu"])
def test_cpu_auto_and_tpu_targets_map_to_no_layers_quietly(
    name: str, target_registry: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    guest = AbiGuest.create(WasiNN(registry=target_registry))
    with caplog.at_level(logging.INFO, logger="wasinn_host"):
        rc, graph = guest.load_by_name(name)
        assert rc == 0 and guest.generate(graph, "a") == (0, SUCC_A)
    assert _offload_warnings(caplog) == []
    model = _model(target_registry, name)
    assert model.params.target is Target[name.upper()]
    assert _layers(model) == 0


def test_explicit_n_gpu_layers_wins_over_the_target(
    target_registry: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    guest = AbiGuest.create(WasiNN(registry=target_registry))
    with caplog.at_level(logging.INFO, logger="wasinn_host"):
        rc, graph = guest.load_by_name("gpu", config='{"n-gpu-layers": 3}')
        assert rc == 0 and guest.generate(graph, "a") == (0, SUCC_A)
    assert _offload_warnings(caplog) == [], "an explicit layer count is the user's choice: no warning"
    assert _layers(_model(target_registry, "gpu")) == 3


def _load_bytes(guest: AbiGuest, model: bytes, target: int) -> tuple[int, int]:
    grown = guest.memory.grow(guest.store, (len(model) + 0x10000) // 0x10000 + 1)
    guest.write(grown * 0x10000, model)
    guest.write(guest.NAME, struct.pack("<2I", grown * 0x10000, len(model)))
    rc = guest.call("load", guest.NAME, 1, 6, target, guest.OUT32)
    return rc, guest.u32(guest.OUT32)


@cpu_build
@pytest.mark.parametrize(("target", "warned"), [(Target.CPU, False), (Target.GPU, True), (Target.TPU, False)])
def test_load_passes_the_guests_target_to_the_model(
    target: Target, warned: bool, successor_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    reg = ModelRegistry()
    try:
        guest = AbiGuest.create(WasiNN(registry=reg))
        with caplog.at_level(logging.INFO, logger="wasinn_host"):
            rc, graph = _load_bytes(guest, successor_path.read_bytes(), int(target))
            assert rc == 0 and guest.generate(graph, "a") == (0, SUCC_A)
        assert len(_offload_warnings(caplog)) == int(warned)
        model = _model(reg)
        assert model.params.target is target
        assert _layers(model) == 0
    finally:
        reg.close()


@pytest.mark.parametrize("target", [Target.CPU, Target.GPU, Target.TPU])
def test_load_over_rpc_passes_the_guests_target_to_the_server(
    target: Target, successor_path: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A model sent as bytes through ``--nn-rpc-uri`` gets the target the guest passed, on the server."""
    reg = ModelRegistry()
    sock = tmp_path / "nn.sock"
    server = NNServer(
        f"unix:{sock}", LocalBackend(reg, Limits(allow_load_bytes=True)), options=ServeOptions(allow_load_bytes=True)
    )
    server.start()
    client = WasiNN(rpc=f"unix:{sock}")
    try:
        guest = AbiGuest.create(client)
        rc, graph = _load_bytes(guest, successor_path.read_bytes(), int(target))
        assert rc == 0 and guest.generate(graph, "a") == (0, SUCC_A)
        assert _model(reg).params.target is target
    finally:
        client.close()
        server.stop(1)
        reg.close()


# -- an offload build, simulated ------------------------------------------------------


def _offload_build(monkeypatch: pytest.MonkeyPatch, free_bytes: int) -> None:
    monkeypatch.setattr(devices, "can_offload", lambda: True)
    monkeypatch.setattr(devices, "gpu_free_bytes", lambda: free_bytes)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """12 layers of 13.5 MiB (F16), 24 MiB of KV per layer for its default context (4 x 2048 cells)."""
    return write_random_model(tmp_path_factory.mktemp("gpu") / "random.gguf")


def test_model_sizes_come_from_the_gguf_header(random_model: pathlib.Path) -> None:
    model = LlamaModel(random_model, ModelParams(n_gpu_layers=0))
    try:
        layout = read_layout(random_model, devices.type_size)
        assert layout.total_bytes == model.size_bytes, "every tensor counted, as llama_model_size does"
        assert len(layout.layer_bytes) == llama_cpp.llama_model_n_layer(model.ptr) == 12
        sizes = model_sizes(random_model, ModelParams())
        assert sizes.n_layer == 12
        assert sizes.layer_bytes == layout.layer_bytes[0]
        # KV: F16 K and V of 768 values per cell, for 4 default sequences x 2048 cells
        assert sizes.kv_bytes_per_layer == 4 * 2048 * 2 * 768 * 2
        assert model_sizes(random_model, ModelParams(ctx_size=512, n_parallel=2)).kv_bytes_per_layer == 2 * 512 * 3072
    finally:
        model.close()


def _fitted_load(random_model: pathlib.Path, preload_target: str, config: str | None = None) -> int:
    """Load and run the model under a preload with ``preload_target``; return the layers chosen."""
    reg = ModelRegistry([f"m:GGML:{preload_target}:{random_model}"])
    try:
        guest = AbiGuest.create(WasiNN(registry=reg))
        rc, graph = guest.load_by_name("m", config)
        assert rc == 0
        assert guest.generate(graph, "ab", metadata='{"n-predict": 2, "temp": 0}')[0] == 0
        return _layers(_model(reg))
    finally:
        reg.close()


@pytest.mark.parametrize("target", ["gpu", "auto"])
def test_offload_build_with_room_offloads_every_layer(
    target: str, random_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _offload_build(monkeypatch, 24 << 30)
    with caplog.at_level(logging.INFO, logger="wasinn_host"):
        assert _fitted_load(random_model, target) == ALL_LAYERS
    (line,) = [r.getMessage() for r in caplog.records if "layers fit" in r.getMessage()]
    assert f"execution target {target.upper()}: all 12 layers fit" in line and "free on the GPU" in line


def test_offload_build_short_of_memory_offloads_what_fits(
    random_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sizes = model_sizes(random_model, ModelParams())
    free = margin_for(0) + 5 * (sizes.layer_bytes + sizes.kv_bytes_per_layer) + 1000
    _offload_build(monkeypatch, free)
    with caplog.at_level(logging.INFO, logger="wasinn_host"):
        assert _fitted_load(random_model, "auto") == 5
    assert any("5 of 12 layers fit" in r.getMessage() for r in caplog.records)
    # a smaller context needs less KV per layer: 12 x (13.5 MiB + 0.75 MiB) and the output fit in the same memory
    assert _fitted_load(random_model, "auto", '{"ctx-size": 256, "n-parallel": 1}') == ALL_LAYERS


def test_offload_build_cpu_target_and_explicit_layers_ignore_memory(
    random_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offload_build(monkeypatch, 24 << 30)
    assert _fitted_load(random_model, "cpu") == 0
    assert _fitted_load(random_model, "gpu", '{"n-gpu-layers": 4}') == 4


# -- wasinn info -----------------------------------------------------------------------


def wasinn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_info_json_describes_this_build() -> None:
    result = wasinn("info", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["llama_cpp_python"] == llama_cpp.__version__ == "0.3.36"
    assert info["llama_cpp"]["commit"] == LLAMA_COMMIT and info["llama_cpp"]["build_number"] == 11312
    assert info["wasmtime"] == importlib.metadata.version("wasmtime")
    assert "CPU" in info["backends"]
    cpus = [d for d in info["devices"] if d["type"] == "CPU"]
    assert cpus and 0 < cpus[0]["free_bytes"] <= cpus[0]["total_bytes"]
    assert info["gpu_offload"] is bool(llama_cpp.llama_supports_gpu_offload())
    assert info["gpu_offload"] or "CMAKE_ARGS" in info["gpu_hint"]
    assert info["gpu_offload"] == any(d["type"] in ("GPU", "IGPU") for d in info["devices"])
    assert info["multimodal"] is True, "llama-cpp-python 0.3.36 ships libmtmd"


@cpu_build
def test_info_text_says_whether_offload_works() -> None:
    result = wasinn("info")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["wasinn-host", importlib.metadata.version("wasinn-host")]
    assert any(line.startswith("llama.cpp") and "build b11312" in line for line in lines)
    assert any(line.startswith("backends") and "CPU" in line for line in lines)
    assert any(line.startswith("GPU offload") and "no: this build runs on the CPU only" in line for line in lines)
    assert 'CMAKE_ARGS="-DGGML_CUDA=on"' in result.stdout
    assert any(line.startswith("multimodal") and "yes" in line for line in lines)


def test_info_usage_error_is_one_line_and_exit_code_2() -> None:
    result = wasinn("info", "--bogus")
    assert result.returncode == 2
    assert "unrecognized arguments: --bogus" in result.stderr


@cpu_build
def test_metadata_n_gpu_layers_matching_the_targets_choice_is_not_a_change(
    target_registry: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    guest = AbiGuest.create(WasiNN(registry=target_registry))
    ctx = guest.init(guest.load_by_name("auto")[1])[1]
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        assert guest.set_input(ctx, 1, '{"n-gpu-layers": 0}') == 0
        assert not any("n-gpu-layers" in r.getMessage() for r in caplog.records), "0 is what AUTO chose here"
        assert guest.set_input(ctx, 1, '{"n-gpu-layers": 5}') == 0
    assert any("n-gpu-layers=5 (loaded with 0)" in r.getMessage() for r in caplog.records)
