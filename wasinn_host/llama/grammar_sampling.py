"""Grammar-constrained sampling in llama.cpp's ``common_sampler_sample`` order (WasmEdge's and llama-server's).

WasmEdge's GGML plugin samples with ``common_sampler_sample(..., grammar_first = false)``: the chain
draws a token from the unconstrained candidates, the grammar checks that one token, and only a
rejected token makes it refill the candidates from the logits, apply the grammar to all of them and
run the chain again (the seeded random number generator has advanced once by then).
:class:`GrammarSampler` does the same, so a seed draws WasmEdge's tokens, and most steps cost what
unconstrained sampling costs.  Its opt-in ``grammar_first`` (config key ``grammar-first``) masks
first on every step, as ``common_sampler_sample(..., grammar_first = true)``.

A grammar over the whole vocabulary is expensive (262,144 tokens for Gemma 3: 30-50 ms here, more
than the decode itself on a small model), so where the chain begins with ``top-k`` (the default,
40, without mirostat) the masked step tests the grammar only on the tokens top-k would keep after the
mask: candidates in order of logit (the larger of 64 and 2k, then 8 times as many each round) until k allowed ones
are found; the rest of the chain runs on them alone.  The stages before top-k (logit bias,
penalties, DRY) change logits token by token, so they commute with the grammar's mask, and top-k
sorts what it keeps: the array and the random draws are then those of the chain run on the whole
masked vocabulary.  When the first round finds fewer than k/4 allowed tokens or two rounds fewer
than k (the punctuation of a JSON answer), a :class:`~.piece_trie.PieceTrie` finds every allowed
token of the vocabulary while testing a few percent of it (about 2 ms instead of 40 for Gemma 3).
Where the chain on k tokens alone could differ (fewer than k allowed tokens, or equal logits at or
inside the k-th place, whose order a sort does not fix) the chain runs on the whole vocabulary with
the refused tokens masked, as llama.cpp's.

:class:`GreedySampler` (``temp <= 0``) picks the most likely token (``numpy.argmax`` over the logits
in place, without copying every logit into a candidates array as ``llama_sampler_sample`` does:
0.5 ms a token on Gemma 3's vocabulary here) and, under a grammar, the most likely allowed token,
found the same way: llama.cpp's order gives that same token, the grammar first or not.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import TYPE_CHECKING, Any, Callable

from .bindings import llama_cpp
from .piece_trie import PieceTrie

if TYPE_CHECKING:
    import numpy as np


FIRST_CHUNK = 64
"""Candidates tested at once when the grammar must pick among the most likely; each further round tests
8 times as many."""


@functools.lru_cache(maxsize=1)
def _token_data() -> np.dtype:
    """``llama_token_data`` as a numpy record (numpy is imported when a grammar sampler is first made)."""
    import numpy as np

    dtype = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    assert dtype.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)
    return dtype


SUBSAMPLE_STEP = 64
"""The stride of the sample of logits :func:`kth_largest` takes its first guess from."""


def kth_largest(values: np.ndarray, k: int) -> float:
    """The ``k``-th largest of ``values`` (1 <= ``k`` <= its length): ``np.partition(values, n - k)[n - k]``,
    the same value, without partitioning the whole array where it is long (1.7 ms for Gemma 3's 262,144
    logits here, about 0.1 ms this way).

    A strided sample gives a guess that about 2k values reach; if at least k do, every value at least
    the k-th largest is among them, and partitioning those alone gives it exactly (otherwise the whole
    array is partitioned, as it is where a value is NaN).
    """
    import numpy as np

    n = len(values)
    step = SUBSAMPLE_STEP
    if n < 64 * step or k > n // (4 * step) or np.isnan(values.max()):  # partition counts NaN as largest
        return float(np.partition(values, n - k)[n - k])
    sample = values[::step]
    j = max(16, 2 * k // step)
    guess = np.partition(sample, len(sample) - j)[len(sample) - j]
    above = values[values >= guess]
    if len(above) < k:
        return float(np.partition(values, n - k)[n - k])
    return float(np.partition(above, len(above) - k)[len(above) - k])


class Candidates:
    """A reusable ``llama_token_data_array`` over the whole vocabulary, filled from a context's logits."""

    def __init__(self, n_vocab: int) -> None:
        import numpy as np

        self.n_vocab = n_vocab
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.data = np.zeros(n_vocab, dtype=_token_data())
        self.array = llama_cpp.llama_token_data_array(
            data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p), size=n_vocab, selected=-1, sorted=False
        )
        self.ref = ctypes.byref(self.array)

    def fill(self, ctx: Any, batch_index: int) -> None:
        """Every token with its raw logit at ``batch_index`` of the context's last decode, in id order,
        nothing selected (``common_sampler``'s ``set_logits``)."""
        import numpy as np

        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(self.n_vocab,))
        self.data["id"] = self.ids
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


