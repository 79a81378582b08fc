"""Greedy grammar-constrained sampling that tests the grammar on a few tokens, not the whole vocabulary.

A grammar sampler placed first in a chain tests every token of the vocabulary against the
grammar at every step (262,144 tokens for Gemma 3: 30-50 ms here, more than the decode itself on
a small model).  llama.cpp's ``common_sampler`` samples first without the grammar and applies it
to the whole vocabulary only when the sampled token is rejected.  :class:`GreedySampler` does
the same for greedy chains and, on a rejection, tests candidates in order of logit (64, then 8
times as many each round) instead of all of them.  The result is provably the token the
grammar-first chain picks: the stages before ``greedy`` (logit bias, penalties, DRY) change logits
token by token, so they commute with the grammar's mask; the grammar judges each token on its own;
and the most likely allowed token lies among the tested ones (ties go to the first in array order,
as llama.cpp's greedy).

Stochastic chains with ``top-k`` (the default, 40) and no mirostat get :class:`TopKGrammarSampler`:
after the grammar, ``top-k`` keeps the k most likely allowed tokens, so those are found the same
way (candidates tested in order of logit) and the rest of the chain (top-k, typical, top-p, min-p,
XTC, temperature, the seeded draw) runs on them alone.  Its array and its random draws are then
the grammar-first chain's, so a seed draws the same tokens.  Where that could differ (fewer than k
allowed tokens, or equal logits at or inside the k-th place, whose order a sort does not fix) that
step masks the whole vocabulary, as the grammar-first chain does.  A sample-first order (llama.cpp's
``common_sampler``) would be faster still but draws other tokens from the same seed.

Without a grammar, :class:`GreedySampler` is still the cheaper greedy: ``numpy.argmax`` over the
logits in place, where ``llama_sampler_sample`` first copies every logit into a candidates array
(0.5 ms a token on Gemma 3's vocabulary here, 3 % of its decode).
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Any

from .llama_bindings import llama_cpp

if TYPE_CHECKING:
    import numpy as np


@functools.lru_cache(maxsize=1)
def _token_data() -> np.dtype:
    """``llama_token_data`` as a numpy record (numpy is imported when a greedy sampler is first made)."""
    import numpy as np

    dtype = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    assert dtype.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)
    return dtype


class Candidates:
    """A reusable ``llama_token_data_array`` over the whole vocabulary, filled from a context's logits."""

    def __init__(self, n_vocab: int) -> None:
        import numpy as np

        self.n_vocab = n_vocab
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.data = np.zeros(n_vocab, dtype=_token_data())
        self.array = llama_cpp.llama_token_data_array(
            data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p), size=n_vocab, selected=-1, sorted=False
        )
        self.ref = ctypes.byref(self.array)

    def fill(self, ctx: Any, batch_index: int) -> None:
        """Every token with its raw logit at ``batch_index`` of the context's last decode, nothing selected."""
        import numpy as np

        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(self.n_vocab,))
        self.data["id"] = self._ids
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.array.size = self.n_vocab
        self.array.selected = -1
        self.array.sorted = False

    def selected(self) -> int:
        """The token the last sampler applied selected."""
        index = self.array.selected
        if not 0 <= index < self.array.size:
            raise RuntimeError("the sampler chain selected no token")
        return int(self.data["id"][index])


