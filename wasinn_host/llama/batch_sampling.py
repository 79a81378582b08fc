"""Seeded sampling of many logits rows at once, drawing exactly what llama.cpp's own chain draws.

A sampler whose chain is ``penalties -> top-k -> top-p -> min-p -> temperature -> dist`` (any of the
first four left out; no logit bias, DRY, grammar, typical, XTC, top-n-sigma, dynamic temperature or
mirostat: those stay on llama.cpp's chain) is replaced by a :class:`RowDraw`: the rows of all such
sequences of a decode are sampled together, as array work over the rows of each sampler kind, and
every sequence keeps its own random numbers.  What llama.cpp (the build llama-cpp-python 0.3.36
vendors: ``src/llama-sampler.cpp``) does, and what is reproduced:

* ``dist`` draws with a ``std::mt19937`` seeded with the seed (a random seed for 4294967295), one
  ``std::uniform_real_distribution<double>(0, 1)`` draw per token: libstdc++'s
  ``generate_canonical<double, 53>``, two 32-bit outputs ``(r0 + r1 * 2**32) / 2**64`` (numpy's
  legacy ``RandomState(seed)`` is the same generator seeded the same way).  It takes
  ``p_i = expf(logit_i - max)`` in float, their double sum ``S`` in the candidates' order, and picks
  the first candidate whose running double sum reaches ``S * u``.
* the penalties (repeat, frequency, presence) count the last ``penalty_last_n`` accepted tokens (a
  ring buffer) and change those tokens' logits in float: ``logit <= 0 ? logit * repeat : logit /
  repeat``, then ``- (count * frequency + 1 * presence)``;
* top-k sorts the ``k`` largest logits in descending order; top-p (on sorted candidates) takes a float
  softmax and keeps the candidates up to the first whose running float sum reaches ``p``; min-p keeps
  the logits at or above ``max + logf(p)`` (sorted: a prefix; unsorted: in vocabulary order);
  temperature divides the logits in float.

numpy's ``exp`` is not glibc's ``expf`` to the last bit (it differs by one ulp on about one value in
1,500), and an exact tie of logits leaves the order of a partial sort to ``std::partial_sort``.  So
each array pick is checked: where a running sum lies within the rounding those differences could
cause of the point it is compared with, or the picked logit ties a neighbour, that row is drawn
again exactly, row by row (:func:`exact_draw`: llama.cpp's own truncation stages on the row, then the
draw with the C library's ``expf``), from the same random number.  Such rows are few (measured on a
32k vocabulary: under 1 in 1,000 draws after top-k 40, about 1 in 200 over the whole vocabulary; more
where logits tie); the tokens are llama.cpp's for every row.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.config.params import DEFAULT_SEED, SamplingParams
from .bindings import llama_cpp

_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_expf = _LIBM.expf
_expf.restype, _expf.argtypes = ctypes.c_float, [ctypes.c_float]
_logf = _LIBM.logf
_logf.restype, _logf.argtypes = ctypes.c_float, [ctypes.c_float]

_BLOCK = 64
"""Draws a sequence's generator makes at a time (consumed in order, so the same numbers)."""
_GROUP_ROWS = 32
"""Top-k finds its candidates among the members of the groups of ``_GROUP_ROWS`` logits with the
largest maxima (a group: every ``V // _GROUP_ROWS``-th logit), not over the whole row."""
_SUM_MARGIN = 3e-7
"""Distance of the draw's target from a running double sum, as a share of the total, below which a row
is drawn exactly: each ``expf`` within one float ulp (2**-23) of the C library's moves a running sum
and the target by at most that share of the total each (and the double roundings by far less)."""
_FLOAT_ULP = 2.0**-23
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
"""``llama_token_data``."""


@dataclass(frozen=True)
class DrawKind:
    """The settings of a chain sampled as arrays; rows of one kind are sampled in one array operation.
    Values are the floats llama.cpp stores."""

    top_k: int
    """0: no top-k (the candidates stay in vocabulary order)."""
    top_p: float
    min_p: float
    log_min_p: float
    """``logf(min_p)`` (the C library's, as llama.cpp computes it)."""
    min_keep: int
    temp: float
    penalties: tuple[int, float, float, float] | None = None
    """``(last_n, repeat, frequency, presence)``, or None without a penalties stage (or a disabled one)."""


