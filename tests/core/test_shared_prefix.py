"""One prefill for a prompt prefix many contexts share: copied cells, counted once, freed safely.

Contexts that start together with the same long system prompt decode it once: the first decodes
it, the others wait for it and copy its cells (``llama_memory_seq_cp``).  Their answers must be
the ones each prompt gives alone, and each sequence's cells must stay its own when the sequence it
copied from is freed or overwritten.  The successor model's answers are exact; SmolLM2's are checked
against llama.cpp decoding each prompt alone, within the margin llama.cpp's kernels allow
(:mod:`wasinn_host.testing.numerics`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.inference import InferenceContext
from wasinn_host.core.scheduling.scheduler import MIN_SHARED_PREFIX, ModelWorker
from wasinn_host.session import Session
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.numerics import check_greedy
from wasinn_host.testing.real_models import real_model_or_skip

TOY = {"temp": 0, "ctx-size": 512, "n-parallel": 8, "n-predict": 6}
SYSTEM = "You are a helpful assistant. Answer in one line. " * 6  # 300 characters: 300 tokens of the toy model
QUESTIONS = ["abc", "klm", "pqr", "ABC", "KLM", "0123", "4567", "STU"]


def worker_of(session: Session) -> ModelWorker:
    context = session._context
    assert isinstance(context, InferenceContext)
    return context.model.worker


def cells_match(worker: ModelWorker) -> None:
    """Every slot's token list says how many cells its sequence really holds."""
    for slot in worker.slots:
        assert worker.context.seq_length(slot.seq_id) == len(slot.kv), slot


