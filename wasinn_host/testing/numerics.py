"""What a real-model test may assert about llama.cpp's numerics: tokens within a margin of the reference's best.

llama.cpp's logits for the same tokens are bit-identical only when it computes them the same way: the
same ``llama_decode`` calls (tokens, positions, sequences per batch), the same KV cell layout, the same
thread count and the same machine kernels.  A token decoded alone or beside other sequences, a prompt
decoded in one piece or two, a draft verified in a batch, all take other kernels (a one-token decode
runs ``vec_dot``, a larger batch tinyBLAS or the repacked Q4_0 / Q4_K ``gemm`` on groups of four rows;
flash attention tiles 64 query tokens and splits one token's KV cells over the threads), and AVX2 and
AVX-512 machines choose among them differently.  The logits then differ in their last bits, or with
repacked weights by a unit or more, and where two tokens are that close the greedy choice can differ.

So a test that compares texts made under different batch shapes holds on any CPU only in one of three
ways: compare with llama.cpp making the same calls; use a constructed model whose margins dwarf the
noise (the successor and demo models); or follow the text under test with a reference decode
(:meth:`~.native_llama.NativeModel.follow`: llama.cpp alone, fed the text's own tokens) and check each
token against the reference's logits for the same prefix (:func:`check_greedy`, :func:`check_forced`):
a greedy token must be within :data:`MARGIN` of the reference's best, so wherever the reference's best
leads by more than that, it must be that token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MARGIN = 2.0
"""Logits by which a gap between two tokens may move between batch shapes, splits, thread counts and
x86-64 kernels (measured on AVX2: up to 0.84 for Gemma 3 270M Q4_K_M, 0 for SmolLM2 Q4_1;
``tests/llama/test_cpu_independence.py`` measures it again on each machine the suite runs on)."""


@dataclass(frozen=True)
class Step:
    """The reference's view of one token of a text under test, given the same tokens before it."""

    token: int
    """The text's token."""
    best: int
    """The reference's most likely token (the first of equal maxima, as llama.cpp's greedy sampler)."""
    shortfall: float
    """The reference's logit of ``best`` less that of ``token`` (0 when they are the same)."""
    margin: float
    """The reference's top logit less its second."""
    rival_mass: float
    """The other tokens' probability relative to the best's: ``sum(exp(l - l_best))`` over the rest."""


def step_of(logits: np.ndarray, token: int) -> Step:
    """Compare ``token`` with the reference ``logits`` of its position."""
    best = int(np.argmax(logits))
    top = float(logits[best])
    top2 = np.partition(logits, -2)[-2:]
    rest = float(np.exp(logits.astype(np.float64) - top).sum()) - 1.0
    return Step(token, best, top - float(logits[token]), float(top2[1] - top2[0]), max(rest, 0.0))


def gap_drift(reference: np.ndarray, other: np.ndarray, rivals: int = 64) -> float:
    """How far the gaps between the reference's best token and its ``rivals`` runners-up moved in
    ``other``, the logits of the same step computed another way (the tokens further down cannot compete)."""
    best = int(np.argmax(reference))
    top = np.argpartition(-reference, rivals)[: rivals + 1]
    moved = other.astype(np.float64)[top] - reference.astype(np.float64)[top]
    return float(np.max(np.abs(moved - (float(other[best]) - float(reference[best])))))


def check_greedy(steps: Sequence[Step], bound: float = MARGIN) -> int:
    """Assert that every greedy token is within ``bound`` of the reference's best: a computation of the
    same prefix whose gaps move by less than ``bound`` chose it.  Returns how many steps were forced
    (the reference's best led by ``bound`` or more, so the token had to be that one)."""
    for i, step in enumerate(steps):
        if step.shortfall >= bound:
            raise AssertionError(
                f"step {i}: token {step.token} is {step.shortfall:.3f} logits below the reference's best "
                f"{step.best} (bound {bound}); no batch shape or kernel moves a gap that far"
            )
    return sum(step.margin >= bound for step in steps)


def forced(step: Step, top_p: float, min_p: float = 0.0, bound: float = MARGIN) -> bool:
    """Whether llama.cpp's chain keeps the reference's best token alone at this step even with every other
    token's logit ``bound`` closer: top-p (before the temperature) because the best's probability stays
    at least ``top_p``, or min-p because every other logit stays more than ``-ln(min_p)`` below it."""
    if step.rival_mass * math.exp(bound) <= 1.0 / top_p - 1.0:
        return True
    return min_p > 0.0 and step.margin - bound > -math.log(min_p)


def check_forced(steps: Sequence[Step], top_p: float, min_p: float = 0.0, bound: float = MARGIN) -> int:
    """Assert that a sampled text (llama.cpp's chain: top-k, top-p, min-p, then the temperature and the
    draw) has the reference's best token wherever :func:`forced` says no draw could give another;
    returns how many steps that was."""
    count = 0
    for i, step in enumerate(steps):
        if forced(step, top_p, min_p, bound):
            count += 1
            if step.token != step.best:
                raise AssertionError(
                    f"step {i}: token {step.token} where top-p {top_p} and min-p {min_p} leave only {step.best} "
                    f"(margin {step.margin:.3f}, the others' mass {step.rival_mass:.2e} of the best's)"
                )
    return count
