"""Seeded draws as arrays (:mod:`wasinn_host.llama.batch_sampling`), on real llama.cpp: the rows of many
sequences drawn together give, token for token, what llama.cpp's own chain (``penalties -> top-k ->
top-p -> min-p -> temperature -> dist``, built by :mod:`wasinn_host.llama.sampler` as it always was)
draws for the same seed from the same logits; through the host, seeded guests in one batch answer as
each does alone and as the chain makes them, and the status shows their rows went together."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from wasinn_host import WasiNN
from wasinn_host.core.config.params import ModelParams, SamplingParams
from wasinn_host.core.runtime import KvLayout
from wasinn_host.llama import batch_sampling
from wasinn_host.llama import sampler as host_sampler
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.context import LlamaContext, logits_rows
from wasinn_host.llama.model import LlamaModel

from .random_models import loaded_random_model
from .sessions import complete_together

N_SEQ = 8
STEPS = 64
CONFIGS: list[dict[str, Any]] = [
    {"temp": 0.8, "top_k": 0, "top_p": 1.0, "min_p": 0.0},  # temperature only
    {"temp": 0.7, "top_k": 40, "top_p": 1.0, "min_p": 0.0},
    {"temp": 1.0, "top_k": 200, "top_p": 1.0, "min_p": 0.0},  # top-k without the groups' shortcut
    {"temp": 0.9, "top_k": 40, "top_p": 0.8, "min_p": 0.0},
    {"temp": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.1},  # min-p over the vocabulary, in its order
    {"temp": 0.8, "top_k": 60, "top_p": 1.0, "min_p": 0.05, "min_keep": 3},
    {},  # WasmEdge's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
    {"repeat_penalty": 1.3, "frequency_penalty": 0.2, "presence_penalty": 0.1, "last_n_penalty": 16},
    {"temp": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.5, "last_n_penalty": -1},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    with loaded_random_model(tmp_path_factory.mktemp("draws"), n_vocab=8192, seed=11) as loaded:
        yield loaded


def chain_of(model: LlamaModel, params: SamplingParams, n_ctx_seq: int = 64) -> Any:
    """llama.cpp's chain for ``params``, built as the host built it before rows were drawn as arrays."""
    stages = host_sampler._pre_stages(model, params, n_ctx_seq) + host_sampler._draw_stages(model, params)
    return host_sampler._chain(stages)


def chain_pick(chain: Any, row: np.ndarray) -> int:
    """What ``llama_sampler_sample`` does with a row of logits: the chain over the vocabulary, accepted."""
    data = np.zeros(len(row), dtype=batch_sampling.TOKEN_DATA)
    data["id"] = np.arange(len(row))
    data["logit"] = row
    array = llama_cpp.llama_token_data_array(
        data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), len(row), -1, False
    )
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
    token = int(data["id"][array.selected])
    llama_cpp.llama_sampler_accept(chain, token)
    return token


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_rows_drawn_together_are_the_chains_draws(model: LlamaModel, config: dict[str, Any]) -> None:
    context = LlamaContext(model, ModelParams(threads=2, batch_size=64), KvLayout(STEPS + 2, N_SEQ))
    batch = context.new_batch()
    seeds = [1000 * i + 7 for i in range(N_SEQ)]
    params = [SamplingParams(seed=seed, **config) for seed in seeds]
    samplers = [context.new_sampler(p) for p in params]
    exact = [context.new_sampler(p) for p in params]
    chains = [chain_of(model, p, context.n_ctx_seq) for p in params]
    before = (batch_sampling.DrawCounts.rows, batch_sampling.DrawCounts.exact)
    try:
        assert all(s.draws_together for s in samplers), "these chains are drawn as arrays"
        tokens = [5 + 131 * seq for seq in range(N_SEQ)]
        drawn: list[list[int]] = [[] for _ in range(N_SEQ)]
        for step in range(STEPS):
            batch.clear()
            for seq in range(N_SEQ):
                batch.add(tokens[seq], step, seq, True)
            assert context.decode(batch) == 0
            together = context.drawn_tokens(list(range(N_SEQ)), samplers)
            rows = np.array(logits_rows(context, list(range(N_SEQ))))
            alone = [int(llama_cpp.llama_sampler_sample(chains[seq], context.ptr, seq)) for seq in range(N_SEQ)]
            assert together == alone, f"step {step}"
            assert batch_sampling.draw(rows, [s.draw for s in exact], exact=True) == alone  # type: ignore[misc]
            for seq in range(N_SEQ):
                drawn[seq].append(together[seq])
            tokens = together
        assert len({t for seq in drawn for t in seq}) > N_SEQ, "the draws vary: the test tells tokens apart"
        rows_drawn = batch_sampling.DrawCounts.rows - before[0] - STEPS * N_SEQ  # less the exact ones
        redrawn = batch_sampling.DrawCounts.exact - before[1] - STEPS * N_SEQ
        assert rows_drawn == STEPS * N_SEQ and redrawn < rows_drawn // 10, "most rows drawn as arrays"
    finally:
        for sampler in samplers + exact:
            sampler.close()
        for chain in chains:
            llama_cpp.llama_sampler_free(chain)
        batch.close()
        context.close()


