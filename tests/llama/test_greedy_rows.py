"""Greedy rows sampled together, on real llama.cpp: one ``argmax`` over the logits rows of a decode picks
exactly the tokens the per-row greedy sampler picks, whichever rows a batch asks for; through the host,
greedy guests in one batch are sampled together and answer as each does alone, and a seeded guest in
the same batches draws what it draws alone (its rows drawn as arrays: ``test_row_draws.py``)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from wasinn_host import WasiNN
from wasinn_host.core.config.params import ModelParams, SamplingParams
from wasinn_host.core.runtime import KvLayout
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.context import LlamaContext
from wasinn_host.llama.model import LlamaModel

from .random_models import loaded_random_model
from .sessions import complete_together

N_SEQ = 8


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    with loaded_random_model(tmp_path_factory.mktemp("greedy"), n_vocab=2000, seed=7) as model:
        yield model


def per_row(context: LlamaContext, index: int) -> tuple[int, int]:
    """The token numpy's argmax of one row picks, and the token the per-row greedy sampler picks."""
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(context.ptr, index), shape=(context.model.n_vocab,))
    sampler = context.new_sampler(SamplingParams(temp=0.0))
    try:
        assert sampler.argmax_only
        return int(np.argmax(row)), sampler.sample(context, index)
    finally:
        sampler.close()


def test_one_argmax_over_the_rows_is_the_per_row_greedy_choice(random_model: LlamaModel) -> None:
    context = LlamaContext(random_model, ModelParams(threads=2, batch_size=256), KvLayout(64, N_SEQ))
    batch = context.new_batch()
    try:
        # a step of one token per sequence, every token asking for its row (the rows are the batch's)
        for seq in range(N_SEQ):
            batch.add(11 + 97 * seq, 0, seq, True)
        assert context.decode(batch) == 0
        together = context.greedy_tokens(list(range(N_SEQ)))
        assert together == [a for a, _ in (per_row(context, i) for i in range(N_SEQ))]
        assert together == [s for _, s in (per_row(context, i) for i in range(N_SEQ))]
        assert len(set(together)) > 1, "different rows, different tokens: the test tells rows apart"
        # prompt chunks of several tokens with a row only at their last: rows are not batch indices
        batch.clear()
        lasts = []
        for seq in range(N_SEQ):
            for pos in range(1, 4 + seq % 3):
                index = batch.add(5 + 31 * seq + pos, pos, seq, False)
            batch.raw.logits[index] = True
            batch.n_outputs += 1
            lasts.append(index)
        assert context.decode(batch) == 0
        for asked in (lasts, lasts[1::2], lasts[::-1], lasts[2:3], lasts[-1:]):  # (few rows: argmax a row)
            assert context.greedy_tokens(asked) == [per_row(context, i)[1] for i in asked]
    finally:
        batch.close()
        context.close()


def test_greedy_guests_together_answer_as_alone_and_a_seeded_one_draws_its_own(successor_host: WasiNN) -> None:
    greedy: dict[str, Any] = {"temp": 0}
    seeded: dict[str, Any] = {"temp": 0.9, "seed": 42, "top-k": 0, "top-p": 1.0, "min-p": 0.0}
    jobs = [(letter, greedy) for letter in "abcdefg"] + [("k", seeded)]
    alone = [complete_together(successor_host, [job])[0] for job in jobs]
    (model,) = successor_host.registry.loaded()
    before = model.worker.rows_sampled_together
    assert complete_together(successor_host, jobs) == alone
    assert model.worker.rows_sampled_together - before >= 7 * 24, "the greedy rows were sampled together"
    assert len(set(alone[:7])) == 7 and alone[7], alone


def test_the_rows_follow_llamas_logits_array_when_it_moves(random_model: LlamaModel) -> None:
    """The worker keeps its numpy view of llama.cpp's logits while they stay at one address; a decode that
    asks for more rows than llama.cpp's output buffer holds moves them, and the view follows."""
    context = LlamaContext(random_model, ModelParams(threads=2, batch_size=256), KvLayout(64, N_SEQ))
    batch = context.new_batch()
    addresses = set()
    position = 0
    try:
        for step, per_seq in enumerate((1, 1, 3, 1)):  # 8 rows, 8, 24 (more than the buffer held), 8
            batch.clear()
            for seq in range(N_SEQ):
                for k in range(per_seq):
                    batch.add(11 + 97 * seq + 13 * k + step, position + k, seq, True)
            position += per_seq
            assert context.decode(batch) == 0
            addresses.add(ctypes.cast(llama_cpp.llama_get_logits(context.ptr), ctypes.c_void_p).value)
            for rows in (list(range(N_SEQ)), list(range(batch.n))):  # the first rows, then all of them
                assert context.greedy_tokens(rows) == [per_row(context, i)[1] for i in rows]
        assert len(addresses) > 1, "the logits moved (with no more rows read than before, at first)"
    finally:
        batch.close()
        context.close()
