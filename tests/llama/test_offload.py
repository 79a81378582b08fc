"""GPU layers: the execution target mapping and fitting layers to made-up device memory sizes."""

from __future__ import annotations

import logging

import pytest

from wasinn_host.core.config.preload import Target
from wasinn_host.llama.offload import (
    ALL_LAYERS,
    MIB,
    MIN_MARGIN,
    LayerChoice,
    ModelSizes,
    choose_gpu_layers,
    fit_gpu_layers,
    margin_for,
)

pytestmark = pytest.mark.fast

GIB = 1 << 30
# a 7B-like model: 32 layers of 200 MiB, a 250 MiB output layer, 64 MiB of KV per layer
SEVEN_B = ModelSizes(n_layer=32, layer_bytes=200 * MIB, output_bytes=250 * MIB, kv_bytes_per_layer=64 * MIB)
WHOLE = 32 * 264 * MIB + 250 * MIB  # 8698 MiB


def test_everything_fits_on_a_large_gpu() -> None:
    choice = fit_gpu_layers(SEVEN_B, 24 * GIB)
    assert choice.n_gpu_layers == ALL_LAYERS
    assert "all 32 layers fit" in choice.reason and "8698 MiB needed" in choice.reason
    assert choice.level == logging.INFO


def test_exactly_enough_for_all_layers_and_the_margin() -> None:
    assert fit_gpu_layers(SEVEN_B, WHOLE + MIB, margin_bytes=MIB).n_gpu_layers == ALL_LAYERS
    assert fit_gpu_layers(SEVEN_B, WHOLE + MIB - 1, margin_bytes=MIB).n_gpu_layers == 32, (
        "one byte short of the output layer: every repeating layer, the output stays on the CPU"
    )


def test_partial_fit_counts_weights_and_kv_per_layer() -> None:
    # 6 GiB free, 512 MiB margin (5 % of 6 GiB is less): 5632 MiB / 264 MiB per layer = 21 layers
    choice = fit_gpu_layers(SEVEN_B, 6 * GIB)
    assert choice.n_gpu_layers == 21
    assert "21 of 32 layers fit" in choice.reason and "the rest run on the CPU" in choice.reason
    assert "6144 MiB free" in choice.reason and "512 MiB kept as margin" in choice.reason


def test_margin_is_five_percent_of_large_memory() -> None:
    assert margin_for(4 * GIB) == MIN_MARGIN
    assert margin_for(80 * GIB) == 4 * GIB
    # 80 GiB free would hold the model even with KV for a huge context; the margin grows with it
    huge_kv = ModelSizes(n_layer=80, layer_bytes=800 * MIB, output_bytes=1 * GIB, kv_bytes_per_layer=256 * MIB)
    assert fit_gpu_layers(huge_kv, 80 * GIB).n_gpu_layers == (76 * 1024) // 1056


def test_nothing_fits_on_a_tiny_gpu() -> None:
    choice = fit_gpu_layers(SEVEN_B, 600 * MIB)
    assert choice.n_gpu_layers == 0
    assert choice.level == logging.WARNING, "a GPU that holds no layer deserves attention"
    assert fit_gpu_layers(SEVEN_B, 0).n_gpu_layers == 0
    assert fit_gpu_layers(SEVEN_B, 100 * MIB).n_gpu_layers == 0, "free memory below the margin"


def _never() -> LayerChoice:
    raise AssertionError("fitting must not be consulted here")


@pytest.mark.parametrize("target", [Target.CPU, Target.GPU, Target.AUTO, Target.TPU, None])
@pytest.mark.parametrize("offload", [True, False])
def test_explicit_n_gpu_layers_wins(target: Target | None, offload: bool) -> None:
    for layers in (-1, 0, 7):
        choice = choose_gpu_layers(target, layers, offload, _never)
        assert choice.n_gpu_layers == layers and choice.level == logging.DEBUG


@pytest.mark.parametrize("offload", [True, False])
def test_cpu_target_offloads_nothing(offload: bool) -> None:
    choice = choose_gpu_layers(Target.CPU, None, offload, _never)
    assert choice.n_gpu_layers == 0 and choice.level == logging.DEBUG


@pytest.mark.parametrize("target", [Target.GPU, Target.AUTO, Target.TPU, None])
def test_gpu_and_auto_fit_to_memory_on_an_offload_build(target: Target | None) -> None:
    choice = choose_gpu_layers(target, None, True, lambda: fit_gpu_layers(SEVEN_B, 6 * GIB))
    assert choice.n_gpu_layers == 21
    assert choice.reason.startswith(f"execution target {(target or Target.AUTO).name}: 21 of 32 layers fit")
    assert choice.level == logging.INFO


def test_gpu_target_without_offload_warns_with_the_install_command() -> None:
    choice = choose_gpu_layers(Target.GPU, None, False, _never)
    assert choice.n_gpu_layers == 0
    assert choice.level == logging.WARNING
    assert "cannot offload" in choice.reason
    assert 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir' in choice.reason
    assert "llama-cpp-python==0.3.36" in choice.reason and "wasinn info" in choice.reason


@pytest.mark.parametrize("target", [Target.AUTO, Target.TPU, None])
def test_auto_without_offload_is_the_cpu_quietly(target: Target | None) -> None:
    choice = choose_gpu_layers(target, None, False, _never)
    assert choice.n_gpu_layers == 0 and choice.level == logging.DEBUG
