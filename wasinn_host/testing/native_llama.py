"""llama.cpp driven directly through llama-cpp-python's low-level API: the reference real-model tests compare to.

:class:`NativeModel` loads a GGUF file with llama-cpp-python alone (no host, no engine) and decodes one
sequence per context: the prompt in one ``llama_decode`` (or two, split where the test says), then
one token per decode, as the host decodes a context that computes alone.  :meth:`NativeModel.generate`
samples through a chain of llama.cpp sampler stages; :meth:`NativeModel.follow` decodes a text under
test token by token and returns the reference's view of each of its tokens, for :mod:`.numerics`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..llama import cpu_probe
from ..llama.bindings import llama_cpp
from ..llama.log import init_backend
from .numerics import Step, step_of

CTX = 256
"""Cells of a native context unless a call asks for another size."""


class NativeModel:
    """A model loaded by llama-cpp-python alone, decoded one sequence at a time on ``threads`` threads."""

    def __init__(self, path: str | Path, threads: int = 2) -> None:
        init_backend()
        cpu_probe.prepare_for_file(path)  # as the host: no extra CPU layout that kills the process
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.threads = threads
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        """Free the model."""
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None

    # -- text ---------------------------------------------------------------------------------

    def tokenize(self, text: bytes) -> list[int]:
        """Tokens of ``text`` with the model's BOS, special tokens parsed."""
        buf = (llama_cpp.llama_token * (len(text) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, text, len(text), buf, len(buf), True, True)
        if n <= 0:
            raise ValueError(f"llama.cpp could not tokenize {text[:40]!r}")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def text(self, tokens: list[int]) -> bytes:
        """The bytes of ``tokens``."""
        return b"".join(self.piece(t) for t in tokens)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation."""
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def chat_prompt(self, messages: list[dict[str, str]]) -> bytes:
        """llama.cpp's own rendering of ``messages`` with the model's GGUF template."""
        template = llama_cpp.llama_model_chat_template(self.model, None)
        if not template:
            raise ValueError("the model has no chat template")
        chat = (llama_cpp.llama_chat_message * len(messages))()
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        for i, (role, content) in enumerate(keep):
            chat[i].role, chat[i].content = role, content
        buf = ctypes.create_string_buffer(8192)
        n = llama_cpp.llama_chat_apply_template(template, chat, len(messages), True, buf, len(buf))
        if not 0 < n <= len(buf):
            raise ValueError("llama.cpp could not apply the chat template")
        return buf.raw[:n]

    def grammar(self, gbnf: str) -> Any:
        """A grammar sampler stage for ``gbnf`` (rule ``root``)."""
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not sampler:
            raise ValueError("llama.cpp refused the grammar")
        return sampler

    # -- decoding -----------------------------------------------------------------------------

    def context(
        self,
        n_ctx: int = CTX,
        embeddings: bool = False,
        n_seq: int = 1,
        threads: int = 0,
        cparams: dict[str, Any] | None = None,
    ) -> Any:
        """A context of ``n_seq`` sequences of ``n_ctx`` cells each, as the host makes them (``n_batch``
        2048, ``n_ubatch`` 512, one KV stream per sequence), on ``threads`` threads (0: the model's);
        ``cparams``: further ``llama_context_params`` fields (``rope_freq_scale`` ...)."""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx * n_seq, 2048, 512, n_seq
        params.n_threads = params.n_threads_batch = threads or self.threads
        params.kv_unified = False
        params.embeddings = embeddings
        for field, value in (cparams or {}).items():
            setattr(params, field, value)
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} cells")
        return ctx

    @classmethod
    def decode(cls, ctx: Any, batch: Any, tokens: list[int], start: int) -> None:
        """Decode ``tokens`` at positions ``start``... of sequence 0, logits for the last one."""
        cls.decode_items(ctx, batch, [(t, start + i, 0, i == len(tokens) - 1) for i, t in enumerate(tokens)])

    @staticmethod
    def decode_items(ctx: Any, batch: Any, items: list[tuple[int, int, int, bool]]) -> None:
        """Decode one batch of ``(token, position, sequence, logits?)`` items."""
        batch.n_tokens = len(items)
        for i, (token, pos, seq, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = want
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def logits(self, ctx: Any, index: int = -1) -> np.ndarray:
        """The logits of the last decode's ``index``-th item (a copy; -1: the last with logits)."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(self.n_vocab,)).copy()

    def _run(
        self,
        prompt: list[int],
        n_predict: int,
        pick: Callable[[Any], int],
        n_ctx: int,
        split: int,
        n_keep: int,
        cparams: dict[str, Any] | None = None,
    ) -> list[int]:
        """Decode ``prompt`` (in two batches at ``split`` if it is not 0), then ``pick`` a token and decode
        it until ``n_predict`` tokens or an end-of-generation token (included)."""
        ctx = self.context(n_ctx, cparams=cparams)
        memory = llama_cpp.llama_get_memory(ctx)
        batch = llama_cpp.llama_batch_init(2048, 0, 1)
        out: list[int] = []
        try:
            for start, end in ((0, split), (split, len(prompt))) if split else ((0, len(prompt)),):
                self.decode(ctx, batch, prompt[start:end], start)
            n_cells = len(prompt)
            while len(out) < n_predict:
                token = pick(ctx)
                out.append(token)
                if self.is_eog(token) or len(out) == n_predict:
                    break
                if n_cells + 1 > n_ctx:
                    if n_keep < 0:
                        raise RuntimeError("context full")
                    discard = (n_cells - n_keep) // 2
                    llama_cpp.llama_memory_seq_rm(memory, 0, n_keep, n_keep + discard)
                    llama_cpp.llama_memory_seq_add(memory, 0, n_keep + discard, -1, -discard)
                    n_cells -= discard
                self.decode(ctx, batch, [token], n_cells)
                n_cells += 1
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
        return out

    def generate(
        self,
        prompt: list[int],
        n_predict: int,
        stages: list[Any] | None = None,
        n_ctx: int = CTX,
        split: int = 0,
        n_keep: int = -1,
        cparams: dict[str, Any] | None = None,
    ) -> list[int]:
        """Tokens after ``prompt`` (the end-of-generation token included) through a chain of ``stages``
        (default: greedy alone; the chain takes and frees them).  ``split``: decode the prompt in two
        batches, before and after that index.  ``n_keep`` >= 0: shift the context as the host does when
        it is full (keep ``n_keep`` tokens, drop half of the rest, move the others back).  ``cparams``: further
        context parameters (see :meth:`context`)."""
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        for stage in stages or [llama_cpp.llama_sampler_init_greedy()]:
            llama_cpp.llama_sampler_chain_add(chain, stage)
        try:
            return self._run(
                prompt,
                n_predict,
                lambda ctx: int(llama_cpp.llama_sampler_sample(chain, ctx, -1)),
                n_ctx,
                split,
                n_keep,
                cparams,
            )
        finally:
            llama_cpp.llama_sampler_free(chain)

    def follow(self, prompt: list[int], tokens: list[int], n_ctx: int = CTX, split: int = 0) -> list[Step]:
        """Decode ``prompt`` (in two batches at ``split`` if it is not 0), then ``tokens`` one at a time (a
        text under test, made elsewhere), and compare each token with these logits for the same tokens
        before it (:func:`~.numerics.step_of`)."""
        ctx = self.context(n_ctx)
        batch = llama_cpp.llama_batch_init(2048, 0, 1)
        steps: list[Step] = []
        try:
            for start, end in ((0, split), (split, len(prompt))) if split else ((0, len(prompt)),):
                self.decode(ctx, batch, prompt[start:end], start)
            for i, token in enumerate(tokens):
                steps.append(step_of(self.logits(ctx), token))
                if i < len(tokens) - 1:
                    self.decode(ctx, batch, [token], len(prompt) + i)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
        return steps

    def top_probabilities(self, prompt: list[int], n_steps: int, k: int) -> list[tuple[int, list[tuple[int, float]]]]:
        """For each greedy step: the chosen token and the ``k`` most likely tokens with their softmax."""
        steps: list[tuple[int, list[tuple[int, float]]]] = []

        def pick(ctx: Any) -> int:
            logits = self.logits(ctx).astype(np.float64)
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            order = np.argsort(-logits, kind="stable")[:k]
            token = int(np.argmax(logits))
            steps.append((token, [(int(t), float(probs[t])) for t in order]))
            return token

        # no end-of-generation stop: the steps are counted, as n-probs counts them
        ctx = self.context(CTX)
        batch = llama_cpp.llama_batch_init(2048, 0, 1)
        try:
            self.decode(ctx, batch, prompt, 0)
            for step in range(n_steps):
                token = pick(ctx)
                if step < n_steps - 1:
                    self.decode(ctx, batch, [token], len(prompt) + step)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
        return steps

    def embedding(self, text: bytes) -> np.ndarray:
        """The model's embedding of ``text`` (pooled as llama.cpp pools by default), L2-normalised."""
        ctx = self.context(CTX, embeddings=True)
        batch = llama_cpp.llama_batch_init(2048, 0, 1)
        try:
            self.decode(ctx, batch, self.tokenize(text), 0)
            n_embd = llama_cpp.llama_model_n_embd(self.model)
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, 0) or llama_cpp.llama_get_embeddings_ith(ctx, -1)
            vector = np.array(ptr[:n_embd], dtype=np.float64)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
        return vector / np.linalg.norm(vector)
