"""Chunked prefill's planning (core/scheduling/prefill_budget.py): the step limit, prompt chunks within it,
paused streams."""

from __future__ import annotations

import pytest

from wasinn_host.core.scheduling import prefill_budget
from wasinn_host.core.scheduling.draft_budget import passes
from wasinn_host.core.scheduling.prefill_budget import (
    MIN_PROMPT_TOKENS,
    OVER_LIMIT,
    PausedStreams,
    prompt_takes,
    step_limit,
)
from wasinn_host.core.scheduling.step_cost import Entry, StepCost, batch_cells, pass_shapes, row_class

pytestmark = pytest.mark.fast

SEVEN: list[Entry] = [(seq, 1, 0) for seq in range(7)]
"""Seven generating sequences, one token each, at the start of their sequences."""
SEVEN_LATE: list[Entry] = [(seq, 1, 100) for seq in range(7)]
"""The same at position 100."""


def fitted(fixed: float, per_token: float, per_cell: float = 0.0) -> StepCost:
    """A cost model fitted to decodes that cost exactly ``fixed * passes + per_token * n + per_cell * cells``."""
    cost = StepCost()
    for n, n_passes, cells in ((1, 1, 10), (8, 1, 40), (16, 2, 900), (40, 3, 300), (4, 2, 4000)):
        cost.record(n, n_passes, cells, fixed * n_passes + per_token * n + per_cell * cells)
    assert cost.fit() == pytest.approx((fixed, per_token, per_cell), abs=1e-12)
    return cost


def step_cost(entries: list[Entry], cost: StepCost) -> float:
    ordered = sorted(entries)
    return cost.seconds(sum(n for _, n, _ in ordered), passes([(s, n) for s, n, _ in ordered]), batch_cells(ordered))


CPU = fitted(0.004, 0.001)
"""A pass over the weights costs four tokens' compute (a small model on a CPU)."""
GPU = fitted(0.006, 0.00001)
"""A token is nearly free beside the pass."""
ATTENDING = fitted(0.004, 0.001, 0.000001)
"""As CPU, and each token costs a microsecond per cell it attends."""


def test_no_limit_when_off_or_nobody_generates() -> None:
    assert step_limit(SEVEN, 0, CPU, 0.0) is None
    assert step_limit([], 0, CPU, 3.0) is None


def test_the_limit_is_a_multiple_of_the_plain_step_including_paused_streams() -> None:
    assert step_limit(SEVEN, 0, CPU, 3.0) == pytest.approx(3 * (0.004 + 7 * 0.001))
    assert step_limit(SEVEN[:4], 3, CPU, 3.0) == pytest.approx(3 * (0.004 + 7 * 0.001))
    assert step_limit([(0, 1, 0), (3, 1, 0)], 0, CPU, 2.0) == pytest.approx(2 * (2 * 0.004 + 2 * 0.001))


def test_no_limit_when_more_guests_wait_for_their_prompts_than_generate() -> None:
    assert step_limit([(0, 1, 0)], 0, CPU, 3.0, prompts=1) == step_limit([(0, 1, 0)], 0, CPU, 3.0)
    assert step_limit([(0, 1, 0)], 0, CPU, 3.0, prompts=2) is None  # a leader and followers of a shared prefix
    assert step_limit([(0, 1, 0)], 1, CPU, 3.0, prompts=2) is not None  # a paused stream counts as generating
    assert step_limit(SEVEN, 0, CPU, 3.0, prompts=7) is not None


def test_a_prompt_beside_generating_sequences_takes_what_the_limit_allows() -> None:
    limit = step_limit(SEVEN, 0, CPU, 3.0)
    assert limit is not None
    (take,) = prompt_takes(SEVEN, [(7, 2300, 0)], 505, CPU, limit)
    # 7 + take tokens in two passes (the prompt's chunk after the first token is a pass of its own)
    assert take == 18 and step_cost([*SEVEN, (7, take + 1, 0)], CPU) > limit


def test_a_gpu_like_cost_lets_the_whole_batch_through() -> None:
    limit = step_limit(SEVEN, 0, GPU, 3.0)
    assert prompt_takes(SEVEN, [(7, 2300, 0)], 505, GPU, limit) == [505]


def test_without_a_limit_prompts_take_the_batch_in_order() -> None:
    assert prompt_takes([], [(0, 2300, 0)], 512, CPU, None) == [512]
    assert prompt_takes(SEVEN, [(7, 30, 0), (8, 600, 0)], 505, CPU, None) == [30, 475]


def test_prompts_share_the_limit_in_the_order_given() -> None:
    limit = step_limit(SEVEN, 0, CPU, 4.0)
    first, second = prompt_takes(SEVEN, [(7, 10, 0), (8, 300, 0)], 505, CPU, limit)
    assert first == 10 and second > 0
    assert step_cost([*SEVEN, (7, first, 0), (8, second, 0)], CPU) <= limit * (1 + 1e-9)  # type: ignore[operator]
    assert step_cost([*SEVEN, (7, first, 0), (8, second + 1, 0)], CPU) > limit  # type: ignore[operator]


