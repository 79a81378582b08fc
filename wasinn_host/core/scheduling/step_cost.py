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

**Shapes.**  llama.cpp does not charge every pass alike.  With one KV stream per sequence it splits a
batch into passes (ubatches) of equal rows per sequence (:func:`pass_shapes`), and a backend's kernels
may change with those rows: on a CPU with flash attention, ggml runs a pass whose sequences have at
least 64 rows each through a tiled matrix product, one of a single row through a KV-split dot product,
and anything between through a scalar loop over every attended cell, several times slower per cell.
Measured on a 2-core AMX Xeon (random F16 llama, 12 layers, a prompt at position 2,000, llama.cpp
alone): 64 prompt tokens 182 ms, 16 tokens 324 ms; 64 prompt tokens beside seven stream tokens in one
``llama_decode`` 1,436 ms, because ``split_equal`` puts the prompt's first token in the streams' pass
and its other 63 in a pass of their own.  So :class:`StepCost` also fits, from the passes of each
decode (:meth:`StepCost.record_passes`), a cost per attended cell for each *row class* of pass (its
rows per sequence in powers of two: 1, 2-3, 4-7, ... 64-127, ...; :func:`row_class`) beside a shared
cost per pass and per token:

    seconds = sum over passes of  fixed + per_token * tokens + per_cell[row class] * cells

