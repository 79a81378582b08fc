"""Layers on a real GPU backend: ``n-gpu-layers`` and the GPU target offload (llama.cpp's log says how
many layers and which device holds them), and a guest's greedy answer is the CPU's, for every layer
count, on F32 and F16 models (where llama.cpp computes the same thing on both: no quantized weights).

Run on the software GPU with ``scripts/gpu/vulkan_soft.sh``; skipped, with the reason, without a GPU backend.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry
from wasinn_host.llama import devices
from wasinn_host.llama.offload import ALL_LAYERS
from wasinn_host.testing.gguf_models import successor_text, write_successor_model

from .gpu_env import GPU_MARKS, device_buffers, generate, gpu_layers, llama_log, offloaded, write_exact_model

pytestmark = GPU_MARKS
UNBOUNDED = '{"temp": 0}'
"""Greedy up to the end of generation (the successor model's answers end at ``z``)."""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The successor model in F32 (2 layers) and F16, and the exact random F16 model (4 layers)."""
    folder = tmp_path_factory.mktemp("gpu-models")
    return {
        "succ": write_successor_model(folder / "succ.gguf", n_layer=2),
        "succ16": write_successor_model(folder / "succ16.gguf", n_layer=2, f16=True),
        "rand": write_exact_model(folder / "rand.gguf"),
    }


@pytest.fixture
def reg(models: dict[str, pathlib.Path]) -> Iterator[ModelRegistry]:
    """Each model under a CPU-target name and a GPU-target name, loaded afresh for every test."""
    registry = ModelRegistry(
        [f"{n}:GGML:CPU:{p}" for n, p in models.items()] + [f"{n}-gpu:GGML:GPU:{p}" for n, p in models.items()]
    )
    yield registry
    registry.close()


def gpu_device_names() -> list[str]:
    return [d.name for d in devices.devices() if d.is_gpu]


@pytest.mark.parametrize("name", ["succ", "succ16"])
def test_all_layers_on_the_device_answer_as_the_successor_model_must(
    name: str, reg: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    with llama_log(caplog):
        text = generate(reg, name, json.dumps({"n-gpu-layers": -1}), "a", UNBOUNDED)
    assert text == successor_text("a") + "</s>"
    assert offloaded(caplog) == [(3, 3)], "2 repeating layers and the output layer"
    buffers = device_buffers(caplog)
    assert any(dev in buffers for dev in gpu_device_names()), f"weights on a GPU device: {buffers}"
    assert gpu_layers(reg, name) == ALL_LAYERS


def test_the_gpu_target_fits_every_layer_of_a_small_model(reg: ModelRegistry, caplog: pytest.LogCaptureFixture) -> None:
    with llama_log(caplog):
        text = generate(reg, "succ-gpu", None, "m", UNBOUNDED)
    assert text == successor_text("m") + "</s>"
    assert offloaded(caplog) == [(3, 3)]
    assert any("execution target GPU: all 2 layers fit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("layers", [0, 1, 2, 3, 4, -1])
def test_greedy_text_on_the_device_equals_the_cpus_for_every_layer_count(
    layers: int, reg: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    prompt = "the quick brown fox"
    cpu = generate(reg, "rand", None, prompt)
    assert len(cpu) > 20
    with llama_log(caplog):
        on_device = generate(reg, "rand-gpu", json.dumps({"n-gpu-layers": layers}), prompt)
    assert on_device == cpu
    assert offloaded(caplog) == [(5 if layers == -1 else layers, 5)], "4 repeating layers and the output layer"
    assert gpu_layers(reg, "rand-gpu") == layers


def test_partial_offload_puts_some_weights_on_the_device_and_the_rest_on_the_cpu(
    reg: ModelRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    with llama_log(caplog):
        generate(reg, "rand-gpu", json.dumps({"n-gpu-layers": 2}), "ab")
    buffers = device_buffers(caplog)
    on_gpu = sum(mib for dev, mib in buffers.items() if dev in gpu_device_names())
    on_cpu = sum(mib for dev, mib in buffers.items() if dev.startswith("CPU"))
    assert on_gpu > 0 and on_cpu > 0, buffers
    assert on_cpu > on_gpu, "the embeddings and 2 of 4 layers stay on the CPU: more than the 2 offloaded"


def test_the_cpu_target_keeps_every_layer_on_the_cpu(reg: ModelRegistry, caplog: pytest.LogCaptureFixture) -> None:
    with llama_log(caplog):
        generate(reg, "succ", None, "a")
    assert offloaded(caplog) == [(0, 3)]
    assert not any(dev in device_buffers(caplog) for dev in gpu_device_names())
