"""How many draft tokens are worth verifying: the decode cost measured, each context's acceptance rate.

A ``llama_decode`` batch costs ``fixed`` seconds per pass over the weights plus ``per_token`` per token.
The engine gives each sequence its own KV stream, and llama.cpp then splits a batch into passes that
each take the same number of tokens from a run of consecutive sequence ids (``split_equal``): eight
sequences of one token each are one pass, but one of them with a draft of eight more makes a second
pass, and drafts of different lengths, or of sequences 0 and 3, one pass each (:func:`passes`).

A step without drafts makes ``G`` tokens (one per generating context) in ``plain`` seconds.  The
``j``-th draft token of a context is accepted with probability ``a ** j`` (``a``: the context's
acceptance rate), so a draft plan is worth its expected accepted tokens less what its extra decode
time would make at the plain step's rate ``G / plain`` (:func:`choose_drafts`).  On this project's
2-core machine a token costs about as much as a pass, so a lone context drafts while ``a ** j >= ~0.6``
and eight contexts draft only what keeps their batch in one pass; on a GPU the per-token cost is small
and drafts are long.  :class:`DecodeCost` fits ``fixed`` and ``per_token`` to the worker's own decodes
of up to 64 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PRIOR_ACCEPTANCE = 0.95
"""A new computation's acceptance rate before any draft of it was verified (the length of the match
bounds the chance too, see :func:`~.ngram_drafts.match_acceptance`)."""
_RATE_STEP = 0.15
"""Weight of one verified draft token in a context's acceptance rate."""
_RECOVERY = 0.02
"""Each step without a draft moves the rate this far back towards the prior (so a context that stopped
drafting tries again later)."""
_DECAY = 0.97
_FIT_MAX_TOKENS = 64


def passes(counts: Sequence[tuple[int, int]]) -> int:
    """Passes llama.cpp makes over a batch of ``(sequence id, tokens)`` in sequence-id order when each
    sequence has its own KV stream: each pass takes, from the lowest sequence with tokens left and the
    run of consecutive ids after it, as many tokens from each as the one with fewest left has."""
    left = [[seq, n] for seq, n in counts if n > 0]
    n_passes = 0
    while left:
        run = 1
        while run < len(left) and left[run][0] == left[run - 1][0] + 1:
            run += 1
        take = min(n for _, n in left[:run])
        for entry in left[:run]:
            entry[1] -= take
        left = [entry for entry in left if entry[1] > 0]
        n_passes += 1
    return n_passes


class DecodeCost:
    """``fixed * passes + per_token * n`` seconds per decode of ``n`` tokens, fitted by decayed least
    squares; before two different decodes were seen, a token costs as much as a pass."""

    def __init__(self) -> None:
        self._sums = [0.0] * 5  # passes^2, passes*n, n^2, passes*t, n*t

    def record(self, n_tokens: int, n_passes: int, seconds: float) -> None:
        """One ``llama_decode`` of ``n_tokens`` tokens in ``n_passes`` passes took ``seconds`` (large
        prompt chunks are left out)."""
        if n_tokens > _FIT_MAX_TOKENS or n_passes <= 0 or seconds <= 0:
            return
        u, n, t = float(n_passes), float(n_tokens), seconds
        self._sums = [s * _DECAY + x for s, x in zip(self._sums, (u * u, u * n, n * n, u * t, n * t))]

    def fit(self) -> tuple[float, float]:
        """``(fixed, per_token)``: seconds once fitted, otherwise ``(1, 1)``."""
        uu, un, nn, ut, nt = self._sums
        det = uu * nn - un * un
        if det <= 1e-9 * max(uu * nn, 1e-12):
            return 1.0, 1.0
        fixed = (ut * nn - nt * un) / det
        per_token = max((uu * nt - un * ut) / det, 0.0)
        # A pass always costs something beyond its tokens (the weights are read once); a fit that says
        # otherwise is timing noise (a tiny model), so the fixed part is at least half a token's.
        fixed = max(fixed, 0.5 * per_token)
        return (fixed, per_token) if fixed > 0 else (1.0, 1.0)

    def seconds(self, n_tokens: int, n_passes: int) -> float:
        """The estimated time of a decode (in the units of :meth:`fit`)."""
        fixed, per_token = self.fit()
        return fixed * n_passes + per_token * n_tokens