def draw_kind(params: SamplingParams, n_vocab: int, n_ctx_seq: int) -> DrawKind | None:
    """The array kind of a chain (the caller checks: no grammar, no suppressed tokens), or None where
    llama.cpp's chain must draw: greedy, logit bias, DRY, mirostat, typical, XTC, top-n-sigma, dynamic
    temperature, a top-k of the whole vocabulary, or top-p without top-k (a sort of the whole vocabulary
    per row, as costly as the chain)."""
    p = params
    if p.greedy or p.mirostat != 0 or p.typ_p < 1.0 or p.xtc_probability > 0.0 or p.top_n_sigma > 0:
        return None
    if p.dynatemp_range > 0 or p.dry_multiplier > 0 or p.logit_bias or p.top_k >= n_vocab:
        return None
    top_k = max(p.top_k, 0)
    top_p = float(np.float32(p.top_p)) if p.top_p < 1.0 else 1.0
    if top_k == 0 and top_p < 1.0:
        return None
    min_p = float(np.float32(p.min_p)) if p.min_p > 0.0 else 0.0
    log_min_p = float(_logf(min_p)) if min_p > 0.0 else 0.0
    penalties = None
    if p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:  # the stage the host adds
        last_n = max(n_ctx_seq if p.last_n_penalty < 0 else p.last_n_penalty, 0)
        repeat, frequency, presence = (
            float(np.float32(x)) for x in (p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
        )
        if last_n and not (repeat == 1.0 and frequency == 0.0 and presence == 0.0):  # else llama.cpp's is empty
            penalties = (last_n, repeat, frequency, presence)
    temp = float(np.float32(p.temp))
    kind = DrawKind(top_k, top_p, min_p, log_min_p, max(p.min_keep, 0), temp, penalties)
    if len(_KINDS) >= _KINDS_KEPT:  # guests that vary their settings endlessly: equal kinds made after
        _KINDS.clear()  # this are other objects, sampled in groups of their own (the same tokens)
    return _KINDS.setdefault(kind, kind)  # one object per kind: rows are grouped by identity


_KINDS: dict[DrawKind, DrawKind] = {}
_KINDS_KEPT = 1024


class Penalties:
    """A sequence's penalties stage: the counts of its last ``last_n`` accepted tokens."""

    def __init__(self, last_n: int, repeat: float, frequency: float, presence: float) -> None:
        self.last_n = last_n
        self.repeat, self.frequency, self.presence = np.float32(repeat), np.float32(frequency), np.float32(presence)
        self.previous: deque[int] = deque()
        self.counts: dict[int, int] = {}

    def accept(self, token: int) -> None:
        """Count an accepted token; the oldest of a full window leaves it (llama.cpp's ring buffer)."""
        counts = self.counts
        counts[token] = counts.get(token, 0) + 1
        if len(self.previous) >= self.last_n:
            old = self.previous.popleft()
            if counts[old] == 1:
                del counts[old]
            else:
                counts[old] -= 1
        self.previous.append(token)

    def apply(self, row: np.ndarray) -> None:
        """Change the counted tokens' logits in ``row`` (float32, in place) as llama.cpp does."""
        if not self.counts:
            return
        ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
        counts = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
        logits = row[ids]
        logits = np.where(logits <= 0, logits * self.repeat, logits / self.repeat)
        row[ids] = logits - (counts * self.frequency + np.float32(1.0) * self.presence)

    def reset(self) -> None:
        """Forget the window."""
        self.previous.clear()
        self.counts.clear()


class SeededDraws:
    """One sequence's uniform draws in [0, 1): those of llama.cpp's ``dist`` sampler for ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed & 0xFFFF_FFFF
        self._block: list[float] = []
        self._next = 0
        self._rng = np.random.RandomState(0)
        self.reset()

    def reset(self) -> None:
        """Start again from the seed (a new random one for the random seed), as ``llama_sampler_reset``."""
        seed = self.seed if self.seed != DEFAULT_SEED else int.from_bytes(os.urandom(4), "little")
        self._rng = np.random.RandomState(seed)  # init_genrand(seed): std::mt19937(seed)
        self._block, self._next = [], 0

    def next(self) -> float:
        """The next draw."""
        if self._next == len(self._block):
            raw = self._rng.randint(0, 2**32, size=2 * _BLOCK, dtype=np.uint32).astype(np.float64)
            draws = (raw[0::2] + raw[1::2] * 2.0**32) / 2.0**64  # generate_canonical<double, 53>
            draws[draws >= 1.0] = np.nextafter(1.0, 0.0)
            self._block, self._next = draws.tolist(), 0
        draw = self._block[self._next]
        self._next += 1
        return draw


class RowDraw:
    """A sequence's sampler drawn as arrays: its kind, its random numbers, and (made on first need) the
    llama.cpp stages of its chain without the draw, for :func:`exact_draw`."""

    def __init__(self, kind: DrawKind, seed: int, n_vocab: int, truncation: Callable[[], Any]) -> None:
        self.kind = kind
        self.n_vocab = n_vocab
        self.draws = SeededDraws(seed)
        self.penalties = Penalties(*kind.penalties) if kind.penalties else None
        self._make_truncation = truncation
        self._truncation: Any = None

    def truncation(self) -> Any:
        """llama.cpp's chain of this sampler's stages before the draw."""
        if self._truncation is None:
            self._truncation = self._make_truncation()
        return self._truncation

    def reset(self) -> None:
        """Start the random numbers again from the seed (and forget the penalties' window)."""
        self.draws.reset()
        if self.penalties is not None:
            self.penalties.reset()

    def close(self) -> None:
        """Free the llama.cpp stages, if made."""
        if self._truncation is not None:
            llama_cpp.llama_sampler_free(self._truncation)
            self._truncation = None


class DrawCounts:
    """How rows were drawn (all samplers of the process): by arrays, or again exactly row by row."""

    rows = 0
    exact = 0


def draw(logits: np.ndarray, samplers: list[RowDraw], exact: bool = False) -> list[int]:
    """The token each sampler draws from its row of ``logits`` (``(n, n_vocab)`` float32, not changed),
    and accepts (``llama_sampler_sample``): each sampler's next random number used, its penalties'
    window moved on; rows of one kind are sampled together.  ``exact``: every
    row drawn by :func:`exact_draw` (what the array work is checked against)."""
    draws = np.array([sampler.draws.next() for sampler in samplers], dtype=np.float64)
    penalized = [i for i, sampler in enumerate(samplers) if sampler.penalties is not None and sampler.penalties.counts]
    if penalized:
        logits = np.array(logits)  # llama.cpp changes its copy of the candidates, never the logits
        for i in penalized:
            samplers[i].penalties.apply(logits[i])  # type: ignore[union-attr]
    tokens = [0] * len(samplers)
    redo: list[int] = []
    DrawCounts.rows += len(samplers)
    if exact:
        redo = list(range(len(samplers)))
    else:
        kinds: dict[int, list[int]] = {}
        for i, sampler in enumerate(samplers):
            kinds.setdefault(id(sampler.kind), []).append(i)
        for rows in kinds.values():
            kind = samplers[rows[0]].kind
            every = len(rows) == len(samplers)
            sub = logits if every else logits[rows]
            sampled = _sorted_draw if kind.top_k else _unsorted_draw
            picks, doubtful = sampled(sub, kind, draws if every else draws[rows])
            for i, token, doubt in zip(rows, picks.tolist(), doubtful.tolist()):
                tokens[i] = token
                if doubt:
                    redo.append(i)
    for i in redo:
        DrawCounts.exact += 1
        tokens[i] = exact_draw(logits[i], samplers[i].truncation(), float(draws[i]))
    for sampler, token in zip(samplers, tokens):
        if sampler.penalties is not None:
            sampler.penalties.accept(token)
    return tokens


def _exp32(x: np.ndarray) -> np.ndarray:
    """``expf`` of float32 values, within one ulp of the C library's (the checks allow for that)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def expf(x: np.ndarray) -> np.ndarray:
    """The C library's ``expf`` of float32 values, as arrays: the double ``exp`` rounded to float, which
    is the C library's (correctly rounded but within 0.502 ulp) except where the exact value lies near
    the midpoint of two floats; those (within 0.01 ulp of one: 2 in 100) are the C library's own."""
    wide = np.exp(x.astype(np.float64))
    out = wide.astype(np.float32)
    toward = np.nextafter(out, np.where(wide > out, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32))
    ulp = np.abs(toward.astype(np.float64) - out)
    near = np.flatnonzero(np.abs(wide - (out.astype(np.float64) + toward) / 2) <= 0.01 * ulp)
    if len(near):
        out[near] = [_expf(value) for value in x[near].tolist()]
    return out


def _top(logits: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``m`` largest logits of each row in descending order, and their token ids (equal logits in
    any order).  The candidates are the members of the ``m`` groups with the largest maxima, and the
    tail the groups leave out: any logit among the ``m`` largest is one of them, or ties one that is."""
    n, n_vocab = logits.shape
    width = n_vocab // _GROUP_ROWS
    if width < 4 * m:
        ids = np.argpartition(logits, n_vocab - m, axis=1)[:, n_vocab - m :]
    else:
        body = _GROUP_ROWS * width
        groups = logits[:, :body].reshape(n, _GROUP_ROWS, width)
        best = np.argpartition(groups.max(axis=1), width - m, axis=1)[:, width - m :]
        members = groups[np.arange(n)[:, None], :, best].reshape(n, m * _GROUP_ROWS)
        member_ids = (best[:, :, None] + width * np.arange(_GROUP_ROWS)).reshape(n, m * _GROUP_ROWS)
        if body < n_vocab:
            members = np.concatenate([members, logits[:, body:]], axis=1)
            member_ids = np.concatenate([member_ids, np.broadcast_to(np.arange(body, n_vocab), (n, n_vocab - body))], 1)
        count = members.shape[1]
        at = np.argpartition(members, count - m, axis=1)[:, count - m :]
        ids = np.take_along_axis(member_ids, at, axis=1)
    values = np.take_along_axis(logits, ids, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)


def _sorted_draw(logits: np.ndarray, kind: DrawKind, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-k, then top-p, min-p, temperature and the draw over the sorted candidates: the picked token
    of each row, and whether the row must be drawn exactly."""
    k = kind.top_k
    ids, values = _top(logits, k + 1)  # one more: a tie at the cut shows
    top = values[:, :k]
    n = len(logits)
    at = np.arange(k)
    size = np.full(n, k)
    doubtful = np.zeros(n, dtype=bool)
    if kind.top_p < 1.0:
        weights = _exp32(top - top[:, :1])
        total = np.cumsum(weights, axis=1, dtype=np.float32)[:, -1]
        running = np.cumsum(weights / total[:, None], axis=1, dtype=np.float32)
        reached = (running >= np.float32(kind.top_p)) & (at + 1 >= kind.min_keep)
        size = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, k)
        margin = (2 * k + 4) * 2 * _FLOAT_ULP
        doubtful |= (np.abs(running - np.float32(kind.top_p)) <= margin).any(axis=1)
    if kind.min_p > 0.0:
        floor = top[:, 0] + np.float32(kind.log_min_p)
        below = (top < floor[:, None]) & (at >= max(kind.min_keep, 1)) & (at < size[:, None])
        size = np.where(below.any(axis=1), below.argmax(axis=1), size)
    scaled = top / np.float32(kind.temp)
    weights = np.where(at < size[:, None], _exp32(scaled - scaled[:, :1]), np.float32(0)).astype(np.float64)
    picks, doubt = _pick(np.cumsum(weights, axis=1), draws)
    rows = np.arange(n)
    picked = top[rows, picks]
    doubtful |= doubt | (picked == values[rows, picks + 1]) | ((picks > 0) & (picked == values[rows, picks - 1]))
    return ids[rows, picks], doubtful


def _unsorted_draw(logits: np.ndarray, kind: DrawKind, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Min-p (in vocabulary order), temperature and the draw over the whole vocabulary."""
    doubtful = np.zeros(len(logits), dtype=bool)
    scaled = logits / np.float32(kind.temp)
    if kind.min_p > 0.0:
        kept = logits >= (logits.max(axis=1) + np.float32(kind.log_min_p))[:, None]
        doubtful |= kept.sum(axis=1) < kind.min_keep  # llama.cpp sorts then: drawn exactly
        scaled = np.where(kept, scaled, np.float32(-np.inf))
    weights = _exp32(scaled - scaled.max(axis=1)[:, None]).astype(np.float64)
    picks, doubt = _pick(np.cumsum(weights, axis=1), draws)
    return picks, doubtful | doubt


def _pick(running: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``dist``'s pick: the first index whose running sum reaches ``total * draw``; and whether a running
    sum lies too near that target to be sure of it."""
    total = running[:, -1]
    target = total * draws
    picks = (running < target[:, None]).sum(axis=1)
    rows = np.arange(len(running))
    below = np.where(picks > 0, running[rows, np.maximum(picks - 1, 0)], 0.0)
    margin = _SUM_MARGIN * total
    return picks, (target - below <= margin) | (running[rows, picks] - target <= margin)


def exact_draw(row: np.ndarray, truncation: Any, draw: float) -> int:
    """The token llama.cpp's chain draws from one logits row with the random number ``draw``: its own
    stages before the draw (``truncation``) over the row's candidates in vocabulary order, then
    ``dist``'s pick with the C library's ``expf`` (:func:`expf`)."""
    n_vocab = len(row)
    data = np.empty(n_vocab, dtype=TOKEN_DATA)
    data["id"] = np.arange(n_vocab, dtype=np.int32)
    data["logit"] = row
    data["p"] = 0.0
    array = llama_cpp.llama_token_data_array(
        data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), n_vocab, -1, False
    )
    llama_cpp.llama_sampler_apply(truncation, ctypes.byref(array))
    size = int(array.size)
    ids, logits = data["id"][:size], data["logit"][:size]
    if size == 1:
        return int(ids[0])
    high = logits[0] if array.sorted else logits.max()
    running = np.cumsum(expf(logits - high).astype(np.float64))  # in order, as dist's double sums
    reached = np.flatnonzero(running >= running[-1] * draw)
    return int(ids[reached[0]]) if len(reached) else int(ids[size - 1])
