"""Fitting layers to the device's free memory, on a real GPU backend: the free memory the device reports
(lavapipe: 2,048 MiB, fixed; a real GPU: what it has now) decides how many layers the GPU and AUTO
targets offload, and llama.cpp puts exactly that many on the device.

The model's KV cache is what does not fit: ``ctx-size`` x ``n-parallel`` cells are chosen from the
reported free memory so that each layer costs about 2/5 of it, and only the weights are loaded (the
host's load does the same choice, then also allocates the context).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import pytest

from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.config.preload import Target
from wasinn_host.llama import devices
from wasinn_host.llama.model import LlamaModel, model_sizes
from wasinn_host.llama.offload import ALL_LAYERS, margin_for

from .gpu_env import GPU_MARKS, info_json, llama_log, offloaded, write_exact_model

pytestmark = GPU_MARKS
N_PARALLEL = 64


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_exact_model(tmp_path_factory.mktemp("fit") / "rand.gguf")


def oversized_context(model: pathlib.Path) -> tuple[ModelParams, int]:
    """Params whose KV cache makes each layer cost about 2/5 of the free memory, and the layers that fit."""
    free = devices.gpu_free_bytes()
    budget = free - margin_for(free)
    per_cell = model_sizes(model, ModelParams(ctx_size=1, n_parallel=1)).kv_bytes_per_layer
    ctx_size = budget * 2 // 5 // per_cell // N_PARALLEL
    params = ModelParams(ctx_size=ctx_size, n_parallel=N_PARALLEL)
    sizes = model_sizes(model, params)
    return params, budget // (sizes.layer_bytes + sizes.kv_bytes_per_layer)


def load(model: pathlib.Path, params: ModelParams) -> int:
    weights = LlamaModel(model, params)
    try:
        return weights.n_gpu_layers
    finally:
        weights.close()


@pytest.mark.parametrize("target", [Target.GPU, Target.AUTO])
def test_a_context_larger_than_the_free_memory_shrinks_the_layers_offloaded(
    target: Target, model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    params, fits = oversized_context(model)
    assert fits == 2, "2/5 of the budget per layer: 2 of the 4 layers"
    params = dataclasses.replace(params, target=target)
    with llama_log(caplog):
        assert load(model, params) == 2
    (line,) = [r for r in caplog.records if "layers fit" in r.getMessage()]
    assert f"execution target {target.name}: 2 of 4 layers fit" in line.getMessage()
    assert "free on the GPU" in line.getMessage() and line.levelno == logging.INFO
    assert offloaded(caplog) == [(2, 5)], "llama.cpp put exactly the chosen layers on the device"


def test_the_same_model_with_a_small_context_goes_whole_to_the_device(
    model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    with llama_log(caplog):
        assert load(model, ModelParams(ctx_size=512, n_parallel=4, target=Target.AUTO)) == ALL_LAYERS
    assert offloaded(caplog) == [(5, 5)]


def test_an_explicit_layer_count_is_not_fitted(model: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    params = dataclasses.replace(oversized_context(model)[0], target=Target.GPU, n_gpu_layers=3)
    with llama_log(caplog):
        assert load(model, params) == 3
    assert offloaded(caplog) == [(3, 5)]
    assert not any("layers fit" in r.getMessage() for r in caplog.records)


def test_the_fit_reads_the_free_memory_wasinn_info_reports() -> None:
    gpus = [d for d in info_json()["devices"] if d["type"] in ("GPU", "IGPU")]
    assert sum(d["free_bytes"] for d in gpus) == pytest.approx(devices.gpu_free_bytes(), rel=0.05)
