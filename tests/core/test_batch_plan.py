"""A step's plan (core/scheduling/batch_plan.py): generating tokens first, prompt chunks within the step budget,
smaller as a prompt's tokens attend more cells, in sequence-id order; split into two decodes where the cost
model learned that a chunk beside the streams costs more than apart."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from wasinn_host.core.config.params import SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest
from wasinn_host.core.scheduling.batch_plan import Planning, carriable, plan_step
from wasinn_host.core.scheduling.draft_budget import DecodeCost
from wasinn_host.core.scheduling.slot_state import ContextState, Job, Slot
from wasinn_host.core.scheduling.step_cost import Entry, StepCost
from wasinn_host.testing.step_costs import even, flash_cpu, learned

pytestmark = pytest.mark.fast


def fitted(fixed: float, per_token: float, per_cell: float) -> StepCost:
    cost = StepCost()
    for n, n_passes, cells in ((1, 1, 10), (8, 1, 40), (16, 2, 900), (40, 3, 300), (4, 2, 4000)):
        cost.record(n, n_passes, cells, fixed * n_passes + per_token * n + per_cell * cells)
    return cost


ATTENDING = fitted(0.004, 0.001, 0.000001)


def job(seq_id: int, held: int, tokens: int, *, streaming: bool = False, order: int = 0) -> Job:
    """A job on sequence ``seq_id`` whose KV holds its first ``held`` of ``tokens`` tokens."""
    request = GenerationRequest(tuple(range(tokens)), 1, SamplingParams(temp=0.0), StopParams(), streaming=streaming)
    made = Job(request, ContextState(), tokens=list(range(tokens)), order=order)
    made.slot = Slot(seq_id, kv=list(range(held)))
    return made


def planning(budget: float, cost: StepCost = ATTENDING, paused: int = 0) -> Planning:
    def count(running: Collection[object]) -> int:
        return paused

    return Planning(512, 4096, budget, DecodeCost(), cost, count)


def streams() -> list[Job]:
    """Seven streams at their 100th token, each with its next token to decode."""
    return [job(seq, 100, 101, streaming=True) for seq in range(7)]


ENTRIES: list[Entry] = [(seq, 1, 100) for seq in range(7)]
"""The streams' plain step."""


def prompt_take(plan: list[tuple[Job, int]], seq_id: int) -> int:
    return next(take for j, take in plan if j.slot is not None and j.slot.seq_id == seq_id)


def test_streams_first_then_a_prompt_chunk_in_sequence_order() -> None:
    plan, capped, _ = plan_step([job(7, 0, 2300), *streams()], planning(8.0))
    assert [j.slot.seq_id for j, _ in plan if j.slot] == list(range(8))
    assert [take for _, take in plan[:7]] == [1] * 7
    assert 0 < prompt_take(plan, 7) < 505 and capped


def test_a_chunk_deep_in_a_long_prompt_is_smaller() -> None:
    early, _, _ = plan_step([job(7, 0, 2300), *streams()], planning(8.0))
    late, _, _ = plan_step([job(7, 2000, 2300), *streams()], planning(8.0))
    assert 0 < prompt_take(late, 7) < prompt_take(early, 7)


def test_without_generating_guests_a_prompt_takes_the_whole_batch() -> None:
    plan, capped, _ = plan_step([job(7, 1000, 2300)], planning(8.0))
    assert plan[0][1] == 512 and not capped


def test_a_paused_stream_keeps_the_budget_on() -> None:
    plan, capped, _ = plan_step([job(7, 0, 2300)], planning(8.0, paused=1))
    assert 0 < plan[0][1] < 512 and capped


def test_with_the_budget_off_the_prompt_takes_the_rest_of_the_batch() -> None:
    plan, capped, _ = plan_step([job(7, 1000, 2300), *streams()], planning(0.0))
    assert prompt_take(plan, 7) == 512 - 7 and not capped


def test_a_plan_of_one_token_per_running_job_is_carried() -> None:
    generating = [job(0, 9, 10), job(1, 4, 5), job(2, 6, 7)]
    plan, _, _ = plan_step(generating, planning(8.0))
    assert carriable(plan, generating)
    assert not carriable(plan, [*generating, job(3, 0, 4)]), "a job the plan leaves out"
    prompting = [*generating, job(3, 2, 40)]
    plan, _, _ = plan_step(prompting, planning(8.0))
    assert not carriable(plan, prompting), "a prompt chunk changes from step to step"
    drafting = [job(0, 9, 10)]
    drafting[0].draft = [3, 4]
    assert not carriable([(drafting[0], 1)], drafting), "drafts are chosen step by step"


def test_a_chunk_is_not_cut_into_a_costly_row_class() -> None:
    """A cost model that learned a CPU's flash attention (a cell attended in a pass of 2-63 rows per
    sequence costs 5x): a chunk deep in the prompt is of 64 rows or more when such a chunk fits the
    budget (the largest that fits), not 63 or fewer, which would cost several times as much."""
    cost = learned(flash_cpu)
    plan, capped, n_first = plan_step([job(7, 2000, 2300), *streams()], planning(20.0, cost))
    take = prompt_take(plan, 7)
    assert 64 < take < 128 and capped and n_first == 0, take
    assert cost.decode_seconds([*ENTRIES, (7, take, 2000)]) <= 20.0 * cost.decode_seconds(ENTRIES) * (1 + 1e-9)
    assert cost.decode_seconds([*ENTRIES, (7, 63, 2000)]) > 20.0 * cost.decode_seconds(ENTRIES)


def test_where_a_chunk_beside_streams_costs_more_than_apart_the_step_is_split() -> None:
    """The same cost model, and a budget that lets exactly 64 tokens through: together, the chunk's first
    token would ride in the streams' pass and its other 63 run in the costly class, so the step is two
    decodes, the streams' tokens and then the chunk."""
    cost = learned(flash_cpu)
    plan, capped, n_first = plan_step([job(7, 2000, 2300), *streams()], planning(18.0, cost))
    assert n_first == 7 and capped
    assert [j.slot.seq_id for j, _ in plan if j.slot] == list(range(8))  # the streams, then the prompt
    assert prompt_take(plan, 7) == 64
    seconds, split = cost.step_seconds(ENTRIES, [(7, 64, 2000)])
    assert split and seconds == cost.decode_seconds(ENTRIES) + cost.decode_seconds([(7, 64, 2000)])
    assert seconds * 3 < cost.decode_seconds([*ENTRIES, (7, 64, 2000)])


def test_where_every_shape_costs_alike_the_step_is_one_decode() -> None:
    cost = learned(even)
    for held in (0, 1000, 2000):
        plan, _, n_first = plan_step([job(7, held, 2300), *streams()], planning(20.0, cost))
        assert n_first == 0 and 0 < prompt_take(plan, 7), held
