"""Sampler chains built as llama.cpp's ``common_sampler_init`` builds them, and the checks of a
guest's grammar (or JSON schema) and logit bias against the model."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import tempfile
from typing import Any, Iterator, Protocol

from ..core.config.params import SamplingParams
from ..core.errors import ErrorKind, WasiNNError
from .batch_sampling import RowDraw, draw, draw_kind
from .bindings import llama_cpp
from .grammar_sampling import GrammarSampler, GreedySampler
from .json_schema import sampling_grammar
from .log import CAPTURE_LOCK
from .piece_trie import has_token_elements, trie_of


class LlamaModel(Protocol):
    """What a sampler needs of a loaded model (:class:`.model.LlamaModel`): its vocabulary."""

    vocab: Any
    n_vocab: int

    def piece(self, token: int) -> bytes:
        """The bytes of one token."""
        ...


class LlamaContext(Protocol):
    """What a sampler needs of a context (:class:`.context.LlamaContext`): llama.cpp's pointer."""

    ptr: Any


class Sampler:
    """A context's sampling, built from :class:`SamplingParams` as llama.cpp's ``common_sampler_init``
    builds its chain (what WasmEdge's GGML plugin and llama-server use).

    logit bias -> penalties -> DRY -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> XTC -> temperature
    (dynamic if ``dynatemp-range`` > 0) -> distribution; with mirostat 1/2: logit bias -> temperature
    -> mirostat (no penalties, DRY or truncation, as llama.cpp).  Stages whose settings make them
    no-ops are left out.  A grammar is not in the chain: a
    :class:`~.grammar_sampling.GrammarSampler` checks the chain's draw and masks only after a
    rejection (``common_sampler_sample``'s order; ``grammar-first`` masks first).  With ``temp <= 0``
    a :class:`~.grammar_sampling.GreedySampler` makes the greedy choice: the same tokens, without a
    copy of every logit or a grammar pass over the whole vocabulary per token.  A chain of (penalties,)
    top-k, top-p, min-p, temperature and the draw alone is a :class:`~.batch_sampling.RowDraw`: the worker
    samples such rows together, as arrays, drawing the tokens llama.cpp's chain draws (penalties too).
    """

    def __init__(self, model: LlamaModel, params: SamplingParams, n_ctx_seq: int) -> None:
        self.ptr: ctypes.c_void_p | None = None
        """The chain (None with a :class:`GreedySampler` or :class:`GrammarSampler`, which own the
        stages then)."""
        self.greedy: GreedySampler | None = None
        self.grammar: GrammarSampler | None = None
        self.draw: RowDraw | None = None
        """The draw as arrays (no llama.cpp chain then)."""
        gbnf = sampling_grammar(params)
        if not gbnf and not params.greedy:
            kind = None if _suppressed_tokens(model) else draw_kind(params, model.n_vocab, n_ctx_seq)
            if kind is not None:
                self.draw = RowDraw(kind, params.seed, model.n_vocab, functools.partial(_truncation, model, params))
                return
            self.ptr = _chain(_pre_stages(model, params, n_ctx_seq) + _draw_stages(model, params))
            return
        grammar = grammar_sampler(model, gbnf) if gbnf else None  # invalid: raises first
        try:
            pre = _pre_stages(model, params, n_ctx_seq)
        except BaseException:
            if grammar is not None:
                llama_cpp.llama_sampler_free(grammar)
            raise
        if params.greedy:
            self.greedy = GreedySampler(_chain(pre) if pre else None, grammar, model.n_vocab)
            return
        assert grammar is not None
        # top-n-sigma, before top-k, measures the spread of every allowed logit: no top-k shortcut then
        top_k = params.top_k if params.mirostat == 0 and params.top_n_sigma <= 0 else 0
        self.grammar = GrammarSampler(
            _chain(pre) if pre else None,
            grammar,
            _chain(_draw_stages(model, params)),
            top_k,
            model.n_vocab,
            grammar_first=params.grammar_first,
            trie=None if has_token_elements(gbnf) else functools.partial(trie_of, model),
            piece=model.piece,
        )

    @property
    def argmax_only(self) -> bool:
        """Whether the choice is the most likely token of the raw logits row and accepting it changes
        nothing (greedy, without logit bias, penalties, DRY or a grammar): such contexts' rows are
        sampled together (:meth:`.context.LlamaContext.greedy_tokens`)."""
        greedy = self.greedy
        return greedy is not None and greedy.pre is None and greedy.grammar is None

    @property
    def draws_together(self) -> bool:
        """Whether its rows are drawn as arrays with others' (:meth:`.context.LlamaContext.drawn_tokens`)."""
        return self.draw is not None

    def sample(self, ctx: LlamaContext, batch_index: int) -> int:
        """Sample (and accept) a token from the logits at ``batch_index``."""
        if self.draw is not None:
            import numpy as np

            row = llama_cpp.llama_get_logits_ith(ctx.ptr, batch_index)
            return draw(np.ctypeslib.as_array(row, shape=(1, self.draw.n_vocab)), [self.draw])[0]
        if self.greedy is not None:
            return self.greedy.sample(ctx.ptr, batch_index)
        if self.grammar is not None:
            return self.grammar.sample(ctx.ptr, batch_index)
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, batch_index))

    def reset(self) -> None:
        """Forget the chain's history."""
        if self.draw is not None:
            self.draw.reset()
        elif self.greedy is not None:
            self.greedy.reset()
        elif self.grammar is not None:
            self.grammar.reset()
        elif self.ptr:
            llama_cpp.llama_sampler_reset(self.ptr)

    def close(self) -> None:
        """Free the chain (or the grammar sampler and the stages it owns)."""
        if self.draw is not None:
            self.draw.close()
            self.draw = None
        if self.greedy is not None:
            self.greedy.close()
            self.greedy = None
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None


