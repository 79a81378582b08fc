"""How many draft tokens are worth verifying: the decode cost measured, each context's acceptance rate.

One more token in a ``llama_decode`` batch costs ``per_token`` seconds; the batch itself costs
``fixed + per_token * n``.  A step without drafts makes ``G`` tokens (one per generating context) in
``fixed + per_token * B`` (``B`` tokens in the batch).  The ``j``-th draft token of a context is accepted
with probability ``a ** j`` (``a``: the context's acceptance rate) and costs ``per_token``, so it pays
while ``a ** j`` is above what the plain step makes per ``per_token`` seconds: ``per_token * G / (fixed +
per_token * B)``.  On this project's 2-core machine a token costs about as much as the fixed part, so
a lone context drafts while ``a ** j >= ~0.5`` and eight contexts almost never; on a GPU the per-token
cost is small and drafts are long.  :class:`DecodeCost` fits ``fixed`` and ``per_token`` to the
worker's own decodes of up to 64 tokens.
"""

from __future__ import annotations

import math

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


class DecodeCost:
    """``fixed + per_token * n`` seconds per decode of ``n`` tokens, fitted by decayed least squares."""

    def __init__(self) -> None:
        self._sums = [0.0] * 5  # weight, n, n*n, t, n*t

    def record(self, n_tokens: int, seconds: float) -> None:
        """One ``llama_decode`` of ``n_tokens`` tokens took ``seconds`` (large prompt chunks are left out)."""
        if n_tokens > _FIT_MAX_TOKENS or seconds <= 0:
            return
        n, t = float(n_tokens), seconds
        self._sums = [s * _DECAY + x for s, x in zip(self._sums, (1.0, n, n * n, t, n * t))]

    def per_token_share(self, base_tokens: int) -> float:
        """``per_token / (fixed + per_token * base_tokens)``; before the fit has two batch sizes to go
        on, as if a token cost as much as the fixed part."""
        w, sn, snn, st, snt = self._sums
        det = w * snn - sn * sn
        if w < 2 or det <= 1e-9 * max(w * snn, 1.0):
            return 1.0 / (1.0 + base_tokens)
        per_token = (w * snt - sn * st) / det
        fixed = (st - per_token * sn) / w
        if per_token <= 0:
            return 0.0
        # A decode always costs something beyond its tokens (the weights are read once); a fit that
        # says otherwise is timing noise (a tiny model), so the fixed part is at least half a token's.
        return per_token / (max(fixed, 0.5 * per_token) + per_token * base_tokens)


def draft_length(acceptance: float, share: float, generating: int, p_min: float, limit: int) -> int:
    """Draft tokens worth trying for one context: the ``j`` with ``acceptance ** j`` at least both
    ``share * generating`` (what a plain step makes per token of cost) and ``p_min``, at most ``limit``."""
    floor = max(share * generating, p_min)
    if limit <= 0 or acceptance <= 0.0 or floor >= 1.0:
        return 0
    if floor <= 0.0 or acceptance >= 1.0:
        return limit
    return min(limit, int(math.log(floor) / math.log(acceptance) + 1e-9))


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