@dataclass(frozen=True)
class Offer:
    """One context's draft, as far as the budget is concerned."""

    seq_id: int
    chance: float
    """Estimated chance that each draft token is accepted."""
    limit: int
    """Draft tokens at hand (the match, the room in the context, ``draft-max``)."""
    p_min: float = 0.0
    """``draft-p-min``: a token whose chance (``chance ** j``) is below it is not tried."""
    n_min: int = 0
    """``draft-min``: a shorter draft is not tried."""


def draft_length(acceptance: float, share: float, generating: int, p_min: float, limit: int) -> int:
    """Draft tokens worth trying for one context on their own: the ``j`` with ``acceptance ** j`` at
    least both ``share * generating`` (what a plain step makes per token of cost) and ``p_min``, at
    most ``limit``."""
    floor = max(share * generating, p_min)
    if limit <= 0 or acceptance <= 0.0 or floor >= 1.0:
        return 0
    if floor <= 0.0 or acceptance >= 1.0:
        return limit
    return min(limit, int(math.log(floor) / math.log(acceptance) + 1e-9))


def expected_accepted(chance: float, length: int) -> float:
    """``chance + chance ** 2 + ... + chance ** length``."""
    if chance >= 1.0:
        return float(length)
    return chance * (1.0 - chance**length) / (1.0 - chance)


def choose_drafts(
    base: Sequence[tuple[int, int]], offers: Sequence[Offer], generating: int, cost: DecodeCost, budget: int
) -> dict[int, int]:
    """Draft tokens per sequence id for a batch of ``base`` ``(sequence id, tokens)`` (in id order):
    each offer is first cut to what is worth its tokens alone (:func:`draft_length`), then the plan of
    most value (expected accepted tokens less what the extra decode time would make at the plain
    step's rate) among all drafts cut to a common length, and then with drafts left out one by one
    while that adds value; at most ``budget`` tokens in all."""
    fixed, per_token = cost.fit()
    n_base = sum(n for _, n in base)
    plain = fixed * passes(base) + per_token * n_base
    rate = generating / plain
    lengths = {o.seq_id: draft_length(o.chance, per_token / plain, generating, o.p_min, o.limit) for o in offers}
    lengths = {seq: n for seq, n in lengths.items() if n > 0}
    chances = {o.seq_id: o.chance for o in offers}

    def value(plan: dict[int, int]) -> float:
        extra = sum(plan.values())
        if extra > budget:
            return -math.inf
        counts = [(seq, n + plan.get(seq, 0)) for seq, n in base]
        seconds = fixed * passes(counts) + per_token * (n_base + extra)
        return sum(expected_accepted(chances[s], n) for s, n in plan.items()) - rate * (seconds - plain)

    best: dict[int, int] = {}
    best_value = 0.0
    for cap in range(1, max(lengths.values(), default=0) + 1):
        plan = {seq: min(n, cap) for seq, n in lengths.items()}
        if (v := value(plan)) > best_value:
            best, best_value = plan, v
    while best:
        v, seq = max((value({s: n for s, n in best.items() if s != seq}), seq) for seq in best)
        if v <= best_value:
            break
        best, best_value = {s: n for s, n in best.items() if s != seq}, v
    n_min = {o.seq_id: o.n_min for o in offers}
    return {seq: n for seq, n in best.items() if n >= n_min[seq]}


def updated_acceptance(rate: float, drafted: int, accepted: int) -> float:
    """The rate after a verified draft: each accepted token counts 1, the first refused one 0."""
    seen = accepted + (1 if accepted < drafted else 0)
    for i in range(seen):
        rate += _RATE_STEP * ((1.0 if i < accepted else 0.0) - rate)
    return rate


def backoff(misses: int) -> int:
    """Matches a context passes over after ``misses`` drafts in a row without an accepted token:
    1, 3, 7 ... at most 63 (text that does not repeat makes short, spurious matches)."""
    return min((1 << misses) - 1, 63)


def recovered_acceptance(rate: float) -> float:
    """A step without a draft: the rate drifts back towards the prior."""
    return rate + _RECOVERY * (PRIOR_ACCEPTANCE - rate)
