"""Where a model's weights go, from the load-time keys WasmEdge passes to ``llama_model_params``:
``split-mode``, ``tensor-split`` and the mixture-of-experts overrides ``cpu-moe`` / ``n-cpu-moe``.

As WasmEdge's GGML plugin: ``cpu-moe`` adds the tensor-buffer override ``\\.ffn_(up|down|gate)_exps``
and ``n-cpu-moe`` N the overrides ``blk\\.I\\.ffn_(up|down|gate)_exps`` for I < N, each naming ggml's
CPU buffer type, so llama.cpp keeps the matching expert tensors in CPU memory whatever the layers'
device; ``tensor-split`` fills ``llama_max_devices()`` proportions (more entries than that is an
invalid argument, as WasmEdge).  On a machine without a GPU every weight is in CPU memory anyway: the
overrides still match (llama.cpp logs each overridden tensor at debug level) and change nothing else.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from ..core.config.params import ModelParams
from ..core.errors import ErrorKind, WasiNNError
from .bindings import ggml_library, llama_cpp

SPLIT_MODES = {
    "none": llama_cpp.LLAMA_SPLIT_MODE_NONE,
    "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
    "row": llama_cpp.LLAMA_SPLIT_MODE_ROW,
}
ALL_EXPERTS = rb"\.ffn_(up|down|gate)_exps"
"""WasmEdge's ``cpu-moe`` pattern (llama.cpp's ``--cpu-moe``)."""


def layer_experts(layer: int) -> bytes:
    """WasmEdge's ``n-cpu-moe`` pattern for one layer (llama.cpp's ``--n-cpu-moe``)."""
    return rb"blk\.%d\.ffn_(up|down|gate)_exps" % layer


class BufferOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override``: a tensor-name regex and the buffer type it gets."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def cpu_buffer_type() -> int:
    """The CPU buffer type of ggml (``ggml_backend_cpu_buffer_type()``, in the ``libggml-base`` llama.cpp loaded)."""
    base = ggml_library("libggml-base.so")
    func = base.ggml_backend_cpu_buffer_type
    func.restype, func.argtypes = ctypes.c_void_p, []
    return int(func())


def expert_patterns(params: ModelParams) -> list[bytes]:
    """The tensor-name patterns kept in CPU memory, in WasmEdge's order."""
    patterns = [ALL_EXPERTS] if params.cpu_moe else []
    return patterns + [layer_experts(i) for i in range(params.n_cpu_moe)]


def set_placement(mparams: Any, params: ModelParams) -> list[Any]:
    """Write the split mode, tensor split and buffer overrides into ``mparams``; return the ctypes arrays
    they point to (keep them alive while the model loads)."""
    mparams.split_mode = SPLIT_MODES[params.split_mode]
    keep: list[Any] = []
    if params.tensor_split:
        n_devices = int(llama_cpp.llama_max_devices())
        if len(params.tensor_split) > n_devices:
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"config key 'tensor-split': {len(params.tensor_split)} proportions, but this llama.cpp "
                f"splits over at most {n_devices} devices",
            )
        split = (ctypes.c_float * n_devices)(*params.tensor_split)
        mparams.tensor_split = split
        keep.append(split)
    patterns = expert_patterns(params)
    if patterns:
        buft = cpu_buffer_type()
        overrides = (BufferOverride * (len(patterns) + 1))()  # ends with {NULL, NULL}
        for i, pattern in enumerate(patterns):
            overrides[i] = BufferOverride(pattern, buft)
        mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        keep.append(overrides)
    return keep
