"""Memory that follows the work, on real llama.cpp: the worker asks for logits rows only where it samples,
each context has room for no more rows than a batch can ask (llama.cpp's compute buffer is reserved for
them, not for ``batch-size`` rows), and the samplers of a worker share one candidates array."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams, SamplingParams
from wasinn_host.core.runtime import KvLayout
from wasinn_host.llama import context as llama_context
from wasinn_host.llama import sampler as llama_sampler
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.buffers import max_outputs
from wasinn_host.llama.context import LlamaContext
from wasinn_host.llama.model import LlamaModel

from . import sessions


@pytest.fixture
def host(successor_path: pathlib.Path) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """[logits rows asked, tokens sampled] of every decode, as the worker runs them (row by row or
    greedy rows together)."""
    recorded: list[list[int]] = []
    decode, sample, greedy_tokens = LlamaContext.decode, llama_sampler.Sampler.sample, LlamaContext.greedy_tokens

    def counting_decode(
        self: LlamaContext, batch: llama_context.Batch, first: int = 0, count: int | None = None
    ) -> int:
        end = batch.n if count is None else first + count
        rows = sum(1 for i in range(first, end) if batch.raw.logits[i])
        assert rows == batch.n_outputs or (first, end) != (0, batch.n)
        recorded.append([rows, 0])
        return decode(self, batch, first, count)

    def counting_sample(self: Any, ctx: Any, batch_index: int) -> int:
        recorded[-1][1] += 1
        return sample(self, ctx, batch_index)

    def counting_greedy(self: LlamaContext, batch_indices: list[int]) -> list[int]:
        recorded[-1][1] += len(batch_indices)  # greedy rows sampled together
        return greedy_tokens(self, batch_indices)

    monkeypatch.setattr(LlamaContext, "decode", counting_decode)
    monkeypatch.setattr(llama_sampler.Sampler, "sample", counting_sample)
    monkeypatch.setattr(LlamaContext, "greedy_tokens", counting_greedy)
    return recorded


def complete_together(nn: WasiNN, jobs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each (prompt, config) completed by its own session, all at once."""
    return sessions.complete_together(nn, jobs, {"temp": 0, "ctx-size": 256, "batch-size": 64})


def test_logits_rows_asked_are_the_tokens_sampled(host: WasiNN, steps: list[list[int]]) -> None:
    jobs: list[tuple[str, dict[str, Any]]] = [
        ("a", {"n-predict": 6}),
        ("klmno" * 20, {"n-predict": 3}),
        ("b" * 200, {"n-predict": 5}),  # a prompt in several chunks (batch-size 64): no row until its last
        ("xyz", {"n-predict": 0}),  # prompt only: nothing is sampled, so no row is asked
        ("pq", {"n-predict": 4, "repeat-penalty": 1.1}),
    ]
    texts = complete_together(host, jobs)
    assert texts[0] == "bcdefg" and texts[3] == ""
    assert steps and all(rows == sampled for rows, sampled in steps), steps
    assert sum(sampled for _, sampled in steps) == 6 + 3 + 5 + 0 + 4
    assert max(rows for rows, _ in steps) > 1  # sequences shared batches


def test_a_draft_asks_a_row_per_token_within_the_room(host: WasiNN, steps: list[list[int]]) -> None:
    config: dict[str, Any] = {"n-predict": 40, "spec-type": "ngram-simple", "draft-max": 16, "draft-min": 1}
    text = complete_together(host, [("abcdefghijklmnopqrstuvwxyz" * 3 + "a", config)])[0]
    assert text == "bcdefghijklmnopqrstuvwxyz</s>"
    (model,) = host.registry.loaded()
    context = model.worker.context
    assert isinstance(context, LlamaContext)
    assert context.n_outputs_max == max_outputs(context.n_seq) < context.n_batch
    assert max(rows for rows, _ in steps) > 1, "a draft was verified"
    assert all(sampled <= rows <= context.n_outputs_max for rows, sampled in steps), steps


def test_the_compute_buffer_holds_the_rows_a_batch_can_ask(big_vocab_model: LlamaModel) -> None:
    row = big_vocab_model.n_vocab * 4
    for n_seq in (4, 32):
        context = LlamaContext(big_vocab_model, ModelParams(threads=2, batch_size=512), KvLayout(64, n_seq))
        try:
            rows = max_outputs(n_seq)
            assert context.n_outputs_max == rows
            # llama.cpp's log: one output row per sequence to start with; compute for `rows` rows of logits
            # (it would reserve 512 rows, 64 MiB here, for a context left at its default)
            assert context.buffers["output"] == n_seq * row
            assert rows * row <= context.buffers["compute"] < (rows + 8) * row
        finally:
            context.close()


def test_the_output_buffer_is_reused_by_later_requests(host: WasiNN, steps: list[list[int]]) -> None:
    """llama.cpp reserves a logits row per sequence and grows its output buffer when a batch asks for more
    rows than ever before (never beyond ``n_outputs_max``); requests of shapes it has seen reuse it."""
    config: dict[str, Any] = {"n-predict": 30, "spec-type": "ngram-simple", "draft-max": 16}
    prompt = "abcdefghijklmnopqrstuvwxyz" * 3 + "a"
    jobs: list[tuple[str, dict[str, Any]]] = [(prompt, config), ("c", {"n-predict": 4}), ("k", {"n-predict": 8})]
    complete_together(host, jobs)
    (model,) = host.registry.loaded()
    context = model.worker.context
    assert isinstance(context, LlamaContext)
    address, most, reused = logits_address(context), max(rows for rows, _ in steps), 0
    for _ in range(4):
        steps.clear()
        complete_together(host, jobs)
        assert model.worker.context is context
        rows = max(rows for rows, _ in steps)
        if rows <= most:
            assert logits_address(context) == address
            reused += 1
        address, most = logits_address(context), max(most, rows)
    assert reused and most <= context.n_outputs_max


def logits_address(context: LlamaContext) -> int:
    """Where llama.cpp's logits rows start (its output buffer: a new one would lie elsewhere)."""
    import ctypes

    return ctypes.cast(llama_cpp.llama_get_logits(context.ptr), ctypes.c_void_p).value or 0


def test_the_samplers_of_a_worker_share_one_candidates_array(big_vocab_model: LlamaModel) -> None:
    made = [
        llama_sampler.Sampler(big_vocab_model, SamplingParams(temp=0, repeat_penalty=1.1), 64),
        llama_sampler.Sampler(big_vocab_model, SamplingParams(temp=0, logit_bias=((5, 1.0),)), 64),
        llama_sampler.Sampler(big_vocab_model, SamplingParams(temp=0.7, grammar='root ::= "a"'), 64),
    ]
    try:
        arrays = {id(s.greedy.candidates if s.greedy else s.grammar.candidates) for s in made}  # type: ignore[union-attr]
        assert len(arrays) == 1
        elsewhere: list[object] = []

        def other_worker() -> None:
            sampler = llama_sampler.Sampler(big_vocab_model, SamplingParams(temp=0, repeat_penalty=1.1), 64)
            assert sampler.greedy is not None
            elsewhere.append(sampler.greedy.candidates)
            sampler.close()

        thread = threading.Thread(target=other_worker)
        thread.start()
        thread.join()
        assert elsewhere and id(elsewhere[0]) not in arrays  # another thread (another model's worker) has its own
    finally:
        for sampler in made:
            sampler.close()
