"""The worker's use of the on-disk prompt cache: read an entry before a job is queued, restore it
into the job's sequence when it starts, save the prompt's state once it is decoded.

Pure functions over a :class:`~wasinn_host.core.prompt_cache.cache.ModelPromptCache` (None when the host keeps none) and
the scheduler's slot state.
"""

from __future__ import annotations

from ..prompt_cache.cache import ModelPromptCache, log_ignored_name
from ..runtime import Context
from ..tokens import common_prefix
from .slot_state import Job, Slot


def cacheable(job: Job) -> int:
    """Tokens of the job a cached prefix may cover: all but the last, and none from the first image on."""
    return min([len(job.tokens) - 1, *job.images])


def prefetch(cache: ModelPromptCache | None, job: Job) -> None:
    """On the caller's thread: read into ``job.cached`` the entry that would save this job the most
    decoding (its own sequence's prefix counts as already saved)."""
    request = job.request
    if cache is None:
        if request.cache_name:
            log_ignored_name(request.cache_name)
        return
    if not request.cache_prompt or request.embed:
        return
    own = job.state.slot
    have = common_prefix(list(own.kv), job.tokens) if own is not None and own.owner is job.state else 0
    job.cached = cache.prefetch(job.tokens, cacheable(job), have, request.cache_name)


def restore_prefix(cache: ModelPromptCache | None, context: Context, job: Job, slot: Slot) -> None:
    """Replace the slot's cells by the job's prefetched entry if it holds more of the prompt."""
    found, job.cached = job.cached, None
    if found is None or cache is None:
        return
    gain = found.common - len(slot.kv)
    if gain <= 0 or (gain < cache.min_tokens and not job.request.cache_name):
        return
    slot.kv[:] = cache.restore(context, slot.seq_id, found)
    job.result.reused_tokens = len(slot.kv)


def save_prefix(cache: ModelPromptCache | None, context: Context, job: Job) -> None:
    """Once a prompt is decoded, keep its state on disk (text prompts only)."""
    request, slot = job.request, job.slot
    if cache is None or slot is None or job.images or request.embed or not request.cache_prompt:
        return
    fresh = len(job.tokens) - job.result.reused_tokens
    cache.save(context, slot.seq_id, job.tokens, fresh, request.cache_name)
