"""The load-time keys that become ``llama_context_params`` fields as WasmEdge passes them (through
llama.cpp's ``common_context_params_to_llama``): pooling and attention for embeddings, RoPE scaling
and YaRN, and whether the KV cache is offloaded.

A value left at its "the model's" default (-1, 0, None) leaves llama.cpp's default in place, so a
context made without these keys is the context this host always made.
"""

from __future__ import annotations

from typing import Any

from ..core.config.params import ModelParams


def set_embedding_and_rope(cparams: Any, params: ModelParams) -> None:
    """Write ``params``' pooling, attention, RoPE/YaRN and KV-offload settings into ``cparams``."""
    cparams.pooling_type = params.pooling_type
    cparams.attention_type = params.attention_type
    cparams.rope_scaling_type = params.rope_scaling_type
    cparams.rope_freq_base = params.rope_freq_base
    cparams.rope_freq_scale = params.rope_freq_scale
    cparams.yarn_orig_ctx = params.yarn_orig_ctx
    for field in ("yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow"):
        value = getattr(params, field)
        if value is not None:
            setattr(cparams, field, value)
    cparams.offload_kqv = not params.no_kv_offload