def test_the_first_prompt_always_progresses() -> None:
    tight = step_limit(SEVEN, 0, CPU, 1.0)
    assert prompt_takes(SEVEN, [(7, 300, 0), (8, 300, 0)], 505, CPU, tight) == [MIN_PROMPT_TOKENS, 0]


def test_a_chunk_late_in_a_long_prompt_is_smaller_when_attended_cells_cost() -> None:
    streams: list[Entry] = [(seq, 1, 100) for seq in range(7)]
    limit = step_limit(streams, 0, ATTENDING, 8.0)
    assert limit is not None
    early, late = (prompt_takes(streams, [(7, 2300, start)], 505, ATTENDING, limit)[0] for start in (0, 2000))
    assert 0 < late < early
    for start, take in ((0, early), (2000, late)):  # each the most that keeps the step within the limit
        assert step_cost([*streams, (7, take, start)], ATTENDING) <= limit * (1 + 1e-9)
        assert step_cost([*streams, (7, take + 1, start)], ATTENDING) > limit
    # without the cells' cost the late chunk would be as large as the early one
    cpu_limit = step_limit(streams, 0, CPU, 8.0)
    assert prompt_takes(streams, [(7, 2300, 2000)], 505, CPU, cpu_limit) == prompt_takes(
        streams, [(7, 2300, 0)], 505, CPU, cpu_limit
    )


def test_paused_streams_count_as_one_token_each_at_the_generating_streams_mean_position() -> None:
    streams: list[Entry] = [(0, 1, 100), (1, 1, 300)]
    assert step_limit(streams, 2, ATTENDING, 1.0) == pytest.approx(0.004 + 4 * 0.001 + 0.000001 * (101 + 301 + 2 * 201))


def test_paused_streams_count_within_the_window_until_they_end() -> None:
    paused = PausedStreams(window_s=0.5)
    a, b, c = object(), object(), object()
    paused.stepped(a, 10.0, goes_on=True)
    paused.stepped(b, 10.2, goes_on=True)
    paused.stepped(c, 10.2, goes_on=True)
    paused.stepped(c, 10.3, goes_on=False)  # its stream ended
    assert paused.count(10.4, running=()) == 2
    assert paused.count(10.4, running={a}) == 1  # its next step is in the worker: counted as generating there
    assert paused.count(10.6, running=()) == 1  # a paused longer than the window: no longer generating
    assert paused.count(11.0, running=()) == 0


def test_a_stream_that_lost_its_sequence_is_a_prompt_again() -> None:
    paused = PausedStreams()
    a, b = object(), object()
    paused.stepped(a, 10.0, goes_on=True)
    paused.stepped(b, 10.0, goes_on=True)
    paused.lost_sequence(a)  # its next step re-decodes its tokens
    assert paused.count(10.1, running=()) == 1


def test_steps_wait_for_paused_streams_about_their_round_trip_and_not_for_late_ones() -> None:
    paused = PausedStreams()
    a, b = object(), object()
    assert paused.hold_s() == 0.0  # no round trip seen yet
    for t in (1.0, 2.0, 3.0):
        paused.stepped(a, t, goes_on=True)
        paused.arrived(a, t + 0.002)
    assert paused.hold_s() == pytest.approx(0.004)
    paused.stepped(a, 4.0, goes_on=True)
    paused.stepped(b, 4.0, goes_on=True)
    assert paused.awaited(4.001, here=(b,)) == [a]
    paused.late([a])  # it did not come back within a wait
    assert paused.awaited(4.002, here=()) == [b] and paused.count(4.002, running=()) == 2
    paused.stepped(a, 5.0, goes_on=True)  # its next token: waited for again
    assert a in paused.awaited(5.001, here=())


def weights_bound(shapes: list[tuple[int, int, int]], scalar: float = 10.0) -> float:
    """A CPU decode whose pass reads the weights (25 ms) and where a cell attended in a pass of 2-63 rows
    a sequence (flash attention's scalar loop) costs ``scalar`` times one in a pass of 1 row or of 64 and
    more (10: as on an Intel Xeon with AMX; 3: as on an AMD EPYC with AVX2)."""
    return sum(
        0.025 + 0.0005 * tokens + 0.5e-6 * cells * (scalar if 1 <= row_class(rows) <= 5 else 1.0)
        for rows, tokens, cells in shapes
    )


def late_prompt_takes(scalar: float, position: int) -> tuple[int, float, float]:
    """The take of a long prompt at ``position`` beside seven streams (budget 8) on a CPU whose scalar
    loop costs ``scalar`` times (:func:`weights_bound`), the cost model fed a server's mixed load; with
    the step's estimate and the limit."""
    cost = StepCost()
    for round_ in range(6):
        for chunk in (1, 3, 6, 12, 24, 48, 63, 64, 100, 200):
            for entries in (SEVEN_LATE, [*SEVEN_LATE, (7, chunk, 1000 * round_)]):
                cost.record_passes(pass_shapes(entries), weights_bound(pass_shapes(entries), scalar))
    limit = step_limit(SEVEN_LATE, 0, cost, 8.0)
    assert limit is not None
    (take,) = prompt_takes(SEVEN_LATE, [(7, 9000, position)], 505, cost, limit)
    return take, cost.step_seconds(SEVEN_LATE, [(7, take, position)])[0], limit