_per_thread = threading.local()


def shared_candidates(n_vocab: int) -> Candidates:
    """The calling thread's candidates array for a vocabulary of ``n_vocab`` tokens (12 bytes per token,
    and 4 of its ids: 4 MiB for Gemma 3), made once.  A model's worker thread samples for all its
    execution contexts, one at a time, and a sampler uses the array only within one ``sample`` call, so
    every sampler of the thread shares it instead of holding its own."""
    arrays: dict[int, Candidates] = _per_thread.__dict__.setdefault("arrays", {})
    candidates = arrays.get(n_vocab)
    if candidates is None:
        candidates = arrays[n_vocab] = Candidates(n_vocab)
    return candidates


class OneToken:
    """The grammar's check of a single token (``common_sampler_sample``'s one-token array)."""

    def __init__(self, grammar: ctypes.c_void_p) -> None:
        self.grammar = grammar
        self._one = (llama_cpp.llama_token_data * 1)()
        self._array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        self._ref = ctypes.byref(self._array)

    def allows(self, token: int) -> bool:
        """Whether the grammar, in its current state, accepts ``token`` next."""
        self._one[0] = llama_cpp.llama_token_data(token, 1.0, 0.0)
        self._array.size, self._array.selected, self._array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(self.grammar, self._ref)
        return bool(self._one[0].logit != float("-inf"))


