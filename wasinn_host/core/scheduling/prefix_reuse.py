"""KV prefix reuse: which cells of a sequence a job keeps, which other sequence it copies from, and
whether it waits for a running job that is decoding a prefix they share.

Pure functions over the scheduler's slot state (:mod:`.slot_state`); the worker applies their answers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ..runtime import Context
from ..tokens import common_prefix, may_share
from .slot_state import Job, Slot

MIN_SHARED_PREFIX = 32
"""Prompt tokens another sequence must hold beyond a job's own before they are copied (or waited for)
instead of decoded: a copy moves the whole sequence's cache."""


def reusable(job: Job, slot: Slot) -> int:
    """Cells of ``slot`` the job can keep: the prefix shared with its tokens, less the last token."""
    request = job.request
    keep = common_prefix(slot.kv, job.tokens) if request.cache_prompt and not request.embed else 0
    keep = min(keep, len(job.tokens) - 1)
    for span in job.images.values():  # never keep part of an image: it is decoded whole
        if span.start < keep < span.start + span.n_tokens or (request.regenerate_images and span.start < keep):
            keep = span.start
    return keep


def trim_kv(context: Context, job: Job, slot: Slot) -> int:
    """Drop the slot's cells after the prefix shared with the job; return how many are kept."""
    keep = reusable(job, slot)
    if keep < len(slot.kv):
        context.seq_rm(slot.seq_id, job.position(keep))  # the kept prefix is the job's own
        del slot.kv[keep:]
    return keep


def donor(
    slots: Iterable[Slot], job: Job, slot: Slot, have: int, copy_targets: Collection[int]
) -> tuple[Slot | None, int]:
    """The sequence other than ``slot`` (and not a copy's target) holding the longest usable prefix of
    the job's tokens, longer than ``have``, and that prefix's length (``None, have`` if there is none)."""
    best: Slot | None = None
    best_len = have
    tokens = job.tokens
    for other in slots:
        if other is slot or not may_share(other.kv, tokens, best_len + 1) or other.seq_id in copy_targets:
            continue
        shared = reusable(job, other)
        if shared > best_len:
            best, best_len = other, shared
    return best, best_len


def copy_source(slots: Iterable[Slot], job: Job, slot: Slot, copy_targets: Collection[int]) -> tuple[Slot, int] | None:
    """The sequence to copy the job's prefix from and the prefix's length, if another sequence holds
    :data:`MIN_SHARED_PREFIX` more of it than ``slot`` does; None to decode it."""
    if len(job.tokens) - 1 - len(slot.kv) < MIN_SHARED_PREFIX:  # the slot holds (nearly) all it can use
        return None
    source, shared = donor(slots, job, slot, len(slot.kv) + MIN_SHARED_PREFIX - 1, copy_targets)
    if source is None or shared - len(slot.kv) < MIN_SHARED_PREFIX:
        return None
    return source, shared


def follows(
    job: Job, slot: Slot, slots: Iterable[Slot], active: Collection[Job], copy_targets: Collection[int]
) -> bool:
    """Whether the job waits for a running job that is decoding a prefix they share (by
    :data:`MIN_SHARED_PREFIX` more than any sequence holds now): it then copies that prefix instead of
    decoding it a second time beside it.  Records the leader in ``job.follows`` while it waits."""
    request = job.request
    if not request.cache_prompt or request.embed:
        return False
    if job.follows is None:
        own = reusable(job, slot)
        if len(job.tokens) - 1 - own < MIN_SHARED_PREFIX:  # no leader could give that much more: no scan
            return False
        tokens = job.tokens
        # a leader shares MIN_SHARED_PREFIX more than the slot's own prefix (and than any other sequence
        # holds: the scan of the sequences is made only when some running job may lead)
        need = own + MIN_SHARED_PREFIX
        ahead = [other for other in active if may_share(other.tokens, tokens, need)]
        if not ahead:
            return False
        held = donor(slots, job, slot, own, copy_targets)[1]
        leader, shared = None, 0
        for other in ahead:
            if other.slot is None or other.request.embed:
                continue
            common = min(common_prefix(other.tokens, tokens), len(tokens) - 1)
            if common > shared and common - held >= MIN_SHARED_PREFIX and len(other.slot.kv) < common:
                leader, shared = other, common
        if leader is None:
            return False
        job.follows = (leader, shared)
    leader, shared = job.follows
    if leader in active and leader.slot is not None and len(leader.slot.kv) < shared:
        return True
    job.follows = None  # decoded (or ended): start, copying what is there
    return False
