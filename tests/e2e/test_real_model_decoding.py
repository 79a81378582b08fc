"""Real models decoding (see test_real_models.py for the models and the reference): grammars over a real
vocabulary, embeddings, batched contexts, prefix reuse and context shift on Gemma 3's sliding-window cache, n-probs."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.llama.grammar_sampling import GreedySampler
from wasinn_host.session import Session
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.numerics import check_greedy

from .real import BOTH, GREEDY, LOAD, PERSON_SCHEMA, complete, inner

# -- grammars over a real vocabulary -----------------------------------------------------


def check_person(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert set(value) == {"name", "age", "languages"}
    assert isinstance(value["name"], str) and isinstance(value["age"], int)
    assert isinstance(value["languages"], list) and all(isinstance(x, str) for x in value["languages"])
    return dict(value)


def sampler_of(session: Session) -> GreedySampler:
    greedy = getattr(inner(session).state.sampler, "greedy", None)
    assert isinstance(greedy, GreedySampler)
    return greedy


@BOTH
def test_json_schema_output_parses_and_equals_the_grammar_first_chain(
    real_nn: WasiNN, natives: dict[str, NativeModel], name: str
) -> None:
    from wasinn_host.llama.json_schema import schema_to_grammar

    native = natives[name]
    prompt = b"Here is a JSON record about the programmer Ada Lovelace:\n"
    gbnf = schema_to_grammar(json.dumps(PERSON_SCHEMA))
    expected = native.generate(
        native.tokenize(prompt), 128, [native.grammar(gbnf), llama_cpp.llama_sampler_init_greedy()]
    )
    config = {**GREEDY, "json-schema": json.dumps(PERSON_SCHEMA), "n-predict": 128}
    with real_nn.session(name, config) as session:
        text = session.complete(prompt)
        greedy = sampler_of(session)
        tokens = list(inner(session).output_tokens)
    assert tokens == expected
    eog = native.piece(expected[-1]).decode()
    check_person(text.removesuffix(eog))
    # the path under test: the grammar refused the model's first choice several times, and the whole
    # answer tested fewer tokens than two passes over the vocabulary (grammar first: one per token)
    assert greedy.rejections > 0 and len(tokens) > 20
    assert greedy.tested < 2 * native.n_vocab


@BOTH
def test_grammar_with_logit_bias_and_penalty_equals_the_grammar_first_chain(
    real_nn: WasiNN, natives: dict[str, NativeModel], name: str
) -> None:
    """The stages before greedy (logit bias, repeat penalty) run on the whole vocabulary, then the grammar."""
    native = natives[name]
    gbnf = 'root ::= "Answer: " ("yes" | "no" | "maybe") (", " [a-z]+){1,4} "."'
    prompt = b"Is the sky blue? Answer yes or no, then give reasons.\n"
    banned = native.tokenize(b" because")[-1]
    bias = (llama_cpp.llama_logit_bias * 1)()
    bias[0] = llama_cpp.llama_logit_bias(banned, -100.0)
    stages = [
        native.grammar(gbnf),
        llama_cpp.llama_sampler_init_logit_bias(native.n_vocab, 1, bias),
        llama_cpp.llama_sampler_init_penalties(native.n_vocab, 64, 1.3, 0.0, 0.0),
        llama_cpp.llama_sampler_init_greedy(),
    ]
    expected = native.generate(native.tokenize(prompt), 32, stages)
    config = {
        **GREEDY,
        "grammar": gbnf,
        "n-predict": 32,
        "logit-bias": {str(banned): -100.0},
        "repeat-penalty": 1.3,
        "last-n-penalty": 64,
    }
    with real_nn.session(name, config) as session:
        session.complete(prompt)
        assert list(inner(session).output_tokens) == expected
        assert sampler_of(session).rejections > 0


# -- embeddings ----------------------------------------------------------------------------


def test_real_embeddings_are_normalised_deterministic_and_native(
    real_nn: WasiNN, natives: dict[str, NativeModel], model_paths: dict[str, Path]
) -> None:
    native = natives["smollm2"]
    nn = WasiNN(preload=[f"smol-embed:GGML:AUTO:{model_paths['smollm2']}"], registry=ModelRegistry())
    try:
        vectors = {}
        for text in ("The cat sat on the mat.", "A kitten rested on the rug.", "Stock prices fell sharply."):
            guest = AbiGuest.create(nn)
            graph = guest.load_by_name("smol-embed", json.dumps({"embedding": True, **LOAD}))[1]
            ctx = guest.init(graph)[1]
            runs = []
            for _ in range(2):
                assert guest.set_input(ctx, 0, text) == 0
                assert guest.call("compute", ctx) == 0
                runs.append(np.array(json.loads(guest.get_output(ctx, size=0x6000)[1])["embedding"]))
            assert np.array_equal(runs[0], runs[1])
            vectors[text] = runs[0]
            assert abs(np.linalg.norm(runs[0]) - 1.0) < 1e-5
            assert np.allclose(runs[0], native.embedding(text.encode()), atol=1e-5)
    finally:
        nn.registry.close()
    cat, kitten, stocks = vectors.values()
    assert float(cat @ kitten) > float(cat @ stocks)


# -- batched contexts ----------------------------------------------------------------------


BATCHED_PROMPTS = [b"1 2 3 4 5 6 7", b"10, 20, 30, 40,", b"a b c d e f g", b"The recipe for pancakes:"]
"""Three continuations both models make with wide margins, and one free text."""


@BOTH
def test_batched_contexts_equal_one_at_a_time(real_nn: WasiNN, natives: dict[str, NativeModel], name: str) -> None:
    """Four contexts decoded in the same batches give each the text it gets alone, as far as llama.cpp's
    numerics allow: a batch of four sequences runs other kernels than one sequence alone (Gemma 3's
    repacked Q4_K weights take rows in groups of four; AVX-512 machines choose other kernels again), so
    the reference (one at a time) follows each text, and every token must be within ``MARGIN`` of its
    best, and be its best wherever that leads by more."""
    native = natives[name]
    sessions = [real_nn.session(name, {**GREEDY, "n-predict": 20}) for _ in BATCHED_PROMPTS]
    worker = inner(sessions[0]).model.worker
    before = worker.sequences_decoded, worker.decode_calls
    outputs: list[list[int]] = [[] for _ in BATCHED_PROMPTS]
    barrier = threading.Barrier(len(BATCHED_PROMPTS))

    def run(i: int) -> None:
        barrier.wait()
        sessions[i].complete(BATCHED_PROMPTS[i])
        outputs[i] = list(inner(sessions[i]).output_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(BATCHED_PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in sessions:
        session.close()
    sequences, calls = worker.sequences_decoded - before[0], worker.decode_calls - before[1]
    assert sequences > calls, "the contexts were never decoded in one batch"
    forced = 0
    for prompt, tokens in zip(BATCHED_PROMPTS, outputs):
        assert len(tokens) == 20 or native.is_eog(tokens[-1]), tokens
        forced += check_greedy(native.follow(native.tokenize(prompt), tokens))
    assert forced >= 40, f"only {forced} of 80 steps had a clear best token: too weak a check"


# -- prefix reuse and context shift on Gemma 3's sliding-window cache ---------------------


def test_gemma3_prefix_reuse_past_the_window(real_nn: WasiNN, natives: dict[str, NativeModel]) -> None:
    """A second turn longer than the 512-token window reuses the first turn's cells and decodes only its
    new tokens.  The reference decodes the same two batches: llama.cpp's greedy text depends on how a
    prompt is split into batches (here, one batch of the whole prompt gives another answer)."""
    native = natives["gemma3"]
    first = " ".join(f"item {i} is {i * 7 % 13}." for i in range(90)).encode()
    n_first = len(native.tokenize(first))
    assert n_first > 512
    second = first + b" Which item is 12? item"
    expected = native.text(native.generate(native.tokenize(second), 12, n_ctx=1024, split=n_first))
    config = {**GREEDY, "ctx-size": 1024, "n-predict": 12}
    with real_nn.session("gemma3", config) as session:
        session.complete(first)
        answer = session.complete(second).encode()
        reused = session.metadata["reused_tokens"]
    assert reused == n_first
    assert answer == expected
    with real_nn.session("gemma3", {**config, "cache-prompt": False}) as session:
        session.complete(first)
        assert session.complete(second).encode() == native.text(
            native.generate(native.tokenize(second), 12, n_ctx=1024)
        )
        assert session.metadata["reused_tokens"] == 0


def test_gemma3_context_shift_equals_llama_cpp_shifting(real_nn: WasiNN, natives: dict[str, NativeModel]) -> None:
    """ctx-shift on Gemma 3's sliding-window cache: generation goes on past a full context of 64 cells,
    keeping the prompt and dropping half of the rest, exactly as llama.cpp's own cache shift gives."""
    native = natives["gemma3"]
    prompt = b"Count: 1, 2, 3, 4, 5, 6, 7, 8,"
    tokens = native.tokenize(prompt)
    expected = native.generate(tokens, 100, n_ctx=64, n_keep=len(tokens))
    assert len(expected) == 100
    config = {**GREEDY, "ctx-size": 64, "n-predict": 100, "ctx-shift": True, "n-keep": len(tokens)}
    with real_nn.session("gemma3", config) as session:
        session.complete(prompt)
        assert session.metadata["stop_reason"] == "n-predict"
        assert list(inner(session).output_tokens) == expected


# -- n-probs -------------------------------------------------------------------------------


@BOTH
def test_n_probs_over_a_real_vocabulary(real_nn: WasiNN, natives: dict[str, NativeModel], name: str) -> None:
    native = natives[name]
    prompt = b"The largest planet in the solar system is"
    expected = native.top_probabilities(native.tokenize(prompt), 6, 5)
    # the whole prompt decoded in one batch, as the reference does (a prefix kept from an earlier test's
    # prompt changes the batch shape, and on an AVX-512 CPU near-equal probabilities then swap places)
    out, meta = complete(real_nn, name, prompt, **{"n-predict": 6, "n-probs": 5, "cache-prompt": False})
    assert [step["id"] for step in meta["probs"]] == [token for token, _ in expected]
    for step, (token, top) in zip(meta["probs"], expected):
        assert [t["id"] for t in step["top"]] == [t for t, _ in top]
        assert np.allclose([t["p"] for t in step["top"]], [p for _, p in top], atol=2e-6)
        assert step["top"][0]["id"] == token
    assert out == native.text([token for token, _ in expected])