def allowed_indices(grammar: ctypes.c_void_p, indices: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """The array indices among ``indices`` (ascending) whose tokens the grammar allows now (``ids``: the
    token of each array index; None: the index is the token)."""
    import numpy as np

    chunk = np.zeros(len(indices), dtype=_token_data())
    chunk["id"] = indices if ids is None else ids[indices]
    array = llama_cpp.llama_token_data_array(
        data=chunk.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(indices), selected=-1, sorted=False
    )
    llama_cpp.llama_sampler_apply(grammar, ctypes.byref(array))
    return indices[chunk["logit"] != -np.inf]


class GreedySampler:
    """Greedy sampling, under a grammar or not: the most likely token (``numpy.argmax``, the first of
    equal maxima as llama.cpp's greedy) if the grammar allows it, else the most likely allowed one,
    found by testing candidates in order of logit (as many as it takes).

    ``pre`` is the chain of the stages before the choice (logit bias, penalties, DRY), or None; the
    greedy choice itself is made here.  It owns both samplers (``close`` frees them).
    """

    FIRST_CHUNK = FIRST_CHUNK

    def __init__(self, pre: ctypes.c_void_p | None, grammar: ctypes.c_void_p | None, n_vocab: int) -> None:
        self.pre = pre
        self.grammar = grammar
        self.n_vocab = n_vocab
        self.candidates = shared_candidates(n_vocab) if pre is not None else None
        self._check = OneToken(grammar) if grammar is not None else None
        self.rejections = 0
        """Tokens the unconstrained choice picked and the grammar refused."""
        self.tested = 0
        """Candidates tested with the grammar after rejections (at most the vocabulary each time)."""

    def allows(self, token: int) -> bool:
        """Whether the grammar, in its current state, accepts ``token`` next (any token without one)."""
        return self._check is None or self._check.allows(token)

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
        """The most likely token the grammar allows; the samplers accept it."""
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

        assert self.grammar is not None
        n = len(logits)
        tested_above = np.inf  # candidates with logits >= this were tested in earlier rounds
        k = FIRST_CHUNK
        while True:
            threshold = -np.inf if k >= n else kth_largest(logits, k)
            chosen = np.flatnonzero((logits >= threshold) & (logits < tested_above))
            if len(chosen):
                self.tested += len(chosen)
                allowed = allowed_indices(self.grammar, chosen, ids)
                if len(allowed):
                    values = logits[allowed]
                    if values.max() == -np.inf:
                        return 0  # every allowed token is banned too: greedy sees only -inf
                    return int(allowed[np.flatnonzero(values == values.max())[0]])  # allowed is ascending
            if k >= n:
                return 0
            tested_above = threshold
            k *= 8

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


class GrammarSampler:
    """Sampling at ``temp`` > 0 under a grammar, in ``common_sampler_sample``'s order.

    ``pre`` is the chain of the stages before the truncation samplers (logit bias, penalties, DRY), or
    None; ``tail`` the chain from there to the draw (top-k ... temperature, dist; or temperature and
    mirostat).  ``top_k`` > 0 says ``tail`` begins with top-k of that k (the masked step may then test
    the grammar on top-k's tokens alone).  It owns the three samplers.
    """

    def __init__(
        self,
        pre: ctypes.c_void_p | None,
        grammar: ctypes.c_void_p,
        tail: ctypes.c_void_p,
        top_k: int,
        n_vocab: int,
        grammar_first: bool = False,
        trie: Callable[[], PieceTrie] | None = None,
        piece: Callable[[int], bytes] | None = None,
    ) -> None:
        self.pre = pre
        self.grammar = grammar
        self.tail = tail
        self.top_k = top_k
        self.grammar_first = grammar_first
        self.candidates = shared_candidates(n_vocab)
        self._check = OneToken(grammar)
        self.draws = 0
        """Steps that drew from the unconstrained candidates (every step unless ``grammar_first``)."""
        self.rejections = 0
        """Unconstrained draws the grammar refused (each followed by a masked step)."""
        self.fast_steps = 0
        """Masked steps that ran the chain on the top-k allowed tokens alone."""
        self.full_steps = 0
        """Masked steps that ran the chain on the whole masked vocabulary (fewer than k allowed tokens,
        found by testing every token once, equal logits at the k-th place, or no top-k)."""
        self.trie_steps = 0
        """Masked steps whose allowed tokens the piece trie found."""
        self._trie_source = trie if piece is not None else None
        self._trie: PieceTrie | None = None
        self._piece = piece
        self._pending = 0
        """UTF-8 continuation bytes the accepted text still expects (the trie needs 0)."""

    def sample(self, ctx: Any, batch_index: int) -> int:
        """The token ``common_sampler_sample`` draws from these logits; every sampler accepts it."""
        candidates = self.candidates
        token = -1
        if not self.grammar_first:
            self.draws += 1
            if self.pre is None:
                # the unconstrained sampler's own path (candidates filled in C); it accepts the token
                # into the tail, whose stages keep no history (only penalties and DRY do, in ``pre``)
                token = int(llama_cpp.llama_sampler_sample(self.tail, ctx, batch_index))
            else:
                candidates.fill(ctx, batch_index)
                llama_cpp.llama_sampler_apply(self.pre, candidates.ref)
                llama_cpp.llama_sampler_apply(self.tail, candidates.ref)
                token = candidates.selected()
            if not self._check.allows(token):
                self.rejections += 1
                token = -1
        if token < 0:  # start again from the logits, mask them and draw again, as common_sampler does
            candidates.fill(ctx, batch_index)
            if self.pre is not None:
                llama_cpp.llama_sampler_apply(self.pre, candidates.ref)
            token = self._masked()
        for sampler in (self.grammar, self.pre, self.tail):
            if sampler is not None:
                llama_cpp.llama_sampler_accept(sampler, token)
        if self._piece is not None:
            self._pending = PieceTrie.pending_after(self._pending, self._piece(token))
        return token

    def _masked(self) -> int:
        """The token the chain draws once the grammar has masked the candidates (after ``pre``)."""
        import numpy as np

        candidates = self.candidates
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
            return int(chosen["id"][array.selected])
        self.full_steps += 1
        if kept is not None:  # every token was tested: mask the refused ones, as the grammar would
            refused = np.ones(size, dtype=bool)
            refused[kept] = False
            logits[refused] = -np.inf
        else:
            llama_cpp.llama_sampler_apply(self.grammar, candidates.ref)
        llama_cpp.llama_sampler_apply(self.tail, candidates.ref)
        return candidates.selected()

    def _top_allowed(self, logits: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray | None, bool]:
        """The array indices of the k highest allowed logits, if they are certain to be what top-k keeps
        after the grammar (at least k allowed, all finite, no equal logits among them or at the k-th);
        with fewer than k allowed, every allowed index (all were tested: the second value is True);
        None where the chain must see the grammar's own mask (no top-k, or ties).

        Rounds test candidates in order of logit; if the first finds fewer than k / 4 allowed tokens, or
        two fewer than k, the :class:`~.piece_trie.PieceTrie` finds every allowed token (or, where it
        cannot be used, further rounds test 8 times as many each, up to the whole vocabulary)."""
        import numpy as np

        n, k = len(logits), self.top_k
        if k <= 0:
            return None, False
        tested_above = np.inf
        allowed: list[np.ndarray] = []
        count = 0
        width = max(FIRST_CHUNK, 2 * k)
        rounds = 0
        while count < k:
            # a first round with few allowed tokens (the punctuation of a JSON answer) rarely leads to k in
            # the second: the trie then (it finds every allowed token; the top k of those are the rounds')
            if (rounds == 2 or (rounds == 1 and count < k // 4)) and self._trie_applies(ids):
                self.trie_steps += 1
                every = self._get_trie().allowed(lambda tokens: allowed_indices(self.grammar, tokens, None))
                if len(every) < k:
                    return every, True
                allowed = [every]
                break
            threshold = -np.inf if width >= n else kth_largest(logits, width)
            chosen = np.flatnonzero((logits >= threshold) & (logits < tested_above))
            if len(chosen):
                found = allowed_indices(self.grammar, chosen, ids)
                allowed.append(found)
                count += len(found)
            if width >= n:
                return (np.concatenate(allowed) if allowed else np.zeros(0, dtype=np.int64)), True
            tested_above = threshold
            width *= 8
            rounds += 1
        indices = np.concatenate(allowed)
        order = indices[np.argsort(-logits[indices], kind="stable")]
        values = logits[order]
        kth = values[k - 1]
        if not np.isfinite(kth) or (len(values) > k and values[k] == kth):
            return None, False  # top-k would keep -inf tokens, or its choice among equals is not fixed
        if len(np.unique(values[:k])) < k:
            return None, False  # equal logits among the kept: their order after top-k's sort is not fixed
        return order[:k], False

    def _trie_applies(self, ids: np.ndarray) -> bool:
        """Whether the piece trie may find the allowed tokens now: the grammar has no token elements, the
        accepted text ends on a character boundary, and the candidates are the vocabulary in id order."""
        import numpy as np

        if self._trie_source is None or self._pending != 0 or len(ids) != self.candidates.n_vocab:
            return False
        return bool(np.array_equal(ids, self.candidates.ids))

    def _get_trie(self) -> PieceTrie:
        if self._trie is None:
            assert self._trie_source is not None
            self._trie = self._trie_source()
        return self._trie

    def reset(self) -> None:
        """Forget the history of every stage (the grammar starts again at its root)."""
        self._pending = 0
        for sampler in (self.grammar, self.pre, self.tail):
            if sampler is not None:
                llama_cpp.llama_sampler_reset(sampler)

    def close(self) -> None:
        """Free the three samplers."""
        for sampler in (self.grammar, self.pre, self.tail):
            if sampler:
                llama_cpp.llama_sampler_free(sampler)
        self.grammar = self.pre = self.tail = None  # type: ignore[assignment]
