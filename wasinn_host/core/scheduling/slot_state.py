"""The scheduler's state of a request and of a sequence: :class:`Job`, :class:`Slot`, :class:`ContextState`.

Plain data that the worker loop (:mod:`.scheduler`) and its helpers (:mod:`.prefix_reuse`,
:mod:`.stop_rules`, :mod:`.speculation`, :mod:`.prompt_cache_use`) read and update.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config.params import SamplingParams
from ..generation import GenerationRequest, GenerationResult
from ..prompt_cache.cache import Prefetched
from ..runtime import Sampler
from .draft_budget import PRIOR_ACCEPTANCE
from .ngram_drafts import NgramDrafter
from .stream_feed import StreamFeed


class ContextState:
    """The engine's state of one execution context: its sampler and its slot affinity.

    An idle context evicted by its model's worker holds neither (``sampler`` and ``slot`` None): its
    next request gets a new sampler and re-decodes its tokens in whichever sequence serves it.
    """

    __slots__ = ("sampler", "sampler_params", "slot", "closed", "cancelled", "mid_stream", "__weakref__")

    def __init__(self) -> None:
        self.sampler: Sampler | None = None
        self.sampler_params: SamplingParams | None = None
        self.slot: Slot | None = None
        self.closed = False
        self.cancelled = False
        self.mid_stream = False
        """The last request was a streaming step that did not end the stream: the sampler's history
        (penalties, grammar, random state) is part of what comes next, so eviction keeps the sampler."""


@dataclass
class Slot:
    """One sequence id of the inference context and the tokens its KV cache holds."""

    seq_id: int
    kv: list[int] = field(default_factory=list)
    owner: ContextState | None = None
    busy: bool = False
    last_used: float = 0.0


@dataclass(eq=False)
class Job:
    """A request in the worker's hands: the request, its result and the worker's bookkeeping."""

    request: GenerationRequest
    state: ContextState
    result: GenerationResult = field(default_factory=GenerationResult)
    tokens: list[int] = field(default_factory=list)
    """The request's tokens, then each sampled token once it is to be decoded."""
    slot: Slot | None = None
    order: int = 0
    first_step: int = -1
    """The worker's step count when it first looked at the job (-1: not yet)."""
    logits_index: int = -1
    t_start: float = 0.0
    t_first: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    on_done: Callable[[], None] | None = None
    """Called (on whichever thread ends the job, without waiting) right after ``done`` is set: how an
    asyncio caller's future is completed (:meth:`.ModelWorker.submit_then`)."""
    images: dict[int, Any] = field(default_factory=dict)
    """The request's images by start index (see ``GenerationRequest.images``)."""
    cached: Prefetched | None = None
    """A prompt-cache entry read for this job before it was queued (restored when it starts)."""
    follows: tuple[Job, int] | None = None
    """While waiting: the running job decoding this many of its first tokens (copied once decoded)."""
    drafter: NgramDrafter | None = None
    draft: list[int] = field(default_factory=list)
    """Draft tokens decoded after the job's pending ones in this step (``drafts`` requests only)."""
    draft_indices: list[int] = field(default_factory=list)
    """Batch indices with logits: the last pending token's, then each draft token's."""
    acceptance: float = PRIOR_ACCEPTANCE
    misses: int = 0
    """Drafts in a row of which no token was accepted."""
    skip: int = 0
    """Matches to pass over before the next draft (``2 ** misses - 1`` after a miss)."""
    feed: StreamFeed | None = None
    """A stream's job: where each sampled token goes, ahead of its guest (:mod:`.stream_feed`)."""
    plain_greedy: bool = False
    """Its sampler takes the argmax of the raw logits and it asks for no ``n-probs``: its rows are sampled
    with the others' in one array operation (set when the job starts)."""
    row_draw: bool = False
    """Its sampler draws as arrays (:attr:`.runtime.Sampler.draws_together`) and it asks for no ``n-probs``:
    its rows are drawn with the others' of its kind (set when the job starts)."""
    plain_rules: bool = False
    """A computing job (no stream, ``on_piece``, reverse prompt, stop strings or ``max-time``): after a
    token only end of generation, its limit, the output's size and a full context can stop it (set
    when the job starts)."""
    t_token: float = 0.0
    """When the job's last token was sampled (a stream's: the next token's generation time starts)."""

    @property
    def pending(self) -> int:
        """Tokens still to decode."""
        return len(self.tokens) - len(self.slot.kv) if self.slot is not None else len(self.tokens)

    def position(self, index: int) -> int:
        """The sequence position of token ``index``: the index, less what the images before it save
        (an M-RoPE image takes ``n_pos`` positions for its ``n_tokens`` tokens; others save none)."""
        return index - sum(s.n_tokens - s.n_pos for s in self.images.values() if s.start + s.n_tokens <= index)
