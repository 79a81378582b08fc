"""Speculative decoding in the worker: which jobs add prompt-lookup drafts to a batch and how long,
and verifying a decoded draft token by token against what the sampler chooses.

Functions over the scheduler's slot state (:mod:`.slot_state`); the worker passes in its sampling and
stop rules as callables, so every kept token is the sampler's own choice.
"""

from __future__ import annotations

from collections.abc import Callable

from ..generation import StopReason
from ..runtime import Context
from .draft_budget import (
    DecodeCost,
    Offer,
    backoff,
    choose_drafts,
    recovered_acceptance,
    updated_acceptance,
)
from .ngram_drafts import NgramDrafter, match_acceptance
from .slot_state import Job

MAX_SPECULATIVE_BATCH = 24
"""Draft tokens are added to a batch up to this many tokens in all (a lone context's draft fits whole).
Measured on 2 cores with eight Gemma 3 guests, 40 did no better (1.03-1.04x of plain against
1.04-1.07x)."""


def plan_drafts(planned: list[tuple[Job, int]], budget: int, n_ctx_seq: int, cost: DecodeCost) -> None:
    """Set ``draft`` of each job with speculation on that samples after this batch (``planned``: job,
    tokens it takes; ``budget``: batch tokens left): the drafts :func:`~.draft_budget.choose_drafts`
    finds worth their cost, within the batch, the context and ``n-predict``."""
    sampling = [job for job, take in planned if take == job.pending and not job.request.embed]
    offers: dict[int, tuple[Job, list[int]]] = {}
    budget_offers: list[Offer] = []
    for job in sampling:
        settings, request, slot = job.request.drafts, job.request, job.slot
        if settings is None or request.streaming or slot is None:
            continue
        room = min(
            settings.n_max,
            settings.ngram_m,
            n_ctx_seq - len(job.tokens),  # accepted tokens never need a context shift
            request.limit - len(job.result.generated) - 1,
        )
        if job.drafter is None:
            after_images = max((span.start + span.n_tokens for span in job.images.values()), default=0)
            job.drafter = NgramDrafter(settings.ngram_n, after_images)
        draft, matched = job.drafter.draft(job.tokens, room)
        if not draft:
            continue
        if job.skip > 0:
            job.skip -= 1
            continue
        chance = min(job.acceptance, match_acceptance(matched))
        offers[slot.seq_id] = (job, draft)
        budget_offers.append(Offer(slot.seq_id, chance, len(draft), settings.p_min, settings.n_min))
    if not offers:
        return
    base = sorted((job.slot.seq_id, take) for job, take in planned if job.slot is not None)
    budget = min(budget, MAX_SPECULATIVE_BATCH - sum(take for _, take in base))  # where the cost fit holds
    lengths = choose_drafts(base, budget_offers, len(sampling), cost, budget)
    for seq_id, (job, draft) in offers.items():
        if seq_id in lengths:
            job.draft = draft[: lengths[seq_id]]
        else:
            job.acceptance = recovered_acceptance(job.acceptance)


def drop_cells(context: Context, job: Job, keep: int) -> None:
    """Drop the slot's cells after the first ``keep`` (draft tokens not kept)."""
    slot = job.slot
    assert slot is not None
    if len(slot.kv) > keep:
        context.seq_rm(slot.seq_id, job.position(keep))
        del slot.kv[keep:]


SampleToken = Callable[[Job], tuple[int, bytes]]
StopRule = Callable[[Job, int, bytes], "StopReason | None"]
Finish = Callable[[Job, StopReason], None]


def verify_draft(
    context: Context, job: Job, sample_token: SampleToken, stop_rule: StopRule, finish: Finish
) -> tuple[int, int]:
    """Sample at the last pending token and at each draft token in turn while the draft matches the
    sampled tokens, applying the stop rules to each; drop the cells of the draft tokens not kept.
    Returns (draft tokens, accepted tokens) and updates the job's acceptance and back-off."""
    draft, indices, slot = job.draft, job.draft_indices, job.slot
    assert slot is not None
    job.draft, job.draft_indices = [], []
    base = len(slot.kv) - len(draft)  # cells up to the last pending token
    accepted = 0
    for i, index in enumerate(indices):
        job.logits_index = index
        token, piece = sample_token(job)
        matched = i < len(draft) and token == draft[i]
        accepted += matched
        if not matched:  # before the stop rules: a context shift sees the kept cells only
            drop_cells(context, job, base + accepted)
        stop = stop_rule(job, token, piece)
        if stop is not None:
            drop_cells(context, job, base + accepted)
            finish(job, stop)
            break
        job.tokens.append(token)
        if not matched:
            break
    job.acceptance = updated_acceptance(job.acceptance, len(draft), accepted)
    job.misses = 0 if accepted else job.misses + 1
    job.skip = backoff(job.misses)
    job.result.drafted_tokens += len(draft)
    job.result.accepted_tokens += accepted
    return len(draft), accepted
