"""The host draws what llama.cpp's ``common_sampler_sample`` draws (WasmEdge's GGML plugin, llama-server).

:class:`CommonSampler` below re-implements ``common_sampler_init`` and ``common_sampler_sample(..., idx,
grammar_first)`` of llama.cpp's ``common/sampling.cpp`` from the sampler primitives llama-cpp-python
exports: the same chain (logit bias with the vocabulary's suppressed tokens, penalties, DRY, top-n-sigma,
top-k, typical, top-p, min-p, XTC, temperature, dist, every stage present as llama.cpp adds it) and the
same order: the chain draws from the unconstrained candidates, the grammar checks that one token, and
only a refused token makes it refill the candidates, mask them with the grammar and run the chain again.

Both sides consume the very same logits: the host's sampler is wrapped to record a copy of the logits
it samples from at each step, and the reference samples from those copies.  So the comparison holds on
any CPU (llama.cpp's logits differ between AVX2 and AVX-512 kernels, batch shapes and thread counts;
the sampler primitives are the same scalar code on both sides).
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import numpy as np
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.keys import parse_config
from wasinn_host.core.config.params import ContextParams, SamplingParams
from wasinn_host.core.inference import InferenceContext
from wasinn_host.llama import sampler as host_sampler
from wasinn_host.llama.grammar_sampling import GrammarSampler, GreedySampler, allowed_indices, kth_largest
from wasinn_host.llama.json_schema import schema_to_grammar
from wasinn_host.llama.piece_trie import PieceTrie
from wasinn_host.testing.gguf_models import write_successor_model
from wasinn_host.testing.real_models import real_model_or_skip
from wasinn_host.testing.successor import char_token_id

CTX = 256
LOAD = {"ctx-size": CTX, "threads": 2}
SENTENCE = 'root ::= [a-z]+ (" " [a-z]+){2,5} "."'
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
}


# -- the reference: common_sampler_init / common_sampler_sample / common_sampler_accept ----------------


class CommonSampler:
    """llama.cpp's ``common_sampler`` for one sequence, built from the host's :class:`SamplingParams`."""

    def __init__(self, vocab: Any, p: SamplingParams, n_ctx: int) -> None:
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, p.grammar.encode(), b"root") if p.grammar else None
        self.chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        stages = []
        biases = list(p.logit_bias)
        n_suppress = ctypes.c_int32(0)
        suppress = llama_cpp.llama_vocab_get_suppress_tokens(vocab, ctypes.byref(n_suppress))
        biases += [(int(suppress[i]), float("-inf")) for i in range(n_suppress.value)]
        if biases:
            merged = (llama_cpp.llama_logit_bias * len(biases))()
            for i, (token, bias) in enumerate(biases):
                merged[i] = llama_cpp.llama_logit_bias(token, bias)
            stages.append(llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, len(biases), merged))
        if p.mirostat == 0:
            breakers = [b.encode() for b in p.dry_sequence_breakers]
            c_breakers = (ctypes.c_char_p * len(breakers))(*breakers)
            stages += [
                llama_cpp.llama_sampler_init_penalties(
                    self.n_vocab,
                    n_ctx if p.last_n_penalty < 0 else p.last_n_penalty,
                    p.repeat_penalty,
                    p.frequency_penalty,
                    p.presence_penalty,
                ),
                llama_cpp.llama_sampler_init_dry(
                    vocab,
                    p.dry_multiplier,
                    p.dry_base,
                    p.dry_allowed_length,
                    n_ctx if p.dry_last_n < 0 else p.dry_last_n,
                    c_breakers,
                    len(breakers),
                ),
                llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma),
                llama_cpp.llama_sampler_init_top_k(p.top_k),
                llama_cpp.llama_sampler_init_typical(p.typ_p, p.min_keep),
                llama_cpp.llama_sampler_init_top_p(p.top_p, p.min_keep),
                llama_cpp.llama_sampler_init_min_p(p.min_p, p.min_keep),
                llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, p.seed),
                llama_cpp.llama_sampler_init_temp_ext(p.temp, p.dynatemp_range, p.dynatemp_exponent),
                llama_cpp.llama_sampler_init_dist(p.seed),
            ]
        else:
            stages.append(llama_cpp.llama_sampler_init_temp(p.temp))
            if p.mirostat == 1:
                stages.append(
                    llama_cpp.llama_sampler_init_mirostat(self.n_vocab, p.seed, p.mirostat_ent, p.mirostat_eta, 100)
                )
            else:
                stages.append(llama_cpp.llama_sampler_init_mirostat_v2(p.seed, p.mirostat_ent, p.mirostat_eta))
        for stage in stages:
            llama_cpp.llama_sampler_chain_add(self.chain, stage)
        self.cur = np.zeros(self.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        self.cur_p = llama_cpp.llama_token_data_array(
            data=self.cur.ctypes.data_as(llama_cpp.llama_token_data_p), size=self.n_vocab, selected=-1, sorted=False
        )

    def _set_logits(self, logits: np.ndarray) -> None:
        """``common_sampler::set_logits``: every token with its logit, in id order."""
        self.cur["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self.cur["logit"] = logits
        self.cur["p"] = 0.0
        self.cur_p.size, self.cur_p.selected, self.cur_p.sorted = self.n_vocab, -1, False

    def _selected(self) -> int:
        assert 0 <= self.cur_p.selected < self.cur_p.size
        return int(self.cur_p.data[self.cur_p.selected].id)

    def sample(self, logits: np.ndarray, grammar_first: bool = False) -> int:
        """``common_sampler_sample(gsmpl, ctx, idx, grammar_first)`` on these logits."""
        self._set_logits(logits)
        if grammar_first and self.grammar is not None:
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(self.cur_p))
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(self.cur_p))
        token = self._selected()
        if grammar_first or self.grammar is None:
            return token
        single = llama_cpp.llama_token_data(token, 1.0, 0.0)
        single_p = llama_cpp.llama_token_data_array(data=ctypes.pointer(single), size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(single_p))
        if single.logit != float("-inf"):
            return token
        self._set_logits(logits)  # resampling: the grammar over every candidate, then the chain again
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(self.cur_p))
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(self.cur_p))
        return self._selected()

    def accept(self, token: int) -> None:
        """``common_sampler_accept(gsmpl, token, true)``: the grammar, then the chain."""
        if self.grammar is not None:
            llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain, token)

    def close(self) -> None:
        for sampler in (self.grammar, self.chain):
            if sampler:
                llama_cpp.llama_sampler_free(sampler)


# -- the host, its logits recorded ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_nn() -> Iterator[WasiNN]:
    registry = ModelRegistry([f"{name}:GGML:AUTO:{real_model_or_skip(name)}" for name in ("smollm2", "gemma3")])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="module")
def vocabs() -> Iterator[dict[str, Any]]:
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    models = {
        name: llama_cpp.llama_model_load_from_file(str(real_model_or_skip(name)).encode(), params)
        for name in ("smollm2", "gemma3")
    }
    assert all(models.values())
    yield {name: llama_cpp.llama_model_get_vocab(model) for name, model in models.items()}
    for model in models.values():
        llama_cpp.llama_model_free(model)


def host_run(nn: WasiNN, name: str, config: dict[str, Any], prompt: str) -> tuple[list[int], Any]:
    """The tokens one compute generates through the host, and its sampler."""
    with nn.session(name, {**LOAD, **config}) as session:
        session.complete(prompt)
        context = session._context
        assert isinstance(context, InferenceContext)
        sampler = context.state.sampler
        assert isinstance(sampler, host_sampler.Sampler)
        return list(context.output_tokens), sampler.grammar or sampler.greedy


def reference_run(vocab: Any, config: dict[str, Any], steps: list[tuple[np.ndarray, int]]) -> list[int]:
    """What ``common_sampler_sample`` draws from the host's recorded logits, step by step."""
    params = parse_config(json.dumps({**LOAD, **config}).encode()).apply_context(ContextParams()).sampling
    reference = CommonSampler(vocab, params, CTX)
    try:
        tokens = []
        for logits, _host_token in steps:
            token = reference.sample(logits, grammar_first=params.grammar_first)
            reference.accept(token)
            tokens.append(token)
        return tokens
    finally:
        reference.close()


