"""A tiny mixture-of-experts model the project writes itself: the successor model with expert FFNs.

Each layer's feed-forward network is four SwiGLU experts (``ffn_gate_exps``, ``ffn_up_exps``,
``ffn_down_exps``, 3-D tensors) chosen two at a time by a router (``ffn_gate_inp``), as llama.cpp's
llama architecture runs Mixtral-style models.  The experts' weights are seeded and small, so they
change the residual stream a little and never the successor's lead of ``logit_gap``: greedy decoding
of ``"a"`` still gives ``"bcd...z"`` (see :mod:`.gguf_models`), now with every expert computed.  Used
by the ``cpu-moe`` / ``n-cpu-moe`` tests: those keys keep exactly these tensors in CPU memory.
"""

from __future__ import annotations

import os
import pathlib

import gguf
import numpy as np

from .gguf_models import _build_vocab, _successor_shape, _successor_tensors, write_llama_gguf

MOE_NAME = "wasinn-moe"
N_EXPERT = 4
N_EXPERT_USED = 2
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def write_moe_model(path: str | os.PathLike[str], *, n_layer: int = 2, seed: int = 0) -> pathlib.Path:
    """Write the mixture-of-experts successor model to ``path`` (about 8 MB, F32); return the path."""
    shape = _successor_shape(512, n_layer)
    d, f = shape.n_embd, shape.n_ff
    rng = np.random.default_rng(seed)
    tensors = _successor_tensors(shape, 20.0)
    for layer in range(n_layer):
        prefix = f"blk.{layer}."
        for dense in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
            del tensors[prefix + dense]
        tensors[prefix + "ffn_gate_inp.weight"] = (rng.standard_normal((N_EXPERT, d)) * 0.1).astype(np.float32)
        tensors[prefix + "ffn_gate_exps.weight"] = (rng.standard_normal((N_EXPERT, f, d)) * 0.1).astype(np.float32)
        tensors[prefix + "ffn_up_exps.weight"] = (rng.standard_normal((N_EXPERT, f, d)) * 0.1).astype(np.float32)
        tensors[prefix + "ffn_down_exps.weight"] = (rng.standard_normal((N_EXPERT, d, f)) * 1e-3).astype(np.float32)

    def extra(writer: gguf.GGUFWriter) -> None:
        writer.add_expert_count(N_EXPERT)
        writer.add_expert_used_count(N_EXPERT_USED)

    return write_llama_gguf(path, shape, _build_vocab(shape.n_vocab), tensors, name=MOE_NAME, f16=False, extra=extra)
