"""Synthetic decode costs for tests of the step cost model (:mod:`wasinn_host.core.scheduling.step_cost`).

Two machines as the worker's clock would see them, each a function of a decode's passes
(:func:`~wasinn_host.core.scheduling.step_cost.pass_shapes`): :func:`flash_cpu`, a CPU with flash
attention (a cell attended in a pass of 2-63 rows per sequence, ggml's scalar loop, costs 5x), and
:func:`even`, a device where every pass costs alike.  :func:`learned` feeds one of them to a fresh
:class:`~wasinn_host.core.scheduling.step_cost.StepCost` as a server under mixed load would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.scheduling.step_cost import Entry, Pass, StepCost, pass_shapes, row_class

FIXED, PER_TOKEN, PER_CELL = 0.004, 0.001, 1e-6
"""Seconds a pass, a token and an attended cell cost (a small model on a CPU)."""
SCALAR = range(1, 6)
"""Row classes 2-63: on a CPU with flash attention, ggml's scalar loop over every attended cell."""
SEVEN_STREAMS: list[Entry] = [(seq, 1, 100) for seq in range(7)]
"""Seven generating sequences at position 100, one token each."""


def flash_cpu(shapes: Sequence[Pass]) -> float:
    """A decode's seconds on a CPU with flash attention: a cell attended in a pass of 2-63 rows per
    sequence costs 5x."""
    return sum(
        FIXED + PER_TOKEN * tokens + PER_CELL * cells * (5.0 if row_class(rows) in SCALAR else 1.0)
        for rows, tokens, cells in shapes
    )


def even(shapes: Sequence[Pass]) -> float:
    """A decode's seconds where every pass costs what a pass, its tokens and their cells cost."""
    return sum(FIXED + PER_TOKEN * tokens + PER_CELL * cells for _, tokens, cells in shapes)


def learned(charge: Callable[[Sequence[Pass]], float]) -> StepCost:
    """A cost model fed the decodes of a server under mixed load, each charged by ``charge``: plain steps
    of seven streams, and steps of the streams with a prompt chunk of each size class, the prompt at
    positions from 0 to 2,500."""
    cost = StepCost()
    for round_ in range(6):
        for chunk in (1, 3, 6, 12, 24, 48, 63, 64, 100, 200):
            for entries in (SEVEN_STREAMS, [*SEVEN_STREAMS, (7, chunk, 500 * round_)]):
                shapes = pass_shapes(entries)
                cost.record_passes(shapes, charge(shapes))
    return cost