def assert_same_draws(
    nn: WasiNN,
    vocabs: dict[str, Any],
    steps: list[tuple[np.ndarray, int]],
    name: str,
    config: dict[str, Any],
    prompt: str,
) -> Any:
    tokens, sampler = host_run(nn, name, config, prompt)
    assert [token for _, token in steps] == tokens, "every generated token was recorded"
    assert len(tokens) >= 3
    assert reference_run(vocabs[name], config, steps) == tokens
    return sampler


# -- the cases -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "seed", "extra"),
    [
        ("smollm2", 1234, {}),
        ("gemma3", 7, {}),  # the defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
        ("smollm2", 5, {"repeat-penalty": 1.3, "presence-penalty": 0.4, "frequency-penalty": 0.2}),
        ("gemma3", 99, {"repeat-penalty": 1.3, "typical-p": 0.9}),
    ],
)
def test_grammar_draws_are_common_samplers(
    real_nn: WasiNN,
    vocabs: dict[str, Any],
    recorded: list[tuple[np.ndarray, int]],
    name: str,
    seed: int,
    extra: dict[str, float],
) -> None:
    """At temp > 0 the chain draws first; a refused token (the seeded generator has advanced once) makes
    the grammar mask the candidates and the chain draw again: the same tokens as llama.cpp's order."""
    config = {"grammar": SENTENCE, "n-predict": 24, "seed": seed, **extra}
    sampler = assert_same_draws(real_nn, vocabs, recorded, name, config, "A short sentence:")
    assert isinstance(sampler, GrammarSampler)
    assert sampler.draws == len(recorded) and sampler.rejections > 0, "the grammar refused some draws"


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_json_schema_draws_are_common_samplers(
    real_nn: WasiNN, vocabs: dict[str, Any], recorded: list[tuple[np.ndarray, int]], name: str
) -> None:
    """A JSON schema at the default temperature, with a frequency penalty: both kinds of masked step
    (on the k most likely allowed tokens alone, and on the whole masked vocabulary) are taken."""
    gbnf = schema_to_grammar(json.dumps(PERSON_SCHEMA))
    config = {"grammar": gbnf, "n-predict": 64, "seed": 3, "frequency-penalty": 0.3}
    sampler = assert_same_draws(
        real_nn, vocabs, recorded, name, config, "Here is a JSON record about the programmer Ada Lovelace:\n"
    )
    assert isinstance(sampler, GrammarSampler)
    assert sampler.rejections > 0 and sampler.fast_steps + sampler.full_steps == sampler.rejections
    assert sampler.trie_steps > 0, "some refused draws had the piece trie find the allowed tokens"


