"""llama.cpp alone, ``wasinn bench``'s reference: N sequences decoded together, as a user of the library would.

llama-cpp-python's low-level API decodes N prompts of random letters as N sequences of one context
(``n_seq_max`` N, one KV stream each, ``n_ctx`` = N x the cells a sequence needs), one ``llama_decode``
a step with one token per sequence and logits for each; prompts are decoded together, chunked to the
batch size.  Two ways, timed from the first prompt decode to the last token:

- ``decode``: llama.cpp's decoding alone, no sampling (each sequence is fed its last prompt token
  again: a step costs the same whatever the tokens are); the floor a host wrapping it can approach;
- ``sampled``: one greedy sampler per sequence (``llama_sampler_sample`` on each row), what a
  program built on llama.cpp's own sampling gets.

:func:`reference_run` is called in a process of its own (:mod:`.reference_process` says why).
"""

from __future__ import annotations

import ctypes
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp

from ..llama import cpu_probe
from ..llama.log import init_backend

N_BATCH = 512
ALPHABET = string.ascii_letters


@dataclass(frozen=True)
class ReferenceRun:
    """One run of llama.cpp alone on N sequences."""

    decode_tokens_per_s: float
    """Generated tokens a second, decoding only."""
    sampled_tokens_per_s: float
    """Generated tokens a second with a greedy sampler per sequence."""
    ttft_ms: float
    """From the first prompt decode to the first sampled token of every sequence (sampled run)."""


_MODELS: dict[tuple[str, int], ctypes.c_void_p] = {}


def _model(path: str, n_gpu_layers: int) -> ctypes.c_void_p:
    """The model at ``path``, loaded at its first use in this process."""
    key = (path, n_gpu_layers)
    if key not in _MODELS:
        init_backend()
        cpu_probe.prepare_for_file(path)  # the host's CPU layouts: AMX off where it crashes, as in the host
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        _MODELS[key] = model
    return _MODELS[key]


def _prompts(model: ctypes.c_void_p, n: int, letters: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``letters`` random letters, tokenized with BOS."""
    rng = random.Random(seed)
    vocab = llama_cpp.llama_model_get_vocab(model)
    out = []
    for _ in range(n):
        data = "".join(rng.choice(ALPHABET) for _ in range(letters)).encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
        if count <= 0:
            raise RuntimeError(f"llama_tokenize returned {count}")
        out.append(list(buf[:count]))
    return out


def decode_together(
    model: ctypes.c_void_p,
    prompts: list[list[int]],
    tokens: int,
    threads: int,
    ctx_size: int,
    sample: bool,
    kv_unified: bool = False,
    on_token: Callable[[int, int], None] | None = None,
) -> tuple[float, float]:
    """Aggregate generated tokens/s and ms to every sequence's first token, one context of ``len(prompts)``
    sequences of ``ctx_size`` cells (``kv_unified``: one pool of cells for all, as ``llama-server
    --kv-unified``); with ``sample``, ``on_token(sequence, token)`` is told each token sampled."""
    n = len(prompts)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = ctx_size * n
    cparams.n_batch = cparams.n_ubatch = N_BATCH
    cparams.n_seq_max = n
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.kv_unified = kv_unified
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError("llama.cpp could not create the reference's context")
    batch = llama_cpp.llama_batch_init(max(N_BATCH, n), 0, 1)
    samplers = []
    if sample:
        for _ in range(n):
            chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
            samplers.append(chain)
    next_token = [p[-1] for p in prompts]

    def add(i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
        batch.seq_id[i][0] = seq

    def decode(count: int) -> None:
        batch.n_tokens = count
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"the reference's llama_decode returned {rc}")

    try:
        started = time.perf_counter()
        items = [(seq, pos, tok) for seq, prompt in enumerate(prompts) for pos, tok in enumerate(prompt)]
        for chunk_start in range(0, len(items), N_BATCH):
            chunk = items[chunk_start : chunk_start + N_BATCH]
            finishing = []
            for i, (seq, pos, tok) in enumerate(chunk):
                last = pos == len(prompts[seq]) - 1
                add(i, tok, pos, seq, last)
                if last:
                    finishing.append((seq, i))
            decode(len(chunk))
            for seq, index in finishing:
                if sample:
                    next_token[seq] = llama_cpp.llama_sampler_sample(samplers[seq], ctx, index)
                    if on_token is not None:
                        on_token(seq, next_token[seq])
        first = time.perf_counter()
        positions = [len(p) for p in prompts]
        for _ in range(tokens - 1):  # the prompt's step gave each sequence its first token
            for seq in range(n):
                add(seq, next_token[seq], positions[seq], seq, True)
                positions[seq] += 1
            decode(n)
            if sample:
                for seq in range(n):
                    next_token[seq] = llama_cpp.llama_sampler_sample(samplers[seq], ctx, seq)
                    if on_token is not None:
                        on_token(seq, next_token[seq])
        elapsed = time.perf_counter() - started
    finally:
        for chain in samplers:
            llama_cpp.llama_sampler_free(chain)
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return n * tokens / elapsed, (first - started) * 1000.0


def reference_run(
    path: str, n: int, letters: int, tokens: int, threads: int, ctx_size: int, n_gpu_layers: int, seed: int
) -> ReferenceRun:
    """Both ways on ``n`` fresh prompts of ``letters`` random letters, ``tokens`` generated per sequence."""
    model = _model(path, n_gpu_layers)
    prompts = _prompts(model, n, letters, seed)
    decode_rate, _ = decode_together(model, prompts, tokens, threads, ctx_size, sample=False)
    sampled_rate, ttft = decode_together(model, prompts, tokens, threads, ctx_size, sample=True)
    return ReferenceRun(decode_rate, sampled_rate, ttft)
