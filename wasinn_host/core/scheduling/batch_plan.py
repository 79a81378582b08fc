"""What one step of a model's worker decodes: which jobs, and how many tokens of each.

Generating jobs come first (one token each, plus the draft tokens speculation finds worth their cost:
:mod:`.speculation`), then prompt chunks, within the batch's capacity; an embedding is decoded whole in
one batch or not yet (its sequence is pooled).  While guests generate, prompt chunks are cut to what
keeps the step within ``prefill-step-budget`` times the generating guests' plain step
(:mod:`.prefill_budget`), highest ``priority`` and earliest request first; otherwise prompts take the
rest of the batch in the queue's order.  The plan is in sequence-id order, so llama.cpp can run the
generating tokens in one pass.

A step with prompt chunks beside generating tokens is *split* when the worker's cost model
(:meth:`.StepCost.step_seconds`: what llama.cpp charged for each row class of pass) says two
``llama_decode`` calls cost less than one: the generating jobs first (in sequence-id order), then the
prompt chunks, and :func:`plan_step` says how many of the plan's jobs the first decode takes.

A plan of one token for each of the running jobs and nothing else (no prompt chunk, draft, embedding,
image or piece sink to watch) is the next step's plan too, as long as no job starts, ends or pauses:
:func:`carriable` says when the worker may keep it, and the worker then only writes each job's new
token and position into the batch it filled the step before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from . import prefill_budget, speculation
from .draft_budget import DecodeCost
from .slot_state import Job
from .step_cost import Entry, StepCost

Plan = list[tuple[Job, int]]
"""(job, tokens to take), in sequence-id order."""


@dataclass
class Planning:
    """What a plan depends on beside the jobs: the worker's settings, cost models and paused streams."""

    capacity: int
    """Tokens one batch holds (``n_batch``)."""
    n_ctx_seq: int
    budget: float
    """``prefill-step-budget`` (0: off)."""
    decode_cost: DecodeCost
    """What drafts cost (passes and tokens)."""
    step_cost: StepCost
    """What prompt chunks cost (passes, tokens, attended cells): the fitted model or the prior."""
    paused: Callable[[Collection[object]], int]
    """Streams between two steps, other than those of the given context states."""


def seq_of(job: Job) -> int:
    """The job's sequence id (0 before it has a slot)."""
    return job.slot.seq_id if job.slot is not None else 0


def entry(job: Job, n_tokens: int) -> Entry:
    """``(sequence id, n_tokens, cells before them)`` of the job's next decode."""
    if job.slot is None:
        return 0, n_tokens, 0
    return job.slot.seq_id, n_tokens, len(job.slot.kv)


def stream_goes_on(job: Job) -> bool:
    """A ``compute_single`` step after the stream's first: its guest is generating, even when its
    sequence went to another context and its tokens are decoded again (not cut by the step budget)."""
    return job.request.streaming and not job.request.reset_sampler


def waits_for_sink(job: Job) -> bool:
    """The job's piece sink (a Store's ``stream-stdout`` queue) has no room: it samples nothing now."""
    room = job.request.piece_room
    return room is not None and not room()


def carriable(plan: Plan, active: Sequence[Job]) -> bool:
    """Whether ``plan`` (made for the ``active`` jobs, before its batch was filled) stays the plan of every
    step until a job starts, ends or pauses: one token for each running job, each a job that samples
    one plain token after it and goes on the same way (no prompt chunk left, no draft, no embedding, no
    images to place, no piece sink that may fill)."""
    return len(plan) == len(active) and all(
        take == 1
        and job.pending == 1
        and not job.draft
        and not job.images
        and not job.request.embed
        and job.request.drafts is None
        and job.request.piece_room is None
        for job, take in plan
    )


def plan_step(active: Sequence[Job], planning: Planning) -> tuple[Plan, bool, int]:
    """The plan of one step for the ``active`` jobs, whether the step budget cut its prompt chunks, and
    how many of the plan's jobs its first ``llama_decode`` takes when the step is split (0: one decode
    of them all)."""
    jobs = sorted((j for j in active if j.pending > 0 and not waits_for_sink(j)), key=lambda j: j.pending)
    capacity = planning.capacity
    planned: Plan = []
    prompts: list[Job] = []
    used = 0  # tokens planned so far
    for job in jobs:
        if job.request.embed:  # an embedding's sequence is pooled whole: decoded in one batch or not yet
            if job.pending <= capacity - used:
                planned.append((job, job.pending))
                used += job.pending
        elif job.pending > 1 and not stream_goes_on(job):
            prompts.append(job)
        elif (take := min(job.pending, capacity - used)) > 0:
            planned.append((job, take))
            used += take
    paused = planning.paused({job.state for job in jobs}) if prompts and planning.budget > 0 else 0
    generating = any(not job.request.embed for job, _ in planned)  # an embedding samples nothing
    capped = False
    n_first = len(planned)
    if prompts and planning.budget > 0 and (generating or paused):
        capped = _plan_with_limit(planned, prompts, paused, planning)
    else:
        pending = [entry(job, job.pending) for job in prompts]
        left = capacity - sum(take for _, take in planned)
        takes = prefill_budget.prompt_takes([], pending, left, planning.step_cost, None)
        planned += [(job, take) for job, take in zip(prompts, takes) if take > 0]
        left = capacity - sum(take for _, take in planned)
        speculation.plan_drafts(planned, left, planning.n_ctx_seq, planning.decode_cost)
    first, rest = planned[:n_first], planned[n_first:]
    if first and rest and split_is_cheaper(first, rest, planning.step_cost):
        first.sort(key=lambda item: seq_of(item[0]))
        rest.sort(key=lambda item: seq_of(item[0]))
        return first + rest, capped, len(first)
    planned.sort(key=lambda item: seq_of(item[0]))
    return planned, capped, 0


def split_is_cheaper(first: Plan, rest: Plan, cost: StepCost) -> bool:
    """Whether the ``first`` jobs (generating) and the ``rest`` (prompt chunks) cost less as two decodes
    than as one, by ``cost`` (:meth:`.StepCost.step_seconds`)."""
    _, split = cost.step_seconds(
        [entry(job, take + len(job.draft)) for job, take in first], [entry(job, take) for job, take in rest]
    )
    return split


def _plan_with_limit(planned: Plan, prompts: list[Job], paused: int, planning: Planning) -> bool:
    """Add the drafts of the generating jobs to ``planned``, then the prompt chunks that keep the step
    within the budget, highest priority and earliest request first; True if the budget cut them."""
    # each prompt may finish in this step and ask for a logits row: the drafts leave room for those
    # rows (a batch may ask for at most the context's n_outputs_max rows)
    left = planning.capacity - sum(take for _, take in planned) - len(prompts)
    speculation.plan_drafts(planned, left, planning.n_ctx_seq, planning.decode_cost)
    base = sorted(entry(job, take + len(job.draft)) for job, take in planned)
    plain = sorted(  # a stream re-decoding: 1; an embedding decoded beside them is not their step
        entry(job, 1 + len(job.draft)) for job, _ in planned if not job.request.embed
    )
    cost = planning.step_cost
    limit = prefill_budget.step_limit(plain, paused, cost, planning.budget, len(prompts))
    prompts.sort(key=lambda j: (-j.request.priority, j.order))
    capacity = planning.capacity - sum(n for _, n, _ in base)
    pending = [entry(job, job.pending) for job in prompts]
    takes = prefill_budget.prompt_takes(base, pending, capacity, cost, limit)
    planned += [(job, take) for job, take in zip(prompts, takes) if take > 0]
    return sum(takes) < min(sum(n for _, n, _ in pending), capacity)
