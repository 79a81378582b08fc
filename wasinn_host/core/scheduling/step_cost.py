"""What a step costs, for chunked prefill: passes over the weights, tokens, and the KV cells they attend.

A prompt chunk's tokens each attend every cell of their sequence before them, so on a CPU the same
chunk costs more the further into a long prompt it is: measured on a 2-core machine (random F16 llama,
12 layers), a step of seven decode tokens plus 79 prompt tokens took 125 ms at the prompt's start and
240 ms at its 2,200th token.  A cost model of passes and tokens alone (:class:`~.draft_budget.DecodeCost`,
enough for drafts, which sit at the end of short histories) lets such steps run far over the
``prefill-step-budget``; :class:`StepCost` adds the attended cells:

    seconds = fixed * passes + per_token * tokens + per_cell * cells

where ``cells`` is the sum, over the batch's tokens, of the cells each attends (:func:`attended`).  It is
fitted by decayed least squares to the worker's own decodes of up to :data:`FIT_MAX_TOKENS` tokens
(larger prompt chunks run faster per token and would make small ones look cheap); a term the data
cannot tell apart (or a negative one) is left out of the fit.  Before a fit, a token costs as
much as a pass and cells cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FIT_MAX_TOKENS = 256
"""Decodes of more tokens are not fitted (a step under the budget carries fewer)."""
_DECAY = 0.97

Entry = tuple[int, int, int]
"""One sequence's part of a batch: ``(sequence id, tokens, position of its first token)``."""


def attended(n_tokens: int, start: int) -> int:
    """KV cells that ``n_tokens`` consecutive tokens from position ``start`` attend in all (each its
    own sequence's cells up to and including itself)."""
    return n_tokens * start + n_tokens * (n_tokens + 1) // 2


def batch_cells(entries: Sequence[Entry]) -> int:
    """The cells a batch of ``entries`` attends."""
    return sum(attended(n, start) for _, n, start in entries)


class StepCost:
    """``fixed * passes + per_token * tokens + per_cell * cells`` seconds, fitted to the decodes seen."""

    def __init__(self) -> None:
        self._sums = [0.0] * 9
        """The decayed sums of ``x xᵀ`` (upper triangle, 6) and ``x * seconds`` (3), ``x`` = (passes,
        tokens, cells): plain floats, as a step records one decode (numpy's small arrays cost more)."""
        self._fit: tuple[float, float, float] | None = None

    def record(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """One ``llama_decode`` of ``n_tokens`` tokens in ``n_passes`` passes, attending ``cells``
        cells, took ``seconds``."""
        if n_tokens > FIT_MAX_TOKENS or n_tokens <= 0 or n_passes <= 0 or seconds <= 0:
            return
        u, n, c = float(n_passes), float(n_tokens), float(cells)
        terms = (u * u, u * n, u * c, n * n, n * c, c * c, u * seconds, n * seconds, c * seconds)
        self._sums = [total * _DECAY + term for total, term in zip(self._sums, terms)]
        self._fit = None

    @property
    def _xtx(self) -> np.ndarray:
        uu, un, uc, nn, nc, cc = self._sums[:6]
        return np.array([[uu, un, uc], [un, nn, nc], [uc, nc, cc]])

    @property
    def _xty(self) -> np.ndarray:
        return np.array(self._sums[6:])

    def fit(self) -> tuple[float, float, float]:
        """``(fixed, per_token, per_cell)`` in seconds; ``(1, 1, 0)`` before the decodes tell them apart."""
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float, float]:
        terms = [0, 1, 2]
        xtx, xty = self._xtx, self._xty
        while len(terms) >= 2:  # a pass and a token are always fitted; cells when the data tell them apart
            a = xtx[np.ix_(terms, terms)]
            scale = np.sqrt(np.diag(a))
            if np.any(scale <= 0) or np.linalg.cond(a / np.outer(scale, scale)) > 1e8:
                terms = terms[:-1]
                continue
            solved = np.linalg.solve(a / np.outer(scale, scale), xty[terms] / scale) / scale
            if len(terms) == 3 and solved[2] < 0:
                terms = terms[:-1]  # cells that seem to save time: timing noise
                continue
            fixed, per_token = float(solved[0]), max(float(solved[1]), 0.0)
            per_cell = float(solved[2]) if len(terms) == 3 else 0.0
            if fixed <= 0 and per_token <= 0:
                break
            # a pass costs something beyond its tokens (the weights are read once)
            return max(fixed, 0.5 * per_token), per_token, per_cell
        return 1.0, 1.0, 0.0

    def seconds(self, n_tokens: int, n_passes: int, cells: int) -> float:
        """The estimated time of a decode (in the units of :meth:`fit`)."""
        fixed, per_token, per_cell = self.fit()
        return fixed * n_passes + per_token * n_tokens + per_cell * cells