@pytest.mark.parametrize(("name", "seed"), [("smollm2", 11), ("gemma3", 12)])
def test_unconstrained_draws_with_penalties_are_common_samplers(
    real_nn: WasiNN, vocabs: dict[str, Any], recorded: list[tuple[np.ndarray, int]], name: str, seed: int
) -> None:
    config = {"n-predict": 24, "seed": seed, "repeat-penalty": 1.2, "frequency-penalty": 0.5, "min-p": 0.02}
    assert_same_draws(real_nn, vocabs, recorded, name, config, "Once upon a time")


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_grammar_picks_what_common_sampler_picks(
    real_nn: WasiNN, vocabs: dict[str, Any], recorded: list[tuple[np.ndarray, int]], name: str
) -> None:
    """At temp 0 llama.cpp's chain keeps the highest logit (temperature 0) and the draw takes it; the host's
    greedy choice under the grammar is the same token, with a repeat penalty too."""
    config = {"grammar": SENTENCE, "n-predict": 24, "temp": 0, "repeat-penalty": 1.3}
    sampler = assert_same_draws(real_nn, vocabs, recorded, name, config, "A short sentence:")
    assert isinstance(sampler, GreedySampler) and sampler.rejections > 0


@pytest.mark.parametrize(("name", "seed"), [("smollm2", 21), ("gemma3", 22)])
def test_grammar_first_draws_are_common_samplers_grammar_first(
    real_nn: WasiNN, vocabs: dict[str, Any], recorded: list[tuple[np.ndarray, int]], name: str, seed: int
) -> None:
    """``grammar-first``: the grammar masks before every draw, as ``common_sampler_sample(..., true)``."""
    config = {"grammar": SENTENCE, "n-predict": 24, "seed": seed, "grammar-first": True}
    sampler = assert_same_draws(real_nn, vocabs, recorded, name, config, "A short sentence:")
    assert isinstance(sampler, GrammarSampler)
    assert sampler.draws == 0 and sampler.fast_steps > 0 and sampler.full_steps > 0


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_the_models_suppressed_tokens_are_never_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temp: float
) -> None:
    """A GGUF's ``tokenizer.ggml.suppress_tokens`` join the logit bias at -inf, as ``common_sampler_init``
    merges them: the successor model, whose every token is sure of its successor, never says ``c``."""
    suppressed = char_token_id("c")
    add_vocab_size = gguf.GGUFWriter.add_vocab_size

    def with_suppressed(self: gguf.GGUFWriter, size: int) -> None:
        add_vocab_size(self, size)
        self.add_array("tokenizer.ggml.suppress_tokens", [suppressed])

    monkeypatch.setattr(gguf.GGUFWriter, "add_vocab_size", with_suppressed)
    path = write_successor_model(tmp_path / "suppressing.gguf")
    monkeypatch.undo()
    nn = WasiNN(preload=[f"supp:GGML:AUTO:{path}"], registry=ModelRegistry())
    try:
        with nn.session("supp", {"temp": temp, "seed": 3, "n-predict": 4, "ignore-eos": True}) as session:
            session.complete("a")
            context = session._context
            assert isinstance(context, InferenceContext)
            tokens = list(context.output_tokens)
    finally:
        nn.registry.close()
    assert tokens[0] == char_token_id("b") and suppressed not in tokens