def _truncation(model: LlamaModel, params: SamplingParams) -> ctypes.c_void_p:
    """The chain's stages after the penalties and before the draw (for :func:`.batch_sampling.exact_draw`,
    which is given the row with the penalties applied)."""
    stages = _draw_stages(model, params)
    llama_cpp.llama_sampler_free(stages.pop())  # the dist sampler
    return _chain(stages)


def _chain(stages: list[ctypes.c_void_p]) -> ctypes.c_void_p:
    """A sampler chain owning ``stages``."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for sampler in stages:
        llama_cpp.llama_sampler_chain_add(chain, sampler)
    return chain


@contextlib.contextmanager
def capture_stderr() -> Iterator[list[str]]:
    """Collect what C code prints on file descriptor 2 during a call (llama.cpp's grammar
    parser reports the position of a syntax error there, not through its log)."""
    lines: list[str] = []
    with CAPTURE_LOCK, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read(8192).decode("utf-8", "replace").splitlines())


def grammar_sampler(model: LlamaModel, grammar: str) -> ctypes.c_void_p:
    """A GBNF grammar sampler; an invalid-argument error with llama.cpp's parse message if the grammar is invalid."""
    with capture_stderr() as lines:
        sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
    if not sampler:
        detail = next((line.strip() for line in lines if "error" in line), "llama.cpp rejected it")
        raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"invalid grammar: {detail[:300]}")
    return sampler


def check_sampling(model: LlamaModel, params: SamplingParams) -> None:
    """Raise an invalid-argument error if the JSON schema does not convert to a grammar, the grammar does
    not parse or a logit-bias token is not in the vocabulary."""
    _check_logit_bias(model, params)
    gbnf = sampling_grammar(params)
    if gbnf:
        llama_cpp.llama_sampler_free(grammar_sampler(model, gbnf))


def _check_logit_bias(model: LlamaModel, p: SamplingParams) -> None:
    """Raise an invalid-argument error naming the first logit-bias token outside the vocabulary."""
    for token, _bias in p.logit_bias:
        if token >= model.n_vocab:
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"config key 'logit-bias': token id {token} is not in the vocabulary of {model.n_vocab}",
            )