def test_late_in_a_long_prompt_a_chunk_of_the_cheap_class_goes_a_little_over_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where 64 rows no longer fit the limit, the chunks within it run through the scalar class at a tenth
    of the rate: the smallest take of the cheap class is made instead, at most OVER_LIMIT over."""
    cost = StepCost()
    for round_ in range(6):
        for chunk in (1, 3, 6, 12, 24, 48, 63, 64, 100, 200):
            for entries in (SEVEN_LATE, [*SEVEN_LATE, (7, chunk, 1000 * round_)]):
                cost.record_passes(pass_shapes(entries), weights_bound(pass_shapes(entries)))
    limit = step_limit(SEVEN_LATE, 0, cost, 8.0)
    assert limit is not None
    (early,) = prompt_takes(SEVEN_LATE, [(7, 9000, 2000)], 505, cost, limit)
    assert early >= 64 and cost.step_seconds(SEVEN_LATE, [(7, early, 2000)])[0] <= limit * (1 + 1e-9)
    (late,) = prompt_takes(SEVEN_LATE, [(7, 9000, 5000)], 505, cost, limit)
    assert late in (64, 65)
    assert limit < cost.step_seconds(SEVEN_LATE, [(7, late, 5000)])[0] <= (1 + OVER_LIMIT) * limit
    monkeypatch.setattr(prefill_budget, "CHEAPER_CLASS", 1e9)  # without the rule: what fits the limit
    (within,) = prompt_takes(SEVEN_LATE, [(7, 9000, 5000)], 505, cost, limit)
    assert within < 64 and cost.step_seconds(SEVEN_LATE, [(7, within, 5000)])[0] <= limit * (1 + 1e-9)


def test_a_class_three_times_cheaper_a_token_is_taken_over_the_limit_too() -> None:
    """Where the scalar loop costs 3x a cell (an AMD EPYC with AVX2: at position 2,000, 16 prompt rows
    176 ms, 64 rows 209 ms), 64 rows cost the prompt a third as much a token as the chunks within the
    limit, and are taken up to OVER_LIMIT over it (in the mixed-load benchmark on such a machine, chunks
    of 7-15 rows otherwise carried the last thousand tokens of the prompt: llama.cpp's time 1.9-2.4x the
    same tokens decoded apart, the streams' median gap 4x theirs alone); where even 64 rows go beyond
    that, the chunks are what fits the limit."""
    take, seconds, limit = late_prompt_takes(scalar=3.0, position=7000)
    assert take in (64, 65) and limit < seconds <= (1 + OVER_LIMIT) * limit
    take, seconds, limit = late_prompt_takes(scalar=3.0, position=9000)
    assert take < 64 and seconds <= limit * (1 + 1e-9)


def test_a_take_just_under_a_class_no_decode_priced_tries_that_class() -> None:
    """Chunks of up to 63 rows priced, none of 64 or more: a take of 60 within the limit becomes 65 (one
    over 64, so its pass is of that class beside the streams), at most OVER_LIMIT over, so the next steps
    know what 64 rows cost; a take far below the edge stays; once 64 rows are priced, the planner chooses
    by their price (here a chunk of that class within the limit: its cells cost a tenth)."""
    cost = StepCost()
    for round_ in range(6):
        for chunk in (1, 3, 6, 12, 24, 48, 63):
            for entries in (SEVEN_LATE, [*SEVEN_LATE, (7, chunk, 100 * round_)]):
                cost.record_passes(pass_shapes(entries), weights_bound(pass_shapes(entries)))
    assert cost.classed_fit() is not None and cost.knows(63) and not cost.knows(64)

    def take_within(rows: int) -> tuple[int, float]:
        limit = cost.step_seconds(SEVEN_LATE, [(7, rows, 300)])[0]
        return prompt_takes(SEVEN_LATE, [(7, 2000, 300)], 505, cost, limit)[0], limit

    tried, limit = take_within(60)
    assert tried == 65 and cost.step_seconds(SEVEN_LATE, [(7, tried, 300)])[0] <= (1 + OVER_LIMIT) * limit
    assert take_within(20)[0] == 20
    for entries in (SEVEN_LATE, [*SEVEN_LATE, (7, 65, 300)]):
        for _ in range(4):
            cost.record_passes(pass_shapes(entries), weights_bound(pass_shapes(entries)))
    again, limit = take_within(60)
    assert cost.knows(64) and again >= 64
    assert cost.step_seconds(SEVEN_LATE, [(7, again, 300)])[0] <= limit * (1 + 1e-9)
