"""``top-n-sigma`` and ``n-prev`` in the sampler chain where llama.cpp's ``common_sampler_init`` puts them:
top-n-sigma after DRY and before top-k (with a grammar too, where it sees the grammar's mask: no top-k
shortcut), n-prev nowhere (it sizes the history ``common_sampler`` keeps for its text of previous tokens).

The host's draws are compared with :class:`~tests.llama.test_sampler_order.CommonSampler`, the reference
chain of the sampler-order tests, on the very logits the host sampled from (so any CPU gives the same
comparison), on a seeded random model whose logits spread wide enough for top-n-sigma to cut.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.grammar_sampling import GrammarSampler
from wasinn_host.testing.gguf_models import write_random_model

from .test_sampler_order import assert_same_draws, host_run

PROMPT = "abc def ghi"
WORDS = 'root ::= [a-z]+ (" " [a-z]+){2,5} "."'


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("sigma")
    return write_random_model(folder / "r.gguf", n_layer=2, n_embd=64, n_head=4, n_ff=128, f16=False, logit_std=2.0)


@pytest.fixture(scope="module")
def nn(model_path: pathlib.Path) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"r:GGML:AUTO:{model_path}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="module")
def vocabs(model_path: pathlib.Path) -> Iterator[dict[str, Any]]:
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
    yield {"r": llama_cpp.llama_model_get_vocab(model)}
    llama_cpp.llama_model_free(model)


def kept_by_sigma(logits: np.ndarray, n: float) -> int:
    """Tokens whose logit is within ``n`` standard deviations of the largest (llama.cpp's top-n-sigma)."""
    return int(np.sum(logits >= logits.max() - n * logits.std()))


@pytest.mark.parametrize(
    "config",
    [
        {"top-n-sigma": 1.0, "temp": 1.5, "top-k": 0, "top-p": 1.0, "min-p": 0.0, "seed": 3},
        {"top-n-sigma": 2.0, "temp": 1.0, "seed": 5, "repeat-penalty": 1.2},  # the defaults' top-k, top-p, min-p after
        {"top-n-sigma": 1.5, "temp": 1.2, "top-k": 0, "min-p": 0.0, "seed": 9, "n-prev": 8},
    ],
)
def test_top_n_sigma_draws_are_common_samplers(
    nn: WasiNN, vocabs: dict[str, Any], recorded: list[tuple[np.ndarray, int]], config: dict[str, Any]
) -> None:
    config = {**config, "n-predict": 24, "ignore-eos": True}
    assert_same_draws(nn, vocabs, recorded, "r", config, PROMPT)
    # every token drawn is one top-n-sigma keeps (the temperature comes after it)
    for logits, token in recorded:
        cut = logits.max() - config["top-n-sigma"] * logits.std()
        assert logits[token] >= cut - 1e-3 or config.get("repeat-penalty")
    assert min(kept_by_sigma(logits, config["top-n-sigma"]) for logits, _ in recorded) < 100, "the cut keeps few"


def test_top_n_sigma_changes_the_draws(nn: WasiNN) -> None:
    """Not ignored: the same seed draws other tokens without it."""
    base = {"temp": 1.5, "top-k": 0, "top-p": 1.0, "min-p": 0.0, "seed": 3, "n-predict": 24, "ignore-eos": True}
    with_sigma, _ = host_run(nn, "r", {**base, "top-n-sigma": 0.5}, PROMPT)
    without, _ = host_run(nn, "r", base, PROMPT)
    assert with_sigma != without


def test_top_n_sigma_under_a_grammar_sees_the_grammars_mask(
    nn: WasiNN, vocabs: dict[str, Any], recorded: list[tuple[np.ndarray, int]]
) -> None:
    """The refused draws are redrawn on the masked vocabulary, top-n-sigma measuring the allowed logits
    alone, as llama.cpp: never on a top-k shortcut, which would measure other logits."""
    config = {"grammar": WORDS, "top-n-sigma": 1.0, "temp": 1.0, "seed": 4, "n-predict": 16}
    sampler = assert_same_draws(nn, vocabs, recorded, "r", config, PROMPT)
    assert isinstance(sampler, GrammarSampler)
    assert sampler.rejections > 0 and sampler.fast_steps == 0 and sampler.full_steps == sampler.rejections


def test_n_prev_leaves_the_draws_alone(nn: WasiNN) -> None:
    config = {"temp": 1.0, "seed": 6, "n-predict": 16, "ignore-eos": True}
    assert host_run(nn, "r", {**config, "n-prev": 1}, PROMPT)[0] == host_run(nn, "r", config, PROMPT)[0]
