"""The step cost model of chunked prefill (core/scheduling/step_cost.py): passes, tokens and attended KV cells."""

from __future__ import annotations

import pytest

from wasinn_host.core.scheduling.step_cost import FIT_MAX_TOKENS, StepCost, attended, batch_cells

pytestmark = pytest.mark.fast


def test_attended_cells_count_each_token_and_the_cells_before_it() -> None:
    assert attended(1, 0) == 1
    assert attended(1, 99) == 100  # a decode token at position 99 attends cells 0..99
    assert attended(3, 10) == 11 + 12 + 13
    assert batch_cells([(0, 1, 99), (1, 3, 10)]) == 100 + 36


def test_before_any_decode_a_token_costs_a_pass_and_cells_nothing() -> None:
    assert StepCost().fit() == (1.0, 1.0, 0.0)
    assert StepCost().seconds(7, 2, 5000) == 9.0


def test_the_fit_recovers_all_three_terms() -> None:
    cost = StepCost()
    for n, n_passes, cells in ((7, 1, 700), (86, 2, 40_000), (86, 2, 180_000), (40, 2, 90_000), (7, 1, 1400)):
        cost.record(n, n_passes, cells, 0.006 * n_passes + 0.001 * n + 1.5e-6 * cells)
    assert cost.fit() == pytest.approx((0.006, 0.001, 1.5e-6))
    assert cost.seconds(50, 2, 100_000) == pytest.approx(0.012 + 0.05 + 0.15)


def test_cells_that_the_decodes_cannot_tell_from_tokens_are_left_out() -> None:
    cost = StepCost()
    for n, n_passes in ((1, 1), (8, 1), (16, 2), (4, 2)):  # every token attends 10 cells: cells = 10 * n
        cost.record(n, n_passes, 10 * n, 0.004 * n_passes + 0.002 * n)
    assert cost.fit() == pytest.approx((0.004, 0.002, 0.0))


def test_cells_that_seem_to_save_time_are_noise_and_left_out() -> None:
    cost = StepCost()
    for n, n_passes, cells, extra in ((1, 1, 10, 0.0), (8, 1, 5000, -0.003), (16, 2, 40, 0.0), (4, 2, 3000, -0.002)):
        cost.record(n, n_passes, cells, 0.004 * n_passes + 0.001 * n + extra)
    fixed, per_token, per_cell = cost.fit()
    assert per_cell == 0.0 and fixed > 0 and per_token >= 0


def test_large_prompt_chunks_are_not_fitted() -> None:
    cost = StepCost()
    for n, n_passes, cells in ((1, 1, 10), (8, 1, 40), (16, 2, 900), (40, 3, 300)):
        cost.record(n, n_passes, cells, 0.004 * n_passes + 0.001 * n)
    cost.record(FIT_MAX_TOKENS + 1, 1, 100_000, 0.01)  # faster per token: it would make small chunks look cheap
    assert cost.fit() == pytest.approx((0.004, 0.001, 0.0), abs=1e-12)


def test_the_fit_follows_a_slower_machine() -> None:
    cost = StepCost()
    shapes = ((1, 1, 10), (8, 1, 40), (16, 2, 900), (40, 3, 300), (4, 2, 4000))
    for n, n_passes, cells in shapes:
        cost.record(n, n_passes, cells, 0.004 * n_passes + 0.001 * n)
    for _ in range(60):  # the machine became twice as slow: the old decodes fade out
        for n, n_passes, cells in shapes:
            cost.record(n, n_passes, cells, 2 * (0.004 * n_passes + 0.001 * n))
    assert cost.fit() == pytest.approx((0.008, 0.002, 0.0), rel=0.01, abs=1e-9)