def _suppressed_tokens(model: LlamaModel) -> int:
    """How many tokens the vocabulary bans from sampling (llama.cpp adds them to the logit bias)."""
    n_suppress = ctypes.c_int32(0)
    llama_cpp.llama_vocab_get_suppress_tokens(model.vocab, ctypes.byref(n_suppress))
    return int(n_suppress.value)


def _pre_stages(model: LlamaModel, p: SamplingParams, n_ctx_seq: int) -> list[ctypes.c_void_p]:
    """The stages that change logits token by token: logit bias (the model's suppressed tokens banned, as
    llama.cpp's ``common_sampler_init``), then (without mirostat) penalties and DRY."""
    _check_logit_bias(model, p)
    stages = []
    n_suppress = ctypes.c_int32(0)
    suppress = llama_cpp.llama_vocab_get_suppress_tokens(model.vocab, ctypes.byref(n_suppress))
    merged = [*p.logit_bias, *((int(suppress[i]), float("-inf")) for i in range(n_suppress.value))]
    if merged:
        biases = (llama_cpp.llama_logit_bias * len(merged))()
        for i, (token, bias) in enumerate(merged):
            biases[i] = llama_cpp.llama_logit_bias(token, bias)
        stages.append(llama_cpp.llama_sampler_init_logit_bias(model.n_vocab, len(merged), biases))
    if p.mirostat != 0:
        return stages  # llama.cpp's mirostat chain: logit bias, temperature, mirostat
    last_n = n_ctx_seq if p.last_n_penalty < 0 else p.last_n_penalty
    if p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
        stages.append(
            llama_cpp.llama_sampler_init_penalties(
                model.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        )
    if p.dry_multiplier > 0:
        breakers = (ctypes.c_char_p * len(p.dry_sequence_breakers))(*(b.encode() for b in p.dry_sequence_breakers))
        dry_last_n = n_ctx_seq if p.dry_last_n < 0 else p.dry_last_n
        stages.append(
            llama_cpp.llama_sampler_init_dry(
                model.vocab,
                p.dry_multiplier,
                p.dry_base,
                p.dry_allowed_length,
                dry_last_n,
                breakers,
                len(p.dry_sequence_breakers),
            )
        )
    return stages


def _draw_stages(model: LlamaModel, p: SamplingParams) -> list[ctypes.c_void_p]:
    """The stages that choose, in ``common_sampler_init``'s order: truncation (top-n-sigma, top-k ...),
    temperature and the draw; or temperature and mirostat.  (``n-prev`` sizes the history
    ``common_sampler`` keeps for its text of previous tokens, which no stage reads.)"""
    if p.mirostat == 1:
        return [
            llama_cpp.llama_sampler_init_temp(p.temp),
            llama_cpp.llama_sampler_init_mirostat(model.n_vocab, p.seed, p.mirostat_ent, p.mirostat_eta, 100),
        ]
    if p.mirostat == 2:
        return [
            llama_cpp.llama_sampler_init_temp(p.temp),
            llama_cpp.llama_sampler_init_mirostat_v2(p.seed, p.mirostat_ent, p.mirostat_eta),
        ]
    stages = []
    min_keep = p.min_keep
    if p.top_n_sigma > 0:
        stages.append(llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma))
    if p.top_k > 0:
        stages.append(llama_cpp.llama_sampler_init_top_k(p.top_k))
    if p.typ_p < 1.0:
        stages.append(llama_cpp.llama_sampler_init_typical(p.typ_p, min_keep))
    if p.top_p < 1.0:
        stages.append(llama_cpp.llama_sampler_init_top_p(p.top_p, min_keep))
    if p.min_p > 0.0:
        stages.append(llama_cpp.llama_sampler_init_min_p(p.min_p, min_keep))
    if p.xtc_probability > 0.0:
        stages.append(llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, min_keep, p.seed))
    stages.append(llama_cpp.llama_sampler_init_temp_ext(p.temp, p.dynatemp_range, p.dynatemp_exponent))
    stages.append(llama_cpp.llama_sampler_init_dist(p.seed))
    return stages
