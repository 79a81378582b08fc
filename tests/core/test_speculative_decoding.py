"""Speculative decoding through llama.cpp: the same tokens as plain decoding, greedy and sampled.

The toy models (successor, and its noisy twin for sampling) run through a guest-facing session; their
logits are exact whatever the batch, so speculative and plain texts are equal token for token, greedy
and sampled.  SmolLM2 (a real BPE model) checks a real answer that repeats its prompt.  Its plain text
equals llama.cpp's own decode (the same calls); the speculative one is verified in batches of several
tokens, which llama.cpp computes with other kernels than one token (differently again on AVX-512
machines), so llama.cpp alone follows it and each token must be within the margin those kernels allow
of its best (:mod:`wasinn_host.testing.numerics`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.errors import WasiNNError
from wasinn_host.core.inference import InferenceContext
from wasinn_host.session import Session
from wasinn_host.testing.gguf_models import write_successor_model
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.numerics import check_forced, check_greedy
from wasinn_host.testing.real_models import real_model_or_skip

SPEC = {"spec-type": "ngram-simple"}
PASSAGE = (
    "The museum opens at nine in the morning and closes at six in the evening. Tickets cost twelve euros for "
    "adults and six euros for children under fourteen. Guided tours start every hour from the main hall."
)


def complete(nn: WasiNN, name: str, prompt: str, **config: Any) -> tuple[str, dict[str, Any]]:
    with nn.session(name, config) as session:
        return session.complete(prompt), session.metadata


def inner(session: Session) -> InferenceContext:
    context = session._context
    assert isinstance(context, InferenceContext)
    return context


def test_greedy_toy_model_identical(nn: WasiNN) -> None:
    config = {"temp": 0, "n-predict": 48, "ctx-size": 256}
    prompt = "0123456789012"
    plain, plain_meta = complete(nn, "succ", prompt, **config)
    fast, meta = complete(nn, "succ", prompt, **config, **SPEC)
    assert fast == plain == "3456789012" * 4 + "34567890"
    assert meta["accepted_draft_tokens"] > 30 and meta["draft_tokens"] >= meta["accepted_draft_tokens"]
    assert "draft_tokens" not in plain_meta


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WasiNN]:
    """A successor model whose successor has about half the probability at temp 0.8 (top-k 40)."""
    path = write_successor_model(tmp_path_factory.mktemp("mixed") / "mixed.gguf", logit_gap=4.0)
    registry = ModelRegistry([f"mixed:GGML:AUTO:{path}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.mark.parametrize("chain", [{}, {"repeat-penalty": 1.3, "last-n-penalty": 64, "top-p": 0.9}])
def test_sampled_same_draws(mixed: WasiNN, chain: dict[str, float]) -> None:
    """With the same seed the sampler makes the same draws from the same distributions: verification
    samples every token as plain decoding does, whatever the draft says (a repeat penalty sees each
    verified token as plain decoding's does).  The model's logits are exact in any batch, on any CPU."""
    drafted = accepted = 0
    for seed in range(1, 7):
        config = {"temp": 0.8, "seed": seed, "min-p": 0.0, "top-p": 1.0, "n-predict": 48, "ctx-size": 256, **chain}
        prompt = "abcdefghij abcdefghij abcdefghij abcdefghij abc"
        plain, _ = complete(mixed, "mixed", prompt, **config, **{"ignore-eos": True})
        fast, meta = complete(mixed, "mixed", prompt, **config, **{"ignore-eos": True}, **SPEC)
        assert fast == plain, seed
        drafted += meta.get("draft_tokens", 0)
        accepted += meta.get("accepted_draft_tokens", 0)
    assert drafted > accepted > 0  # drafts both kept and refused


def test_stop_string_inside_a_draft(nn: WasiNN) -> None:
    config = {"temp": 0, "n-predict": 48, "ctx-size": 256, "stop": ["890"]}
    plain, _ = complete(nn, "succ", "01234567890123", **config)
    fast, meta = complete(nn, "succ", "01234567890123", **config, **SPEC)
    assert fast == plain == "4567"
    assert meta["stop_reason"] == "stop"


def test_context_closed_mid_speculation(nn: WasiNN) -> None:
    """Closing a context while its speculative compute runs ends that compute with an error; the
    model's other contexts go on and every sequence's cells match what the worker says it holds."""
    config = {"temp": 0, "n-predict": 4000, "ctx-size": 4096, "ignore-eos": True, **SPEC}
    keeper = nn.session("succ", {"temp": 0, "ctx-size": 4096})  # keeps the model loaded
    doomed = nn.session("succ", config)
    failure: list[BaseException] = []

    def long_compute() -> None:
        try:
            doomed.complete("0123456789" * 3)
        except WasiNNError as exc:
            failure.append(exc)

    thread = threading.Thread(target=long_compute)
    thread.start()
    context = inner(doomed)
    worker = context.model.worker
    deadline = time.monotonic() + 30
    while worker.accepted_draft_tokens == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    doomed.close()
    thread.join(30)
    assert not thread.is_alive()
    assert failure and "finalised" in str(failure[0])
    assert keeper.complete("abc") == "defghijklmnopqrstuvwxyz</s>"
    for slot in worker.slots:
        assert worker.context.seq_length(slot.seq_id) == len(slot.kv)
    keeper.close()


# -- a real model -----------------------------------------------------------------------

SMOL: dict[str, Any] = {"ctx-size": 512, "threads": 2, "n-predict": 64, "cache-prompt": False}
REPEAT = f"Text: {PASSAGE}\nCopy: {PASSAGE}\n\nText: {PASSAGE}\nCopy:"
"""A prompt SmolLM2 continues by copying, mostly with wide margins (so most steps are checked exactly)."""


@pytest.fixture(scope="module")
def smollm2() -> Iterator[WasiNN]:
    registry = ModelRegistry([f"smollm2:GGML:AUTO:{real_model_or_skip('smollm2')}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="module")
def native() -> Iterator[NativeModel]:
    model = NativeModel(real_model_or_skip("smollm2"), threads=SMOL["threads"])
    yield model
    model.close()


def tokens_of(nn: WasiNN, prompt: str, **config: Any) -> tuple[list[int], dict[str, Any]]:
    with nn.session("smollm2", config) as session:
        session.complete(prompt)
        return list(inner(session).output_tokens), session.metadata


def test_smollm2_greedy_answer_repeating_the_prompt(smollm2: WasiNN, native: NativeModel) -> None:
    prompt = native.tokenize(REPEAT.encode())
    plain, _ = tokens_of(smollm2, REPEAT, temp=0, **SMOL)
    assert plain == native.generate(prompt, 64, n_ctx=512)  # alone: the same llama.cpp calls
    fast, meta = tokens_of(smollm2, REPEAT, temp=0, **SMOL, **SPEC)
    forced = check_greedy(native.follow(prompt, fast, n_ctx=512))
    assert forced >= len(fast) // 2, f"only {forced} of {len(fast)} steps had a clear best token"
    assert meta["accepted_draft_tokens"] >= 10


@pytest.mark.parametrize("seed", [42, 7])
def test_smollm2_sampled_answer_repeating_the_prompt(smollm2: WasiNN, native: NativeModel, seed: int) -> None:
    """Sampled (temp 0.8, top-p 0.5, min-p 0.05, which keep the answer on its copy): wherever top-p or
    min-p leave llama.cpp's best token alone, whatever the kernels, plain and speculative texts have it.
    (That the draws themselves are plain decoding's is checked exactly on the constructed model above.)"""
    prompt = native.tokenize(REPEAT.encode())
    for spec in ({}, SPEC):
        tokens, meta = tokens_of(smollm2, REPEAT, temp=0.8, seed=seed, **{"top-p": 0.5}, **SMOL, **spec)
        forced = check_forced(native.follow(prompt, tokens, n_ctx=512), top_p=0.5, min_p=0.05)
        assert forced >= len(tokens) // 3, f"only {forced} of {len(tokens)} steps were forced"
    assert meta["accepted_draft_tokens"] >= 10