:meth:`StepCost.decode_seconds` prices a batch pass by pass with it.  A pass of a class the decodes
have not shown is priced by the pooled fit, so the planner tries it and learns what it costs; a class
the decodes have shown only at few cells (a warm-up's short prompts) is held near the pooled fit's cost
per cell by a ridge penalty as strong as the timings are noisy, so that a few milliseconds of noise over
a few hundred cells do not price its cells at many times their cost.  A
linear fit extrapolates a chunk late in a long prompt from the earlier ones, where llama.cpp's cost per
cell grows as the prompt outgrows the caches; so a decode with a chunk is priced times
:attr:`StepCost.chunk_bias`, which follows what such decodes took against their estimates.
Nothing here knows a backend: where every class costs alike (a GPU's flash attention), the prices are
those of the pooled fit and the planner's choices too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FIT_MAX_TOKENS = 256
"""Decodes of more tokens are not fitted (a step under the budget carries fewer)."""
_DECAY = 0.97

SPLIT_MARGIN = 0.1
"""A step is split into two decodes only when the estimate says that saves more than this fraction."""
N_CLASSES = 10
"""Row classes fitted apart (the last holds every pass of 512 rows per sequence or more)."""
MIN_CLASS_DECODES = 8
"""Decodes the per-class fit waits for before it prices anything (the pooled fit prices until then)."""
PRICED_MAX = 4096
"""Batches :meth:`StepCost.decode_seconds` remembers the price of (until the fits change) at most."""
BIAS_WEIGHT = 0.2
"""The weight of a decode's measured-over-estimated ratio in :attr:`StepCost.chunk_bias`."""
PRIOR_SPREAD = 1.0
"""How far, as a share of the pooled fit's cost per cell, a row class's own cost per cell is expected to lie
from it before its decodes say so: the prior of the per-class fit's ridge (:meth:`StepCost._solve_classed`)."""


Entry = tuple[int, int, int]
"""One sequence's part of a batch: ``(sequence id, tokens, position of its first token)``."""
Pass = tuple[int, int, int]
"""One pass (ubatch) of a decode: ``(rows per sequence, tokens, cells attended)``."""


def pass_shapes(entries: Sequence[Entry]) -> list[Pass]:
    """The passes llama.cpp makes over a batch of ``entries`` in sequence-id order when each sequence
    has its own KV stream (``split_equal``, as :func:`~.draft_budget.passes` counts them): each takes,
    from the lowest sequence with tokens left and the run of consecutive ids after it, as many tokens
    from each as the one with fewest left has.

    A run's passes never reach past it (ids beyond it are not consecutive with any of its own), so each
    run of consecutive ids is worked through on its own, and what is left of it after a pass splits into
    the runs that pass leaves (the planner prices hundreds of candidate steps a plan: this is its loop,
    written for the usual batch of many one-token sequences and a few prompt chunks)."""
    if any(entry[1] <= 0 for entry in entries):
        entries = [entry for entry in entries if entry[1] > 0]
    if not entries:
        return []
    columns: tuple[Sequence[int], Sequence[int], Sequence[int]] = tuple(zip(*entries))  # type: ignore[assignment]
    shapes: list[Pass] = []
    runs = _runs(*columns)
    while runs:
        ids, counts, starts = runs.pop()
        take, k = min(counts), len(counts)
        shapes.append((take, take * k, take * sum(starts) + k * (take * (take + 1) // 2)))
        if max(counts) > take:
            left = [i for i, n in enumerate(counts) if n > take]
            runs += _runs([ids[i] for i in left], [counts[i] - take for i in left], [starts[i] + take for i in left])
    return shapes


def _runs(
    ids: Sequence[int], counts: Sequence[int], starts: Sequence[int]
) -> list[tuple[Sequence[int], Sequence[int], Sequence[int]]]:
    """The runs of consecutive ids of entries in ascending id order, the last run first."""
    if ids[-1] - ids[0] == len(ids) - 1:  # one run (the ids are distinct)
        return [(ids, counts, starts)]
    runs: list[tuple[Sequence[int], Sequence[int], Sequence[int]]] = []
    first = 0
    for n in range(1, len(ids)):
        if ids[n] != ids[n - 1] + 1:
            runs.append((ids[first:n], counts[first:n], starts[first:n]))
            first = n
    runs.append((ids[first:], counts[first:], starts[first:]))
    runs.reverse()
    return runs


def row_class(rows: int) -> int:
    """A pass's row class: ``floor(log2(rows per sequence))`` (1: 0, 2-3: 1, ... 64-127: 6), at most
    ``N_CLASSES - 1``."""
    return min(max(rows, 1).bit_length() - 1, N_CLASSES - 1)


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
        self._cx = np.zeros((2 + N_CLASSES, 2 + N_CLASSES))
        self._cy = np.zeros(2 + N_CLASSES)
        """Decayed sums of ``x xᵀ`` and ``x * seconds``, ``x`` = (passes, tokens, cells of each row class)."""
        self._classed = 0
        """Decodes the per-class sums have seen."""
        self._single = [0.0] * 11
        self._singles = 0
        """One-row decodes not yet in ``_cx``/``_cy``: their decayed sums, as the pooled fit's, then of
        ``seconds ** 2`` and of the decodes, and their count."""
        self._cyy = 0.0
        self._cn = 0.0
        """Decayed sums of ``seconds ** 2`` and of the decodes (their weights), for the fit's noise."""
        self._class_fit: tuple[float, float, list[float | None]] | None = None
        self._priced: dict[tuple[Entry, ...], float] = {}
        """:meth:`decode_seconds` of the batches priced since the fits last changed: a plan prices the
        same generating tokens beside each candidate prompt chunk, and a chunk's size is searched for."""
        self.chunk_bias = 1.0
        """What :meth:`decode_seconds` multiplies the per-class fit's price of a decode with a prompt chunk
        (a pass of several rows per sequence) by: moved after each such decode by :data:`BIAS_WEIGHT` of
        its error (what it took over what was estimated for it, with the bias), so the estimates follow
        the measurements where the fit does not.  The linear fit extrapolates a chunk late in a long
        prompt from the earlier ones, and llama.cpp's cost per cell grows as the prompt's cells outgrow
        the caches (measured: 10-20% over the fit's estimate at position 2,000)."""

    def record(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """One ``llama_decode`` of ``n_tokens`` tokens in ``n_passes`` passes, attending ``cells``
        cells, took ``seconds`` (the pooled fit only)."""
        if n_tokens > FIT_MAX_TOKENS or n_tokens <= 0 or n_passes <= 0 or seconds <= 0:
            return
        u, n, c = float(n_passes), float(n_tokens), float(cells)
        terms = (u * u, u * n, u * c, n * n, n * c, c * c, u * seconds, n * seconds, c * seconds)
        self._sums = [total * _DECAY + term for total, term in zip(self._sums, terms)]
        self._fit = None
        self._priced.clear()

    def record_passes(self, shapes: Sequence[Pass], seconds: float) -> None:
        """One ``llama_decode`` made the passes ``shapes`` (:func:`pass_shapes`) in ``seconds``: both fits,
        and for a decode with a prompt chunk :attr:`chunk_bias`."""
        self._priced.clear()
        if seconds > 0 and self._classed >= MIN_CLASS_DECODES and any(rows > 1 for rows, _, _ in shapes):
            estimate = self._price(shapes) * self.chunk_bias
            if estimate > 0:  # the estimate as the planner made it: the fit's, with the bias
                ratio = min(max(seconds / estimate, 0.5), 2.0)
                self.chunk_bias = min(max(self.chunk_bias * (1.0 + BIAS_WEIGHT * (ratio - 1.0)), 0.5), 2.0)
        n_tokens = sum(p[1] for p in shapes)
        cells = sum(p[2] for p in shapes)
        self.record(n_tokens, len(shapes), cells, seconds)
        if n_tokens > FIT_MAX_TOKENS or n_tokens <= 0 or seconds <= 0:
            return
        x = np.zeros(2 + N_CLASSES)
        x[0], x[1] = len(shapes), n_tokens
        for rows, _, pass_cells in shapes:
            x[2 + row_class(rows)] += pass_cells
        self._add_classed(x, seconds)

    def record_single_rows(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """:meth:`record_passes` for a decode whose passes each take one row per sequence (a carried
        plan: one token for each running job), without listing its passes."""
        self.record(n_tokens, n_passes, cells, seconds)
        if n_tokens > FIT_MAX_TOKENS or n_tokens <= 0 or n_passes <= 0 or seconds <= 0:
            return
        # the per-class sums of a one-row decode touch only passes, tokens and class 0's cells: kept in
        # plain floats until the sums are next needed (a carried plan's step records one of these)
        u, n, c = float(n_passes), float(n_tokens), float(cells)
        terms = (u * u, u * n, u * c, n * n, n * c, c * c, u * seconds, n * seconds, c * seconds, seconds**2, 1.0)
        self._single = [total * _DECAY + term for total, term in zip(self._single, terms)]
        self._singles += 1
        self._classed += 1
        self._class_fit = None
        self._priced.clear()

    def _fold_singles(self) -> None:
        """Add the one-row decodes kept apart to the per-class sums (each decayed as if added in turn)."""
        if not self._singles:
            return
        decay = _DECAY**self._singles
        self._cx *= decay
        self._cy *= decay
        uu, un, uc, nn, nc, cc, uy, ny, cy, yy, weight = self._single
        self._cx[:3, :3] += np.array([[uu, un, uc], [un, nn, nc], [uc, nc, cc]])
        self._cy[:3] += np.array([uy, ny, cy])
        self._cyy = self._cyy * decay + yy
        self._cn = self._cn * decay + weight
        self._single = [0.0] * 11
        self._singles = 0

    def _add_classed(self, x: np.ndarray, seconds: float) -> None:
        self._fold_singles()
        self._cx *= _DECAY
        self._cx += np.outer(x, x)
        self._cy *= _DECAY
        self._cy += x * seconds
        self._cyy = self._cyy * _DECAY + seconds**2
        self._cn = self._cn * _DECAY + 1.0
        self._classed += 1
        self._class_fit = None
        self._priced.clear()

    def knows(self, rows: int) -> bool:
        """Whether the per-class fit prices a pass of ``rows`` rows per sequence from decodes of its class."""
        classed = self.classed_fit()
        return classed is not None and classed[2][row_class(rows)] is not None

    def classed_fit(self) -> tuple[float, float, list[float | None]] | None:
        """``(fixed, per_token, per_cell of each row class)`` of the per-class fit (None for a class the
        decodes have not shown), or None before :data:`MIN_CLASS_DECODES` decodes or when they cannot
        tell a pass, a token and a class's cells apart."""
        if self._class_fit is None and self._classed >= MIN_CLASS_DECODES:
            self._fold_singles()
            self._class_fit = self._solve_classed()
        return self._class_fit if self._classed >= MIN_CLASS_DECODES else None

    def _solve_classed(self) -> tuple[float, float, list[float | None]] | None:
        """The per-class fit: decayed least squares, each class's cost per cell held towards the pooled
        fit's by a ridge penalty (:meth:`_ridge`).  A class seen only in decodes that attended few cells
        (a prompt's first chunks, a warm-up's short prompts) cannot tell its cost per cell from the
        timing noise: fitted freely, a few milliseconds of noise over a few hundred cells priced a class's
        cell at 15-25 times what it costs, and 33 rows at position 2,000 at 1.5 s (measured: 0.2 s; an
        AMD EPYC with AVX-512, the mixed-load benchmark), and the prompt went on in chunks of the wrong
        class.  Seen at many cells, a class's own decodes outweigh the penalty."""
        diag = np.diag(self._cx)
        terms = [0, 1] + [2 + k for k in range(N_CLASSES) if diag[2 + k] > 0]
        prior = self.fit()[2]
        ridge = self._ridge(terms, prior)
        while len(terms) >= 2:
            classes = np.array([t >= 2 for t in terms])
            a = self._cx[np.ix_(terms, terms)] + np.diag(np.where(classes, ridge, 0.0))
            b = self._cy[terms] + np.where(classes, ridge * prior, 0.0)
            scale = np.sqrt(np.diag(a))
            if np.any(scale <= 0):
                return None
            normed = a / np.outer(scale, scale)
            if np.linalg.cond(normed) > 1e8:
                if len(terms) == 2:
                    return None
                terms = terms[:-1]  # the rarest shapes last: a class the decodes cannot tell apart
                continue
            solved = np.linalg.solve(normed, b / scale) / scale
            negative = [t for t, v in zip(terms[2:], solved[2:]) if v < 0]
            if negative:  # cells that seem to save time: timing noise
                terms = [t for t in terms if t not in negative]
                continue
            fixed, per_token = float(solved[0]), float(solved[1])
            if fixed <= 0 or per_token < 0:  # a class's cells took a pass's or a token's cost: no fit
                return None
            per_cell: list[float | None] = [None] * N_CLASSES
            for t, v in zip(terms[2:], solved[2:]):
                per_cell[t - 2] = float(v)
            return fixed, per_token, per_cell
        return None

    def _ridge(self, terms: list[int], prior: float) -> float:
        """The per-class fit's ridge weight, ``noise / (PRIOR_SPREAD * prior) ** 2`` (a Gaussian prior on
        each class's cost per cell around the pooled fit's ``prior``): ``noise``, the variance of the
        decodes' seconds about the unpenalised fit of ``terms``, so that exact timings (a model's own)
        are fitted exactly and noisy ones lean on the prior where their cells are few.  0 where the
        pooled fit prices no cells."""
        if prior <= 0 or self._cn <= len(terms):
            return 0.0
        a, b = self._cx[np.ix_(terms, terms)], self._cy[terms]
        scale = np.sqrt(np.diag(a))
        if np.any(scale <= 0):
            return 0.0
        beta = np.linalg.lstsq(a / np.outer(scale, scale), b / scale, rcond=1e-10)[0] / scale
        residual = max(self._cyy - 2.0 * float(beta @ b) + float(beta @ a @ beta), 0.0)
        noise = residual / (self._cn - len(terms))
        return noise / (PRIOR_SPREAD * prior) ** 2

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
            if len(terms) == 3 and min(solved[1], solved[2]) < 0:
                terms = terms[:-1]  # cells that seem to save time, or to take the tokens' cost: noise
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

    def plain_seconds(self, n_tokens: int, n_passes: int, cells: int) -> float:
        """The estimated time of a decode whose passes each take one row per sequence (a plain step)."""
        classed = self.classed_fit()
        if classed is None:
            return self.seconds(n_tokens, n_passes, cells)
        fixed, per_token, per_cell = classed
        if per_cell[0] is None:
            return self.seconds(n_tokens, n_passes, cells)
        return fixed * n_passes + per_token * n_tokens + per_cell[0] * cells

    def decode_seconds(self, entries: Sequence[Entry]) -> float:
        """The estimated time of one ``llama_decode`` of ``entries`` (in sequence-id order): each of its
        passes (:func:`pass_shapes`) priced by the per-class fit (by the pooled fit before there is one),
        a decode with a prompt chunk scaled by :attr:`chunk_bias`."""
        key = tuple(entries)
        seconds = self._priced.get(key)
        if seconds is None:
            if len(self._priced) >= PRICED_MAX:
                self._priced.clear()
            shapes = pass_shapes(entries)
            seconds = self._price(shapes)
            if any(rows > 1 for rows, _, _ in shapes):
                seconds *= self.chunk_bias
            self._priced[key] = seconds
        return seconds

    def _price(self, shapes: Sequence[Pass]) -> float:
        """The passes ``shapes`` priced by the per-class fit (by the pooled fit before there is one)."""
        classed = self.classed_fit()
        if classed is None:
            return self.seconds(sum(p[1] for p in shapes), len(shapes), sum(p[2] for p in shapes))
        fixed, per_token, per_cell = classed
        seconds = 0.0
        for rows, tokens, cells in shapes:
            own = per_cell[row_class(rows)]
            if own is None:  # a class not seen yet: the pooled fit's price
                seconds += self.seconds(tokens, 1, cells)
            else:
                seconds += fixed + per_token * tokens + own * cells
        return seconds

    def step_seconds(self, generating: Sequence[Entry], prompts: Sequence[Entry]) -> tuple[float, bool]:
        """The estimated time of a step of ``generating`` and ``prompts`` entries, and whether it is
        cheaper decoded as two ``llama_decode`` calls (the generating tokens, then the prompt chunks)
        than as one (by more than :data:`SPLIT_MARGIN`; llama.cpp then passes over the prompts' rows
        in passes of their own, instead of the first of each in the generating tokens' pass)."""
        together = self.decode_seconds(sorted([*generating, *prompts]))
        if not generating or not prompts:
            return together, False
        split = self.decode_seconds(sorted(generating)) + self.decode_seconds(sorted(prompts))
        if split * (1 + SPLIT_MARGIN) < together:
            return split, True
        return together, False