# -- the piece trie: every allowed token, found without testing them all ---------------------------


@pytest.mark.parametrize(
    ("name", "gbnf"),
    [
        ("smollm2", schema_to_grammar(json.dumps(PERSON_SCHEMA))),
        ("gemma3", schema_to_grammar(json.dumps(PERSON_SCHEMA))),
        ("gemma3", 'root ::= "é" [0-9]{1,3} (" " [^éa-c]{1,4}){2,5} "."'),
        ("smollm2", 'root ::= ("日本" | [ぁ-ん]+ | "x" [0-9]*)+ "。"'),
    ],
)
def test_piece_trie_finds_what_the_grammar_allows(vocabs: dict[str, Any], name: str, gbnf: str) -> None:
    """On a random walk through the grammar (a token the grammar allows at each step, pieces that end
    inside a character included), the trie's allowed tokens equal the grammar's verdict on the whole
    vocabulary wherever the accepted text ends on a character boundary, and restrictive states test
    a fraction of the vocabulary."""
    vocab = vocabs[name]
    trie = PieceTrie.of_vocab(vocab, llama_cpp.llama_vocab_n_tokens(vocab))
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    every = np.arange(len(trie.pieces))
    tested: list[int] = []

    def test(tokens: np.ndarray) -> np.ndarray:
        tested.append(len(tokens))
        return allowed_indices(grammar, tokens, None)

    rng = np.random.default_rng(5)
    pending, compared, restrictive = 0, 0, 0
    try:
        for _ in range(40):
            allowed = allowed_indices(grammar, every, None)
            if pending == 0:
                tested.clear()
                assert np.array_equal(trie.allowed(test), allowed)
                compared += 1
                if len(allowed) < len(every) // 20:
                    restrictive += 1
                    assert sum(tested) < len(every) / 2
            choices = [t for t in allowed if not llama_cpp.llama_vocab_is_eog(vocab, int(t))]
            if not choices:
                break
            short = [t for t in choices if len(trie.pieces[t]) <= 2]  # single characters and byte tokens too
            token = int(rng.choice(short if short and rng.random() < 0.5 else choices))
            llama_cpp.llama_sampler_accept(grammar, token)
            pending = PieceTrie.pending_after(pending, trie.pieces[token])
    finally:
        llama_cpp.llama_sampler_free(grammar)
    assert compared >= 5 and restrictive >= 1


@pytest.mark.parametrize("shape", ["normal", "ties", "mostly_banned", "sorted", "nan"])
def test_kth_largest_is_what_a_partition_gives(shape: str) -> None:
    """The rounds' thresholds are those of ``np.partition`` over every logit, whatever the sample's guess
    (too low, too high, on ties, with -inf or NaN among the values)."""
    rng = np.random.default_rng(5)
    for n in (10, 5000, 262_144):
        if shape == "ties":
            values = rng.integers(0, 5, n).astype(np.float32)
        elif shape == "mostly_banned":
            values = np.full(n, -np.inf, dtype=np.float32)
            values[rng.integers(0, n, 50)] = rng.standard_normal(50)
        else:
            values = rng.standard_normal(n).astype(np.float32)
            if shape == "sorted":  # the strided sample sees the largest values at the end only
                values.sort()
            elif shape == "nan":
                values[n // 3] = np.nan
        for k in sorted({1, 2, 40, 64, 80, 640, 1000, 5120, n // 2, n} & set(range(1, n + 1))):
            expected = np.partition(values, n - k)[n - k]
            np.testing.assert_equal(kth_largest(values, k), expected, err_msg=f"n={n} k={k}")