def test_tied_logits_are_drawn_as_the_chain_draws_them(model: LlamaModel) -> None:
    """Logits in steps of 0.25 tie everywhere: a pick among equal logits goes to llama.cpp's own order."""
    rng = np.random.default_rng(3)
    rows = (np.round(rng.standard_normal((N_SEQ, model.n_vocab)) * 8) / 4).astype(np.float32)
    for config in CONFIGS:
        params = [SamplingParams(seed=seed, **config) for seed in range(N_SEQ)]
        samplers = [host_sampler.Sampler(model, p, 64) for p in params]
        chains = [chain_of(model, p) for p in params]
        try:
            for step in range(16):
                got = batch_sampling.draw(np.roll(rows, step, axis=0), [s.draw for s in samplers])  # type: ignore[misc]
                want = [chain_pick(chains[i], np.roll(rows, step, axis=0)[i]) for i in range(N_SEQ)]
                assert got == want, (config, step)
        finally:
            for sampler in samplers:
                sampler.close()
            for chain in chains:
                llama_cpp.llama_sampler_free(chain)


def test_the_random_numbers_are_llama_cpps() -> None:
    """std::mt19937 seeded 5489 (its default) gives 3499211612 first and 4123659995 as its 10,000th
    output; a draw is two outputs over 2**64 (libstdc++'s generate_canonical<double, 53>)."""
    draws = batch_sampling.SeededDraws(5489)
    first = draws.next()
    assert first == (3499211612 + 581869302 * 2.0**32) / 2.0**64
    for _ in range(4998):
        draws.next()
    assert int(draws.next() * 2.0**64) >> 32 == 4123659995
    draws.reset()
    assert draws.next() == first


def test_chains_the_arrays_do_not_cover_stay_on_llama_cpp(model: LlamaModel) -> None:
    for config in (
        {"temp": 0.0},
        {"dry_multiplier": 0.8},
        {"logit_bias": ((3, 1.0),)},
        {"mirostat": 2},
        {"typ_p": 0.9},
        {"top_k": 0, "top_p": 0.9},
        {"grammar": 'root ::= "a"'},
        {"dynatemp_range": 0.5},
    ):
        sampler = host_sampler.Sampler(model, SamplingParams(**config), 64)
        try:
            assert not sampler.draws_together, config
        finally:
            sampler.close()


def test_seeded_guests_together_answer_as_alone_and_as_the_chain(
    successor_host: WasiNN, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: list[tuple[str, dict[str, Any]]] = [
        ("a", {"temp": 0.9, "seed": 42}),
        ("b", {"temp": 0.9, "seed": 43}),
        ("c", {"temp": 1.3, "seed": 5, "top-k": 8}),
        ("d", {"temp": 1.1, "seed": 6, "top-p": 0.9, "min-p": 0.0}),
        ("e", {"temp": 0.8, "seed": 7, "top-k": 0, "top-p": 1.0, "min-p": 0.02}),
        ("g", {"temp": 1.0, "seed": 8, "repeat-penalty": 1.4, "presence-penalty": 0.3}),
        ("f", {"temp": 0}),
    ]
    alone = [complete_together(successor_host, [job])[0] for job in jobs]
    (model,) = successor_host.registry.loaded()
    before = model.worker.rows_drawn_together
    assert complete_together(successor_host, jobs) == alone
    assert model.worker.rows_drawn_together - before >= 6 * 24, "the seeded rows were drawn together"
    assert successor_host.status()["models"][0]["rows_drawn_together"] == model.worker.rows_drawn_together
    monkeypatch.setattr(
        host_sampler, "draw_kind", lambda params, n_vocab, n_ctx_seq: None
    )  # llama.cpp's chain, row by row
    by_chain = [complete_together(successor_host, [job])[0] for job in jobs]
    assert by_chain == alone
    assert len(set(alone)) == len(alone), alone


def test_expf_is_the_c_librarys() -> None:
    """The array ``expf`` the exact draws use is the C library's, value for value (numpy's double ``exp``
    rounded to float differs from it on about 1 value in 1,500 of these)."""
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.random(150_000) * -110, rng.standard_normal(50_000) * 3]).astype(np.float32)
    want = np.array([libm.expf(v) for v in x.tolist()], dtype=np.float32)
    assert (np.exp(x.astype(np.float64)).astype(np.float32) != want).sum() > 50, "the rounding differs somewhere"
    assert np.array_equal(batch_sampling.expf(x), want)