def together(nn: WasiNN, name: str, config: dict[str, Any], prompts: list[str]) -> tuple[list[str], list[Session]]:
    """Each prompt in its own session, all computing at once; the answers and the (open) sessions."""
    sessions = [nn.session(name, config) for _ in prompts]
    answers = [""] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        barrier.wait()
        answers[i] = sessions[i].complete(prompts[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return answers, sessions


def alone(nn: WasiNN, name: str, config: dict[str, Any], prompt: str) -> str:
    with nn.session(name, {**config, "cache-prompt": False}) as session:
        return session.complete(prompt)


@pytest.mark.parametrize("n_parallel", [8, None], ids=["n-parallel 8", "sequences follow demand"])
def test_eight_contexts_decode_a_shared_prompt_once(nn: WasiNN, n_parallel: int | None) -> None:
    """With sequences following demand the model grows from 4 to 8 sequences while the contexts start:
    the cells move over to the bigger context (and a copy not made yet is made there)."""
    config: dict[str, Any] = {**TOY, "n-parallel": n_parallel}
    if n_parallel is None:  # a model instance of its own (another ctx-size), starting with 4 sequences
        del config["n-parallel"]
        config["ctx-size"] = 384
    prompts = [SYSTEM + q for q in QUESTIONS]
    expected = [alone(nn, "succ", config, p) for p in prompts]
    probe = nn.session("succ", config)
    worker = worker_of(probe)
    decoded, shared = worker.prompt_tokens_decoded, worker.shared_prefix_tokens
    answers, sessions = together(nn, "succ", config, prompts)
    assert answers == expected
    assert answers[0] == "defghi"
    decoded = worker.prompt_tokens_decoded - decoded
    assert decoded <= 1 + len(SYSTEM) + sum(len(q) for q in QUESTIONS) + 8, decoded
    assert worker.shared_prefix_tokens - shared >= 7 * (1 + len(SYSTEM))
    cells_match(worker)
    assert worker.growths == (0 if n_parallel else 1)
    for session in [probe, *sessions]:
        session.close()


def test_copied_cells_survive_the_source_being_freed(nn: WasiNN) -> None:
    config = {**TOY, "n-parallel": 4}
    first = nn.session("succ", config)
    worker = worker_of(first)
    assert first.complete(SYSTEM + "abc") == "defghi"
    shared = worker.shared_prefix_tokens
    second = nn.session("succ", config)
    assert second.complete(SYSTEM + "klm") == "nopqrs"  # copies the system prompt from the first's sequence
    assert worker.shared_prefix_tokens - shared == 1 + len(SYSTEM)  # BOS and the system prompt
    first.close()  # the source's sequence is free now: the next context takes it and overwrites it
    third = nn.session("succ", config)
    assert third.complete("0123456789" * 20) == "012345"
    cells_match(worker)
    assert second.complete(SYSTEM + "klmnop") == "qrstuv"  # its own cells, its own prefix
    assert second.metadata["reused_tokens"] == 1 + len(SYSTEM) + 5
    cells_match(worker)
    second.close()
    third.close()


def test_a_short_shared_prefix_is_decoded_not_copied(nn: WasiNN) -> None:
    """Copying moves a whole sequence's cells: below MIN_SHARED_PREFIX tokens it is not worth it."""
    config = {**TOY, "n-parallel": 4}
    first, second = nn.session("succ", config), nn.session("succ", config)
    worker = worker_of(first)
    prefix = "x" * (MIN_SHARED_PREFIX - 3)
    assert first.complete(prefix + "abc") == "defghi"
    shared, decoded = worker.shared_prefix_tokens, worker.prompt_tokens_decoded
    assert second.complete(prefix + "klm") == "nopqrs"
    assert worker.shared_prefix_tokens == shared
    reused = second.metadata["reused_tokens"]
    assert reused <= 1  # at most a BOS its sequence held from an earlier test
    assert worker.prompt_tokens_decoded - decoded == 1 + len(prefix) + 3 - reused
    first.close()
    second.close()


# -- a real model: the answers each prompt gives alone, from copied cells ----------------


@pytest.fixture(scope="module")
def smollm2() -> Iterator[WasiNN]:
    registry = ModelRegistry([f"smollm2:GGML:AUTO:{real_model_or_skip('smollm2')}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="module")
def native() -> Iterator[NativeModel]:
    model = NativeModel(real_model_or_skip("smollm2"), threads=2)
    yield model
    model.close()


def test_smollm2_shared_system_prompt(smollm2: WasiNN, native: NativeModel) -> None:
    """The first context decodes its whole prompt; the others, started while it does, copy the shared
    part and decode the rest.  Each answer must be the one its prompt gives alone, as far as llama.cpp's
    numerics allow: the copied cells were computed in the leader's batches and the rest is decoded beside
    other sequences, which takes other kernels than one prompt decoded alone (on AVX-512 machines the
    greedy text then differs where two tokens are close).  So llama.cpp decoding each prompt alone follows
    its answer, and every token must be within ``MARGIN`` of its best, and be its best wherever that
    leads by more."""
    config = {"temp": 0, "ctx-size": 1024, "threads": 2, "n-parallel": 4, "n-predict": 16}
    system = (
        "<|im_start|>system\nYou are a museum guide. The museum opens at nine and closes at six. Tickets cost "
        "twelve euros, six for children. Tours start every hour from the main hall and last fifty minutes. "
        "Photographs without flash are allowed except in the painting gallery.<|im_end|>\n"
    )
    questions = ["When does it open?", "What does a ticket cost?", "Can I take photos?", "Is there a cafe?"]
    prompts = [f"{system}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in questions]
    sessions = [smollm2.session("smollm2", config) for _ in prompts]
    worker = worker_of(sessions[0])
    shared = worker.shared_prefix_tokens
    answers: list[list[int]] = [[] for _ in prompts]

    def one(i: int) -> None:
        sessions[i].complete(prompts[i])
        context = sessions[i]._context
        assert isinstance(context, InferenceContext)
        answers[i] = list(context.output_tokens)

    leader = threading.Thread(target=one, args=(0,))
    leader.start()
    while worker.active == 0 and leader.is_alive():
        pass
    others = [threading.Thread(target=one, args=(i,)) for i in range(1, len(prompts))]
    for t in others:
        t.start()
    for t in [leader, *others]:
        t.join(120)
    assert worker.shared_prefix_tokens - shared >= 3 * 50
    cells_match(worker)
    for session in sessions:
        session.close()
    forced = 0
    for prompt, tokens in zip(prompts, answers):
        assert len(tokens) == config["n-predict"] or native.is_eog(tokens[-1]), tokens
        forced += check_greedy(native.follow(native.tokenize(prompt.encode()), tokens, n_ctx=1024))
    assert forced >= 6, f"only {forced} steps had a clear best token: too weak a check"  # 14 of 64 here
