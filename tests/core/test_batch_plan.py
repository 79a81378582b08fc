"""A step's plan (core/scheduling/batch_plan.py): generating tokens first, prompt chunks within the step budget,
smaller as a prompt's tokens attend more cells, in sequence-id order."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from wasinn_host.core.config.params import SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest
from wasinn_host.core.scheduling.batch_plan import Planning, carriable, plan_step
from wasinn_host.core.scheduling.draft_budget import DecodeCost
from wasinn_host.core.scheduling.slot_state import ContextState, Job, Slot
from wasinn_host.core.scheduling.step_cost import StepCost

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
