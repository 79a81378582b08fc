"""``rope-scaling-type``, ``rope-freq-base``, ``rope-freq-scale`` and the YaRN keys: a context four times
the model's training context, with linear or YaRN scaling, generates what llama-cpp-python generates with
the same context parameters (decoded alone, the same calls), and other text than without scaling."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from wasinn_host import WasiNN
from wasinn_host.testing.gguf_models import write_random_model
from wasinn_host.testing.native_llama import NativeModel

TRAIN_CTX = 64
CTX = 4 * TRAIN_CTX
N_PREDICT = 12
LOAD = {"ctx-size": CTX, "n-parallel": 1, "threads": 2, "temp": 0, "n-predict": N_PREDICT}
PROMPT = b"".join(bytes([0x61 + (i * 7) % 26]) for i in range(150))
"""150 characters: 151 tokens with BOS, more than twice the training context."""


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("rope")
    return write_random_model(
        folder / "short.gguf", n_layer=2, n_embd=64, n_head=4, n_ff=128, context_length=TRAIN_CTX, f16=False
    )


def host_tokens(nn: WasiNN, keys: dict[str, Any]) -> list[int]:
    with nn.session("m", {**LOAD, **keys}) as session:
        session.complete(PROMPT)
        return list(session._context.output_tokens)  # type: ignore[attr-defined]


CASES = [
    ({"rope-scaling-type": 1, "rope-freq-scale": 0.25}, {"rope_scaling_type": 1, "rope_freq_scale": 0.25}),
    (
        {"rope-scaling-type": 2, "rope-freq-scale": 0.25, "yarn-orig-ctx": TRAIN_CTX, "yarn-beta-fast": 16.0},
        {"rope_scaling_type": 2, "rope_freq_scale": 0.25, "yarn_orig_ctx": TRAIN_CTX, "yarn_beta_fast": 16.0},
    ),
    ({"rope-freq-base": 100.0}, {"rope_freq_base": 100.0}),
    (
        {"rope-scaling-type": 2, "rope-freq-scale": 0.25, "yarn-ext-factor": 0.5, "yarn-attn-factor": 1.2},
        {"rope_scaling_type": 2, "rope_freq_scale": 0.25, "yarn_ext_factor": 0.5, "yarn_attn_factor": 1.2},
    ),
]


@pytest.mark.parametrize(("keys", "cparams"), CASES)
def test_scaled_context_generates_what_llama_cpp_generates(
    nn: WasiNN, native: NativeModel, keys: dict[str, Any], cparams: dict[str, Any]
) -> None:
    prompt = native.tokenize(PROMPT)
    assert len(prompt) > 2 * TRAIN_CTX
    expected = native.generate(prompt, N_PREDICT, n_ctx=CTX, cparams=cparams)
    assert host_tokens(nn, keys) == expected
    unscaled = native.generate(prompt, N_PREDICT, n_ctx=CTX)
    assert expected != unscaled, "the keys change the answer (not ignored)"
