"""How many layers go to the GPU: the execution target mapped to a layer count, and fitting to memory.

The rules, in order:

1. An explicit ``n-gpu-layers`` always wins (-1 = all).
2. Target ``CPU``: no layers.
3. Target ``GPU``, ``AUTO`` (or unset) and ``TPU`` (llama.cpp has no TPU backend; treated as AUTO):
   on a build that can offload, as many layers as fit the devices' free memory (all of them when
   they fit, see :func:`fit_gpu_layers`); on a build that cannot, none, and for ``GPU`` one warning
   saying so and how to install a GPU build.

Everything here is pure (sizes in, a :class:`LayerChoice` out) so it is unit-tested with made-up
device sizes; ``model.py`` measures the model and the devices and logs the choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..core.config.preload import Target

ALL_LAYERS = -1
"""llama.cpp's "every layer, the output layer included" (``n_gpu_layers`` above the layer count)."""
MIB = 1 << 20
MIN_MARGIN = 512 * MIB
"""Free memory left for llama.cpp's compute buffers and the driver: at least this, or 5 % of the free memory."""

GPU_BUILD_HINT = (
    'install a GPU build: CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python==0.3.36 (-DGGML_METAL=on on macOS, -DGGML_VULKAN=on for Vulkan), "
    "then check it with `wasinn info`"
)


@dataclass(frozen=True)
class ModelSizes:
    """What offloading a model costs in device memory."""

    n_layer: int
    layer_bytes: int
    """Weights of one repeating layer (the largest, so a partial fit never overflows)."""
    output_bytes: int
    """The output layer (norm and output matrix), offloaded only with all layers."""
    kv_bytes_per_layer: int
    """KV cache of one layer for every cell of the context (it lives beside its layer)."""


@dataclass(frozen=True)
class LayerChoice:
    """The layer count to pass to llama.cpp, and the log line explaining it."""

    n_gpu_layers: int
    reason: str
    level: int = logging.DEBUG
    """How loudly to log ``reason``: INFO for a fitted choice, WARNING for a GPU the build cannot use."""


def margin_for(free_bytes: int) -> int:
    """Device memory kept free for compute buffers: 5 % of ``free_bytes``, at least :data:`MIN_MARGIN`."""
    return max(MIN_MARGIN, free_bytes // 20)


def fit_gpu_layers(sizes: ModelSizes, free_bytes: int, margin_bytes: int | None = None) -> LayerChoice:
    """The most layers whose weights and KV cache fit in ``free_bytes`` less a margin.

    Every layer with its output layer if all fit (:data:`ALL_LAYERS`); else the largest ``k`` with
    ``k * (layer + kv per layer)`` within the budget, never more than ``n_layer``.
    """
    margin = margin_for(free_bytes) if margin_bytes is None else margin_bytes
    budget = free_bytes - margin
    per_layer = sizes.layer_bytes + sizes.kv_bytes_per_layer
    whole = sizes.n_layer * per_layer + sizes.output_bytes
    facts = (
        f"{sizes.n_layer} layers of {_mib(sizes.layer_bytes)} weights + {_mib(sizes.kv_bytes_per_layer)} KV, "
        f"output {_mib(sizes.output_bytes)}; {_mib(free_bytes)} free on the GPU(s), {_mib(margin)} kept as margin"
    )
    if budget >= whole:
        return LayerChoice(ALL_LAYERS, f"all {sizes.n_layer} layers fit ({_mib(whole)} needed: {facts})", logging.INFO)
    k = max(0, min(sizes.n_layer, budget // per_layer)) if per_layer > 0 else 0
    return LayerChoice(
        int(k),
        f"{k} of {sizes.n_layer} layers fit ({_mib(whole)} needed for all: {facts}); the rest run on the CPU",
        logging.INFO if k else logging.WARNING,
    )


def choose_gpu_layers(
    target: Target | None, n_gpu_layers: int | None, can_offload: bool, fit: Callable[[], LayerChoice]
) -> LayerChoice:
    """Apply the rules of the module docstring; ``fit`` is called only when memory decides."""
    if n_gpu_layers is not None:
        return LayerChoice(n_gpu_layers, f"n-gpu-layers {n_gpu_layers} set explicitly")
    if target is Target.CPU:
        return LayerChoice(0, "execution target CPU: no layers offloaded")
    name = (target or Target.AUTO).name
    if not can_offload:
        if target is Target.GPU:
            return LayerChoice(
                0,
                f"execution target GPU asked, but this llama-cpp-python build cannot offload to a GPU "
                f"(CPU only): running on the CPU; {GPU_BUILD_HINT}",
                logging.WARNING,
            )
        return LayerChoice(0, f"execution target {name}: this build cannot offload, running on the CPU")
    choice = fit()
    return LayerChoice(choice.n_gpu_layers, f"execution target {name}: {choice.reason}", choice.level)


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"
