"""Speculative decoding through llama.cpp: the same tokens as plain decoding, greedy and sampled.

The toy models (successor, and its noisy twin for sampling) run through a guest-facing session;
SmolLM2 (a real BPE model) checks a real answer that repeats its prompt.  SmolLM2 runs on one thread
here: with several, llama.cpp splits a one-token decode's work differently from a batch's, so a
logit can differ in its last bits between plain and batched decoding (the engine's verification
batch) and a near-tie can resolve the other way; on one thread its kernels give the same logits
for a token whatever else is in the batch, so any difference would be the engine's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.context import InferenceContext
from wasinn_host.core.errors import WasiNNError
from wasinn_host.session import Session
from wasinn_host.testing.gguf_models import write_successor_model
from wasinn_host.testing.real_models import real_model_path

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


def test_sampled_same_draws(mixed: WasiNN) -> None:
    """With the same seed the sampler makes the same draws from the same distributions: verification
    samples every token as plain decoding does, whatever the draft says."""
    drafted = accepted = 0
    for seed in range(1, 7):
        config = {"temp": 0.8, "seed": seed, "min-p": 0.0, "top-p": 1.0, "n-predict": 48, "ctx-size": 256}
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


@pytest.fixture(scope="module")
def smollm2() -> Iterator[WasiNN]:
    registry = ModelRegistry([f"smollm2:GGML:AUTO:{real_model_path('smollm2')}"])
    yield WasiNN(registry=registry)
    registry.close()


SMOL = {"ctx-size": 512, "threads": 1, "n-predict": 64, "cache-prompt": False}
REPEAT = f"<|im_start|>user\nRepeat the following text word for word:\n\n{PASSAGE}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("sampling", [{"temp": 0}, {"temp": 0.8, "seed": 42}, {"temp": 0.8, "seed": 7}])
def test_smollm2_answer_repeating_the_prompt(smollm2: WasiNN, sampling: dict[str, Any]) -> None:
    plain, _ = complete(smollm2, "smollm2", REPEAT, **SMOL, **sampling)
    fast, meta = complete(smollm2, "smollm2", REPEAT, **SMOL, **sampling, **SPEC)
    assert fast == plain
    if sampling["temp"] == 0:
        assert "twelve euros for adults" in fast and meta["accepted_draft_tokens"] >= 10