class GreedySampler:
    """Greedy sampling, under a grammar or not: the most likely token (``numpy.argmax``, the first of
    equal maxima as llama.cpp's greedy) if the grammar allows it, else the most likely allowed one,
    found by testing candidates in order of logit (as many as it takes).

    ``pre`` is the chain of the stages before ``greedy`` (logit bias, penalties, DRY), or None; the
    greedy choice itself is made here.  It owns both samplers (``close`` frees them).
    """

    FIRST_CHUNK = 64
    """Candidates tested at once after a rejection; each further round tests 8 times as many."""

    def __init__(self, pre: ctypes.c_void_p | None, grammar: ctypes.c_void_p | None, n_vocab: int) -> None:
        self.pre = pre
        self.grammar = grammar
        self.n_vocab = n_vocab
        self.candidates = Candidates(n_vocab) if pre is not None else None
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        self._one_ref = ctypes.byref(self._one_array)
        self.rejections = 0
        """Tokens the unconstrained choice picked and the grammar refused."""
        self.tested = 0
        """Candidates tested with the grammar after rejections (at most the vocabulary each time)."""

    def allows(self, token: int) -> bool:
        """Whether the grammar, in its current state, accepts ``token`` next (any token without one)."""
        if self.grammar is None:
            return True
        self._one[0] = llama_cpp.llama_token_data(token, 1.0, 0.0)
        self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(self.grammar, self._one_ref)
        return bool(self._one[0].logit != float("-inf"))

    def _logits(self, ctx: Any, batch_index: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The logits greedy chooses from (after the ``pre`` stages), and the token ids by array index
        (None: the identity)."""
        import numpy as np

        raw = llama_cpp.llama_get_logits_ith(ctx, batch_index)
        if self.pre is None:
            return np.ctypeslib.as_array(raw, shape=(self.n_vocab,)), None
        candidates = self.candidates
        assert candidates is not None
        candidates.fill(ctx, batch_index)
        llama_cpp.llama_sampler_apply(self.pre, candidates.ref)
        size = candidates.array.size
        return candidates.data["logit"][:size], candidates.data["id"][:size]

    def sample(self, ctx: Any, batch_index: int) -> int:
        """The token the grammar-first greedy chain would pick; the samplers accept it."""
        import numpy as np

        logits, ids = self._logits(ctx, batch_index)
        best = int(np.argmax(logits))  # the first of equal maxima, as llama.cpp's greedy
        token = best if ids is None else int(ids[best])
        if not self.allows(token):
            self.rejections += 1
            best = self._best_allowed(logits, ids)
            token = best if ids is None else int(ids[best])
        if self.grammar is not None:
            llama_cpp.llama_sampler_accept(self.grammar, token)
        if self.pre is not None:
            llama_cpp.llama_sampler_accept(self.pre, token)
        return token

    def _best_allowed(self, logits: np.ndarray, ids: np.ndarray | None) -> int:
        """The array index greedy picks once the grammar has masked ``logits``: the highest allowed logit,
        the first in array order among equals; index 0 if nothing is allowed (llama.cpp's greedy then).

        Rounds test every candidate whose logit is at least the k-th highest (ties included), so an
        untested token always has a lower logit than every tested one.
        """
        import numpy as np

        n = len(logits)
        tested_above = np.inf  # candidates with logits >= this were tested in earlier rounds
        k = self.FIRST_CHUNK
        while True:
            threshold = -np.inf if k >= n else float(np.partition(logits, n - k)[n - k])
            chosen = np.flatnonzero((logits >= threshold) & (logits < tested_above))
            if len(chosen):
                allowed = self._allowed(chosen, ids)
                if len(allowed):
                    values = logits[allowed]
                    if values.max() == -np.inf:
                        return 0  # every allowed token is banned too: greedy sees only -inf
                    return int(allowed[np.flatnonzero(values == values.max())[0]])  # allowed is ascending
            if k >= n:
                return 0
            tested_above = threshold
            k *= 8

    def _allowed(self, indices: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
        """The array indices among ``indices`` (ascending) whose tokens the grammar allows."""
        import numpy as np

        count = len(indices)
        self.tested += count
        chunk = np.zeros(count, dtype=_token_data())
        chunk["id"] = indices if ids is None else ids[indices]
        chunk["logit"] = 0.0
        array = llama_cpp.llama_token_data_array(
            data=chunk.ctypes.data_as(llama_cpp.llama_token_data_p), size=count, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return indices[chunk["logit"] != -np.inf]

    def reset(self) -> None:
        """Forget the history of both (the grammar starts again at its root)."""
        if self.grammar is not None:
            llama_cpp.llama_sampler_reset(self.grammar)
        if self.pre is not None:
            llama_cpp.llama_sampler_reset(self.pre)

    def close(self) -> None:
        """Free both samplers."""
        for sampler in (self.grammar, self.pre):
            if sampler:
                llama_cpp.llama_sampler_free(sampler)
        self.grammar = self.pre = None


class TopKGrammarSampler:
    """Grammar-first sampling with ``top-k`` > 0, testing the grammar on the tokens top-k keeps.

    ``pre`` is the chain of the stages before top-k that change logits token by token (logit bias,
    penalties, DRY), or None; ``tail`` the chain from top-k to the draw.  It owns all three.
    """

    def __init__(
        self, pre: ctypes.c_void_p | None, grammar: ctypes.c_void_p, tail: ctypes.c_void_p, top_k: int, n_vocab: int
    ) -> None:
        self.pre = pre
        self.grammar = grammar
        self.tail = tail
        self.top_k = top_k
        self.candidates = Candidates(n_vocab)
        self.fast_steps = 0
        """Steps that ran the chain on the top-k allowed tokens alone."""
        self.full_steps = 0
        """Steps that ran the chain on the whole masked vocabulary (fewer than k allowed tokens, found by
        testing every token once, or equal logits at the k-th place)."""

    def sample(self, ctx: Any, batch_index: int) -> int:
        """The token the grammar-first chain would draw; every sampler accepts it."""
        import numpy as np

        candidates = self.candidates
        candidates.fill(ctx, batch_index)
        if self.pre is not None:
            llama_cpp.llama_sampler_apply(self.pre, candidates.ref)
        size = candidates.array.size
        logits = candidates.data["logit"][:size]
        kept, every_token_tested = self._top_allowed(logits, candidates.data["id"][:size])
        if kept is not None and not every_token_tested:
            self.fast_steps += 1
            chosen = np.array(candidates.data[kept])  # a copy: the tail sorts and cuts its own array
            array = llama_cpp.llama_token_data_array(
                data=chosen.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(chosen), selected=-1, sorted=False
            )
            llama_cpp.llama_sampler_apply(self.tail, ctypes.byref(array))
            if not 0 <= array.selected < array.size:
                raise RuntimeError("the sampler chain selected no token")
            token = int(chosen["id"][array.selected])
        else:
            self.full_steps += 1
            if kept is not None:  # every token was tested: mask the refused ones, as the grammar would
                refused = np.ones(size, dtype=bool)
                refused[kept] = False
                logits[refused] = -np.inf
            else:
                llama_cpp.llama_sampler_apply(self.grammar, candidates.ref)
            llama_cpp.llama_sampler_apply(self.tail, candidates.ref)
            token = candidates.selected()
        for sampler in (self.grammar, self.pre, self.tail):
            if sampler is not None:
                llama_cpp.llama_sampler_accept(sampler, token)
        return token

    def _top_allowed(self, logits: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray | None, bool]:
        """The array indices of the k highest allowed logits, if they are certain to be what top-k keeps
        after the grammar (at least k allowed, all finite, no equal logits among them or at the k-th);
        with fewer than k allowed, every allowed index (all were tested: the second value is True);
        None where the chain must see the grammar's own mask."""
        import numpy as np

        n, k = len(logits), self.top_k
        tested_above = np.inf
        allowed: list[np.ndarray] = []
        count = 0
        width = max(GreedySampler.FIRST_CHUNK, 2 * k)
        while count < k:
            threshold = -np.inf if width >= n else float(np.partition(logits, n - width)[n - width])
            chosen = np.flatnonzero((logits >= threshold) & (logits < tested_above))
            if len(chosen):
                found = self._allowed(chosen, ids)
                allowed.append(found)
                count += len(found)
            if width >= n:
                return (np.concatenate(allowed) if allowed else np.zeros(0, dtype=np.int64)), True
            tested_above = threshold
            width *= 8
        indices = np.concatenate(allowed)
        order = indices[np.argsort(-logits[indices], kind="stable")]
        values = logits[order]
        kth = values[k - 1]
        if not np.isfinite(kth) or (len(values) > k and values[k] == kth):
            return None, False  # top-k would keep -inf tokens, or its choice among equals is not fixed
        if len(np.unique(values[:k])) < k:
            return None, False  # equal logits among the kept: their order after top-k's sort is not fixed
        return order[:k], False

    def _allowed(self, indices: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The array indices among ``indices`` whose tokens the grammar allows now."""
        import numpy as np

        chunk = np.zeros(len(indices), dtype=_token_data())
        chunk["id"] = ids[indices]
        array = llama_cpp.llama_token_data_array(
            data=chunk.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(indices), selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return indices[chunk["logit"] != -np.inf]

    def reset(self) -> None:
        """Forget the history of every stage (the grammar starts again at its root)."""
        for sampler in (self.grammar, self.pre, self.tail):
            if sampler is not None:
                llama_cpp.llama_sampler_reset(sampler)

    def close(self) -> None:
        """Free the three samplers."""
        for sampler in (self.grammar, self.pre, self.tail):
            if sampler:
                llama_cpp.llama_sampler_free(sampler)
        self.grammar = self.pre = self.tail = None  # type: ignore[assignment]
