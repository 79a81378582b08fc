"""One worker thread per loaded model: slots, continuous batching, KV prefix reuse.

The worker owns the inference context.  Other threads never touch it: they submit a
:class:`~wasinn_host.core.generation.GenerationRequest` and wait for its
:class:`~wasinn_host.core.generation.GenerationResult`.  Each loop of the worker

1. **admits** waiting jobs (nothing is done on a step where none waits) to a slot (one sequence id of
   the context), highest priority first, preferring the slot that already holds the longest prefix of
   the job's tokens,
   and trims that slot's KV cache from the first differing token (so a repeated prompt
   prefix is not decoded again).  A prefix that another sequence holds is copied from it
   (``seq_copy``) instead of decoded; a job whose prefix another job is decoding right now
   waits for it (see :meth:`ModelWorker._follows`);
2. **plans** one batch: one token for every generating job, then prompt chunks, at most
   ``n_batch`` tokens, in sequence-id order; a job with speculation on adds draft tokens
   (:mod:`.ngram_drafts`, as many as :mod:`.draft_budget` finds worth their cost); while guests are
   generating, prompt chunks are cut to what keeps the step within ``prefill-step-budget`` times
   their plain decode step (:mod:`.prefill_budget`); the plan is :mod:`.batch_plan`'s, and a plan of one
   token for each running job is carried to the next step until a job starts or ends
   (:func:`.batch_plan.carriable`): only each job's new token is written into the batch;
3. **decodes** it (with ``decode-logits-rows``, in parts of at most that many sampled rows, each
   sampled before the next is decoded: :mod:`.decode_parts`);
4. **samples** every job whose tokens are all decoded (plain greedy ones together, one ``argmax``
   over their logits rows: :meth:`.Context.greedy_tokens`; seeded top-k/top-p/min-p/temperature
   ones together as arrays by kind: :meth:`.Context.drawn_tokens`), and **applies its stop rules**; a
   draft is **verified** on the way: the job samples at each draft position in turn, as
   plain decoding would, and keeps the draft while the sampled tokens match it (the first
   token that differs is the next to decode; the cells after it are dropped).  Every token
   is the sampler's own choice from the same logits, so greedy and seeded outputs are the
   ones plain decoding gives and sampling keeps its distribution.

``compute`` is one job with ``limit = n-predict``; a ``compute_single`` stream is one job that samples
ahead of its guest into the stream's feed (:meth:`ModelWorker.start_stream`, :mod:`.stream_feed`), whose
tokens reach the feed right before the worker next calls llama.cpp (:meth:`ModelWorker._deliver`); a
request with ``limit = 1`` and ``streaming`` (without a feed) is one step of a stream, as before.  Each
step's time is counted by phase (:mod:`.step_clock`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from .. import heap_trim, thread_policy
from ..errors import ErrorKind, WasiNNError
from ..generation import GenerationRequest, GenerationResult, StopReason
from ..prompt_cache.cache import ModelPromptCache
from ..runtime import Context, Model
from ..tokens import may_share
from . import (
    batch_plan,
    decode_parts,
    prefill_budget,
    prefix_reuse,
    prompt_cache_use,
    speculation,
    stop_rules,
)
from .context_growth import ContextMaker, Growth, spare_core
from .draft_budget import DecodeCost
from .prefix_reuse import MIN_SHARED_PREFIX
from .slot_state import ContextState, Job, Slot
from .speculation import MAX_SPECULATIVE_BATCH
from .step_clock import StepClock
from .step_cost import Pass, StepCost, attended, pass_shapes
from .stop_rules import cut_at_stop
from .stream_feed import LATE_AFTER, GuestsBack, StreamFeed

__all__ = [
    "MAX_SPECULATIVE_BATCH",
    "MIN_SHARED_PREFIX",
    "WARM_CONTEXTS",
    "ContextState",
    "Grow",
    "Job",
    "ModelWorker",
    "Slot",
    "cut_at_stop",
]

log = logging.getLogger("wasinn_host")

Grow = Callable[[int], "Growth | None"]
"""For up to that many sequences: a bigger inference context to move to (:mod:`.context_growth`), or
None if there is no room for even one more sequence."""


WARM_CONTEXTS = 16
"""Idle execution contexts per model that keep their sampler and their claim on a sequence; beyond
them the least recently used one gives both up (see :meth:`ModelWorker._went_idle`).  A model loaded
for N guests at once (``wasinn run --instances N``, :meth:`.WasiNN.expect_guests`) keeps N, so that
each guest finds its sequence where it left it between two requests."""


SINK_WAIT_S = 0.005
"""How long the worker waits when every job it could step waits for its piece sink (:mod:`.batch_plan`)."""


_FAILURES: dict[StopReason, ErrorKind] = {
    StopReason.CANCELLED: ErrorKind.RUNTIME_ERROR,
    StopReason.FINALISED: ErrorKind.INVALID_ARGUMENT,
    StopReason.MODEL_CLOSED: ErrorKind.RUNTIME_ERROR,
    StopReason.QUEUE_FULL: ErrorKind.BUSY,
    StopReason.QUEUE_TIMEOUT: ErrorKind.BUSY,
    StopReason.EMPTY_PROMPT: ErrorKind.INVALID_ARGUMENT,
    StopReason.DECODE_FAILED: ErrorKind.RUNTIME_ERROR,
    StopReason.INTERNAL_ERROR: ErrorKind.RUNTIME_ERROR,
    StopReason.OUTPUT_LIMIT: ErrorKind.TOO_LARGE,
}


GUEST_BACK_S = 60e-6
"""What one streaming guest is given to handle its token and ask for the next before the worker decodes
again (:meth:`ModelWorker._deliver`): a guest's host calls for one token take 20-50 us on a CPU."""
GUESTS_BACK_MIN_S = 0.5e-3
GUESTS_BACK_MAX_S = 5e-3


def guests_deadline(woken: int) -> float:
    """Seconds the worker waits at most for ``woken`` streaming guests to come back before it decodes."""
    return min(GUESTS_BACK_MAX_S, GUESTS_BACK_MIN_S + GUEST_BACK_S * woken)


class ModelWorker:
    """Drives one inference context from one thread for every execution context of a model."""

    def __init__(
        self,
        model: Model,
        context: Context,
        name: str,
        grow: Grow | None = None,
        prompt_cache: ModelPromptCache | None = None,
        prefill_step_budget: float = prefill_budget.DEFAULT_STEP_BUDGET,
        logits_rows: int = decode_parts.DEFAULT_LOGITS_ROWS,
        warm_contexts: int = WARM_CONTEXTS,
    ) -> None:
        self.model = model
        self.context = context
        self.name = name
        self._grow = grow
        self.prompt_cache = prompt_cache
        """Prompt prefixes kept on disk across processes (``--nn-prompt-cache``), if the host keeps them."""
        self.n_ctx_seq = context.n_ctx_seq
        self.slots = [Slot(i) for i in range(context.n_seq)]
        self.sequences_high_water = 0
        self.growths = 0
        self.growths_beside = 0
        """Growths whose bigger context was made beside the running one (:mod:`.context_growth`)."""
        self._batch = context.new_batch()
        self._batch_counts: list[tuple[int, int]] = []
        """(sequence id, tokens) of the batch being filled, in sequence-id order."""
        self._batch_cells: list[int] = []
        """KV cells the tokens of each job of the batch being filled attend (:func:`.step_cost.attended`)."""
        self._batch_rows: list[int] = []
        """Logits rows each job of the batch being filled asks for (an embedding's: none)."""
        self._parts: list[range] = []
        """The batch's jobs in the runs decoded one after another (:mod:`.decode_parts`)."""
        self._batch_starts: list[int] = []
        """The position of each job's first token in the batch being filled."""
        self._part_shapes: list[tuple[int, int]] = []
        """Tokens and passes of each part: the same for every step of a carried plan."""
        self._part_passes: list[list[Pass]] = []
        """Each part's passes (:func:`.step_cost.pass_shapes`) when its plan was filled (a carried plan's
        steps are recorded as passes of one row per sequence, with their new cells)."""
        self._n_first = 0
        """Jobs of the plan that the first decode of a split step takes (0: the step is not split)."""
        self.split_steps = 0
        """Steps decoded as two ``llama_decode`` calls, generating tokens then prompt chunks, because the
        cost model found that cheaper than one (:func:`.batch_plan.plan_step`)."""
        self._jobs_changed = 0
        """Counts the times a job started or ended: a carried plan is kept while this stays as it was."""
        self._carried: list[Job] | None = None
        """The jobs of the batch filled last, in order, if the next step may decode the same plan."""
        self._carried_at = -1
        self._greedy_rows: bool | None = False
        """The carried plan is one part of jobs that all sample greedily: each step's row i is job i's, and
        each takes its argmax (:meth:`_use_greedy_rows`); None until the plan's first step is done."""
        self._growing: ContextMaker | None = None
        """A bigger inference context being made beside this one (:mod:`.context_growth`)."""
        self.carried_plans = 0
        """Steps that decoded the plan of the step before (:func:`.batch_plan.carriable`) without planning."""
        self.admissions = 0
        """Passes over waiting jobs (:meth:`_admit`): none on a step where no job waits."""
        self.logits_rows = logits_rows
        """Logits rows one decode computes at most (0 = no cap): see :mod:`.decode_parts`."""
        self._incoming: collections.deque[Job] = collections.deque()
        self._waiting: list[Job] = []
        self._active: list[Job] = []
        self._releases: list[ContextState] = []
        self._idle: collections.OrderedDict[ContextState, None] = collections.OrderedDict()
        """Contexts whose last request is done and that still hold a sampler or a slot, least recently used first."""
        self.warm_contexts = warm_contexts
        """Idle contexts that keep their sampler and their claim on a sequence (:meth:`_went_idle`)."""
        self.evictions = 0
        """Idle contexts that gave up their sampler and slot (:meth:`_went_idle`)."""
        self._cv = threading.Condition()
        self._closing = False
        self.clock = StepClock()
        """Where the worker's steps spend their time (:mod:`.step_clock`)."""
        self.decode_calls = 0
        self.decode_passes = 0
        """Forward passes llama.cpp made over those decodes (:func:`.step_cost.pass_shapes`)."""
        self.decoded_tokens = 0
        self.generated_tokens = 0
        self.rows_sampled_together = 0
        """Tokens chosen together with others of a decoded part (:meth:`_use_outputs`): by one greedy
        ``argmax`` over the logits rows, or drawn as arrays with the rows of the same sampler kind."""
        self.rows_drawn_together = 0
        """Of those, the seeded draws (top-k, top-p, min-p, temperature: :meth:`.Context.drawn_tokens`)."""
        self.sequences_decoded = 0  # summed over decode calls: busy sequences per decode
        self.requests = 0
        self.rejected = 0
        self.reused_tokens = 0
        self.prompt_tokens_decoded = 0
        self.shared_prefix_tokens = 0
        self.drafted_tokens = 0
        self.accepted_draft_tokens = 0
        self.decode_cost = DecodeCost()
        """Passes and tokens: what drafts cost (:mod:`.draft_budget`)."""
        self.step_cost = StepCost()
        """Passes, tokens and attended cells: what prompt chunks cost (:mod:`.prefill_budget`)."""
        self.prefill_step_budget = prefill_step_budget
        """A step with prompt tokens costs at most this many plain decode steps while guests generate (0: off)."""
        self.paused_streams = prefill_budget.PausedStreams()
        self.capped_prompt_steps = 0
        """Steps whose prompt tokens the step budget cut short."""
        self.steps = 0
        """Steps made (and waits with nothing to decode): the clock of a slot held for a stream."""
        self._copy_sources: set[int] = set()  # sequence ids llama.cpp copies from at the next decode
        self._copy_targets: set[int] = set()  # ... and into
        self._pending_copies: list[tuple[int, int, int]] = []  # (source, target, first position dropped)
        self._submitted = 0
        self._deliveries: list[tuple[StreamFeed, GenerationResult | tuple[GenerationResult]]] = []
        """Streams' tokens and ends not handed to their feeds yet (:meth:`_deliver`)."""
        self._guests_back = GuestsBack()
        self._await_guests = not spare_core(context)
        """Wait for the streaming guests woken before a decode to come back first (:meth:`_deliver`):
        llama.cpp's threads take every core (see :func:`.context_growth.spare_core`)."""
        self.guests_awaited = 0
        """Streaming guests the worker waited for before a decode (:meth:`_deliver`)."""
        self.late_guests = 0
        """Streaming guests that did not come back by the deadline (:meth:`_deliver`): not waited for again."""
        self._policy = thread_policy.foreground_policy()
        """The scheduling policy of the thread that made the worker, before a guest's run moved it to the
        background (the worker's thread, started from it, would inherit that)."""
        self._thread = threading.Thread(target=self._run, name=f"wasinn-model-{name}", daemon=True)
        self._thread.start()

    # -- caller side ---------------------------------------------------------------

    def submit(self, request: GenerationRequest, state: ContextState) -> GenerationResult:
        """Queue a request and wait until the worker finishes it."""
        job = self._enqueue(request, state, None)
        job.done.wait()
        return job.result

    def submit_then(self, request: GenerationRequest, state: ContextState, on_done: Callable[[], None]) -> Job:
        """Queue a request and return at once: ``on_done()`` is called once the job is done (its ``result``
        final), on the worker's thread (or this one, for a request refused at once); it must not block."""
        return self._enqueue(request, state, None, on_done)

    def start_stream(self, request: GenerationRequest, state: ContextState, feed: StreamFeed) -> None:
        """Queue a stream's job (``request.streaming``) and return at once: each token it samples goes
        to ``feed``, and its end (its stop reason or error) to :meth:`.StreamFeed.close`."""
        self._enqueue(request, state, feed)

    def _enqueue(
        self,
        request: GenerationRequest,
        state: ContextState,
        feed: StreamFeed | None,
        on_done: Callable[[], None] | None = None,
    ) -> Job:
        """A job for ``request``, queued for the worker (or finished at once when it cannot be)."""
        job = Job(request, state, tokens=list(request.tokens), t_start=time.perf_counter(), feed=feed, on_done=on_done)
        job.images = {span.start: span for span in request.images}
        prompt_cache_use.prefetch(self.prompt_cache, job)
        if state.closed or state.cancelled:
            self._finish(job, StopReason.CANCELLED if state.cancelled else StopReason.FINALISED)
            return job
        with self._cv:
            if self._closing:
                self._finish(job, StopReason.MODEL_CLOSED)
                return job
            under_way = request.streaming and state.mid_stream  # the next step of an admitted stream
            if len(self._incoming) + len(self._waiting) >= request.max_queue and not under_way:
                self.rejected += 1
                self._finish(
                    job,
                    StopReason.QUEUE_FULL,
                    f"queue full: {request.max_queue} requests are waiting for model {self.name}",
                )
                return job
            self._submitted += 1
            job.order = self._submitted
            self.requests += 1
            self._incoming.append(job)
            self._cv.notify()
        return job

    @property
    def queued(self) -> int:
        """Requests waiting for a free slot."""
        return len(self._incoming) + len(self._waiting)

    @property
    def active(self) -> int:
        """Requests being decoded now."""
        return len(self._active)

    @property
    def busy_sequences(self) -> int:
        """Slots decoding now."""
        return sum(1 for s in self.slots if s.busy)

    def release(self, state: ContextState) -> None:
        """Forget an execution context: free its sampler; its slot's KV stays reusable."""
        state.closed = True
        with self._cv:
            self._releases.append(state)
            self._cv.notify()

    def close(self) -> None:
        """Stop the thread (after the jobs in flight) and free the inference context."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()
        if self._growing is not None:
            self._growing.close()
            self._growing = None
        self._batch.close()
        self.context.close()

    # -- worker thread -------------------------------------------------------------

    def _run(self) -> None:
        thread_policy.use_policy(self._policy)
        while True:
            try:
                if not self._turn():
                    return
            except Exception as exc:  # a bug must not hang callers
                try:
                    self._fail_all(exc)
                except Exception:  # nor a second one in failing the requests: the worker goes on
                    log.exception("model %s: failing the requests after a worker error failed", self.name)

    def _turn(self) -> bool:
        """One turn of the worker's loop: hand over the last tokens, wait for work, admit, step.  False
        once the worker is closing and has nothing left to do."""
        if self._deliveries:  # the tokens sampled last go now, before the worker waits or decodes again
            began = time.perf_counter()
            self._deliver(self._await_guests)
            self.clock.add("guests", time.perf_counter() - began)
        with self._cv:
            while not (self._incoming or self._releases or self._closing or self._active or self._waiting):
                self._cv.wait()
            if self._closing and not (self._incoming or self._active or self._waiting):
                self._do_releases()
                return False
            self.clock.start()
            self._take_incoming()
            self._do_releases()
        self._admit()
        self.clock.lap("admit")
        if self._active and self._hold_for_streams():
            self.clock.start()  # the wait is no phase of a step
            self._admit()  # the streams that came back
            self.clock.lap("admit")
        if self._active:
            self._step()
        elif self._waiting:
            with self._cv:  # every slot busy (or held for a stream): wait for a job to finish
                self._cv.wait(0.01)
            self.steps += 1  # a stream not back by now gives up its hold on its slot
        return True

    def _fail_all(self, exc: Exception) -> None:
        """After a bug in the worker (``exc``): one log record; every job in flight or waiting ends with an
        internal error (its caller's ``RUNTIME_ERROR``), the streams' feeds closed here rather than by
        :meth:`_deliver`, which may be what failed; every sequence's cells are freed, so that no later
        request reuses cells the bookkeeping may have lost track of.  The worker then serves on."""
        log.exception("model %s: worker error: %s", self.name, exc)
        with self._cv:
            self._take_incoming()
            released, self._releases = self._releases, []
        for state in released:  # what releasing does but close the sampler (which may be what failed)
            self._idle.pop(state, None)
            if state.slot is not None and state.slot.owner is state:
                state.slot.owner = None
        for job in [*self._active, *self._waiting]:
            try:
                self._finish(job, StopReason.INTERNAL_ERROR)
            except Exception:  # the next job is ended all the same
                log.exception("model %s: ending a request after the error failed", self.name)
                job.done.set()
        self._active.clear()
        self._waiting.clear()
        deliveries, self._deliveries = self._deliveries, []
        for feed, item in deliveries:
            if not isinstance(item, GenerationResult):
                try:
                    feed.close(item[0])  # the tokens not handed over yet are dropped with their failed job
                except Exception:
                    log.exception("model %s: ending a stream after the error failed", self.name)
        self._carried = None
        self._copy_targets.clear()
        self._pending_copies.clear()
        try:
            for slot in self.slots:
                self.context.seq_rm(slot.seq_id, 0)
                slot.kv.clear()
        except Exception:  # llama.cpp's context itself may be what failed
            log.exception("model %s: freeing the sequences' cells after the error failed", self.name)

    def _take_incoming(self) -> None:
        """Move submitted jobs to the waiting list (holding ``_cv``)."""
        now = time.perf_counter()
        for job in self._incoming:
            self.paused_streams.arrived(job.state, now)
        self._waiting.extend(self._incoming)
        self._incoming.clear()

    def _hold_for_streams(self) -> bool:
        """Before a step with prompt tokens, wait a moment for streams between two steps to ask for their
        next token (:meth:`.prefill_budget.PausedStreams.hold_s`), so they are not left out of it.  True
        if it waited."""
        if self._carries() or self.prefill_step_budget <= 0 or not any(job.pending > 1 for job in self._active):
            return False  # a carried plan has no prompt tokens
        hold = self.paused_streams.hold_s()
        deadline = time.perf_counter() + hold
        waited = False
        with self._cv:
            while not self._closing:
                here = {job.state for job in (*self._active, *self._waiting, *self._incoming)}
                now = time.perf_counter()
                missing = self.paused_streams.awaited(now, here)
                if not missing:
                    break
                if now >= deadline:
                    self.paused_streams.late(missing)
                    break
                self._cv.wait(deadline - now)
                waited = True
            self._take_incoming()
        return waited

    def _do_releases(self) -> None:
        for state in self._releases:
            self.paused_streams.lost_sequence(state)  # a closed stream asks for no next token
            for job in [j for j in self._active if j.state is state]:  # closed mid-computation
                self._finish(job, StopReason.FINALISED)
            self._idle.pop(state, None)
            if state.slot is not None and state.slot.owner is state:
                state.slot.owner = None
            if state.sampler is not None:
                state.sampler.close()
                state.sampler = None
        self._releases.clear()

    # 1. admit --------------------------------------------------------------------

    def _admit(self) -> None:
        """Start waiting jobs, highest priority first, then in arrival order; expire old ones.  Nothing to
        do (and nothing done) when no job waits."""
        if self._growing is not None and self._growing.done:
            self._take_grown()
        if not self._waiting:
            return
        self.admissions += 1
        still_waiting: list[Job] = []
        now = time.perf_counter()
        for job in sorted(self._waiting, key=lambda j: (-j.request.priority, j.order)):
            if job.first_step < 0:
                job.first_step = self.steps
            timeout_ms = job.request.queue_timeout_ms
            if job.state.cancelled or job.state.closed:
                self._finish(job, StopReason.CANCELLED if job.state.cancelled else StopReason.FINALISED)
            elif job.feed is not None and job.feed.ended:
                self._finish(job, StopReason.STREAM_ENDED)
            elif timeout_ms and (now - job.t_start) * 1000.0 > timeout_ms:
                log.warning(
                    "model %s: a request waited more than queue-timeout-ms=%d for a free sequence; answered Busy",
                    self.name,
                    timeout_ms,
                )
                self._finish(job, StopReason.QUEUE_TIMEOUT)
            elif still_waiting and not self._has_free_slot():
                still_waiting.append(job)
            elif (slot := self._pick_slot(job)) is None or prefix_reuse.follows(
                job, slot, self.slots, self._active, self._copy_targets
            ):
                still_waiting.append(job)
            else:
                self._start(job, slot)
        self._waiting = still_waiting
        if (
            self._waiting
            and self._grow is not None
            and self._growing is None
            and all(s.busy or self._held_for_stream(s) for s in self.slots)
        ):
            self._add_sequences(self.busy_sequences + len(self._waiting))

    def _add_sequences(self, wanted: int) -> None:
        """More contexts compute than there are sequences: move to a bigger inference context.

        ``grow`` (from the registry) offers one with room for up to ``wanted`` sequences within the
        KV budget and llama.cpp's limits, or None.  Where the budget holds it beside the running one it
        is made on a thread of its own while the running jobs go on (:mod:`.context_growth`), and the
        worker moves to it at a later admission (:meth:`_take_grown`); otherwise now, in place.
        """
        assert self._grow is not None
        growth = self._grow(wanted)
        if growth is None:
            self._grow = None  # at the cap: the rest wait in the queue
            return
        if growth.beside:
            self._growing = ContextMaker(growth.make, self.name)
            self.growths_beside += 1
            return
        self._move_to(None, growth.make)

    def _take_grown(self) -> None:
        """Move to the context made beside the running one; if it could not be made, grow in place."""
        maker, self._growing = self._growing, None
        assert maker is not None
        if maker.context is None:
            log.warning(
                "model %s: a bigger context beside the running one failed (%s); growing in place",
                self.name,
                maker.error,
            )
            assert self._grow is not None
            growth = self._grow(len(self.slots) + 1)
            if growth is None:
                self._grow = None
                return
            self._move_to(None, growth.make)
            return
        bigger, maker.context = maker.context, None
        self._move_to(bigger, None)

    def _move_to(self, bigger: Context | None, make: Callable[[], Context] | None) -> None:
        """Move to ``bigger`` (or, with None, to the context ``make`` makes once the running one is freed).

        Each sequence's used cells move over (``llama_state_seq_get_data`` / ``set_data``, through host
        memory); a copy of a shared prefix not made yet is made again.  A sequence llama.cpp does not
        take back starts empty (its job re-decodes its tokens).
        """
        saved = [
            (slot, self.context.state_get(slot.seq_id))
            for slot in self.slots
            if slot.kv and slot.seq_id not in self._copy_targets
        ]
        self._batch.close()
        self.context.close()
        heap_trim.trim_heap()  # the old context's buffers, freed into malloc's arenas: not beside the new ones
        if bigger is None:
            assert make is not None
            bigger = make()
        self.context, self._batch = bigger, bigger.new_batch()
        self._carried = None  # the plan's batch went with the old context
        for slot in self.slots:
            if slot.seq_id in self._copy_targets:
                continue
            data = next((d for s, d in saved if s is slot), None)
            if data is None or not self.context.state_set(slot.seq_id, data):
                slot.kv.clear()
        for source, target, position in self._pending_copies:
            if self.slots[source].kv:
                self.context.seq_copy(source, target)
                self.context.seq_rm(target, position)
            else:  # the source did not move over: the copy decodes its tokens after all
                self.slots[target].kv.clear()
        del saved
        heap_trim.trim_heap()  # the saved states
        self.slots += [Slot(i) for i in range(len(self.slots), bigger.n_seq)]
        self.growths += 1
        log.info("model %s: more contexts computing at once; now %d sequences", self.name, bigger.n_seq)

    def _has_free_slot(self) -> bool:
        return any(not s.busy for s in self.slots)

    def _pick_slot(self, job: Job) -> Slot | None:
        """The job's own slot; else the free slot holding a prefix of its tokens worth keeping
        (:data:`~.prefix_reuse.MIN_SHARED_PREFIX` tokens or more); else the lowest free id.

        Keeping busy slots at low, consecutive ids matters: llama.cpp splits a batch whose sequence
        ids are not consecutive into several forward passes, one more for each gap, on every step of
        the generations that follow.  A few tokens of a stale prefix (a prompt starting as an earlier
        one did) are not worth that; a longer prefix any sequence holds is copied into the chosen one
        (:meth:`_copy_prefix`).  Among free slots, those no idle context owns go first, then the least
        recently used.
        """
        own = job.state.slot
        if own is not None and own.owner is job.state and not own.busy:
            return own
        free = [s for s in self.slots if not s.busy]
        if job.first_step >= self.steps:  # arrived since the last step: a stream's sequence is not for it yet
            free = [s for s in free if not self._held_for_stream(s)]
        if not free:
            return None
        unowned = [s for s in free if s.owner is None] or free

        def score(slot: Slot) -> tuple[int, float, int]:
            shared = prefix_reuse.reusable(job, slot) if may_share(slot.kv, job.tokens, MIN_SHARED_PREFIX) else 0
            # a short shared prefix is no reason to leave a gap; among idle contexts' slots, the least
            # recently used goes first
            return (
                shared if shared >= MIN_SHARED_PREFIX else 0,
                -slot.last_used if slot.owner is not None else 0.0,
                -slot.seq_id,
            )

        return max(unowned, key=score)

    def _held_for_stream(self, slot: Slot) -> bool:
        """The slot's owner is a stream between two steps: its guest is about to ask for its next token.

        A request that arrived since the last step leaves such a slot alone (it waits a step), so that
        with more streams than sequences each step moves one stream, not every one: a stream whose slot
        was taken would take the next stream's, and each would decode all its tokens again."""
        owner = slot.owner
        return owner is not None and owner.mid_stream and self.paused_streams.is_paused(owner, time.perf_counter())

    def _start(self, job: Job, slot: Slot) -> None:
        if not job.tokens:
            self._finish(job, StopReason.EMPTY_PROMPT)
            return
        self._idle.pop(job.state, None)
        if slot.owner is not None and slot.owner is not job.state:
            slot.owner.slot = None
            self.paused_streams.lost_sequence(slot.owner)
        slot.owner = job.state
        slot.busy = True
        job.state.slot = slot
        job.slot = slot
        job.result.reused_tokens = prefix_reuse.trim_kv(self.context, job, slot)
        if slot.seq_id not in self._copy_sources:  # a copy's source keeps its cells until the decode
            prompt_cache_use.restore_prefix(self.prompt_cache, self.context, job, slot)
        self._copy_prefix(job, slot)
        self.reused_tokens += job.result.reused_tokens
        try:
            self._prepare_sampler(job)
        except WasiNNError as err:
            log.warning("model %s: %s", self.name, err)
            self._finish(job, StopReason.REJECTED, err.message, err.kind)
            return
        self._active.append(job)
        self._jobs_changed += 1
        self.sequences_high_water = max(self.sequences_high_water, self.busy_sequences)

    def _copy_prefix(self, job: Job, slot: Slot) -> None:
        """Copy the prefix of the job's tokens another sequence holds, if it is longer than the slot's own
        by :data:`~.prefix_reuse.MIN_SHARED_PREFIX` (llama.cpp copies the cells at the next decode)."""
        if slot.seq_id in self._copy_sources:
            return
        found = prefix_reuse.copy_source(self.slots, job, slot, self._copy_targets)
        if found is None:
            return
        donor, shared = found
        self.context.seq_copy(donor.seq_id, slot.seq_id)
        self.context.seq_rm(slot.seq_id, job.position(shared))
        self._pending_copies.append((donor.seq_id, slot.seq_id, job.position(shared)))
        self._copy_sources.add(donor.seq_id)
        self._copy_targets.add(slot.seq_id)
        self.shared_prefix_tokens += shared - len(slot.kv)
        slot.kv[:] = donor.kv[:shared]
        job.result.reused_tokens = shared

    def _prepare_sampler(self, job: Job) -> None:
        state, sampling = job.state, job.request.sampling
        if state.sampler is None or state.sampler_params != sampling:
            if state.sampler is not None:
                state.sampler.close()
                state.sampler = None
            state.sampler = self.context.new_sampler(sampling)
            state.sampler_params = sampling
        elif job.request.reset_sampler:
            state.sampler.reset()  # a streaming step keeps the chain's history
        job.plain_greedy = state.sampler.argmax_only and not sampling.n_probs
        job.row_draw = state.sampler.draws_together and not sampling.n_probs
        request, stop = job.request, job.request.stopping
        job.plain_rules = (
            job.feed is None
            and not request.streaming
            and request.on_piece is None
            and not (stop.reverse_prompt or stop.stop or stop.max_time_ms)
        )

    # 2-4. one step: plan, decode, sample -------------------------------------------

    def _step(self) -> None:
        self.steps += 1
        for job in [j for j in self._active if j.state.cancelled or (j.feed is not None and j.feed.ended)]:
            self._finish(job, StopReason.CANCELLED if job.state.cancelled else StopReason.STREAM_ENDED)
        if self._carries():
            assert self._carried is not None
            in_batch = self._refill_batch(self._carried)
            self.carried_plans += 1
        else:
            planned = self._plan_batch()
            if not planned:
                if any(batch_plan.waits_for_sink(job) for job in self._active):
                    with self._cv:  # only guests whose stdout is behind: let their queues drain a moment
                        self._cv.wait(SINK_WAIT_S)
                return
            keep = batch_plan.carriable(planned, self._active)
            in_batch = self._fill_batch(planned)
            self._carried = in_batch if keep and len(in_batch) == len(planned) else None
            self._carried_at = self._jobs_changed
            split_at = 0
            if self._n_first:  # where the prompt chunks begin in the batch (a job may have been left out)
                firsts = {id(job) for job, _ in planned[: self._n_first]}
                split_at = sum(1 for job in in_batch if id(job) in firsts)
                self.split_steps += 0 < split_at < len(in_batch)
            self._parts = decode_parts.parts(self._batch_rows, self.logits_rows, split_at)
            self._part_passes = [self._passes(part) for part in self._parts]
            self._part_shapes = [(sum(p[1] for p in shapes), len(shapes)) for shapes in self._part_passes]
            self._greedy_rows = None  # (known after this step: a job may sample its first token in it)
        self.clock.lap("plan")
        first = 0
        single_rows = self._carries()  # one token for each job: passes of one row (a job may end meanwhile)
        for index, (part, (n_tokens, n_passes)) in enumerate(zip(self._parts, self._part_shapes)):
            jobs = in_batch[part.start : part.stop]
            cells = sum(self._batch_cells[part.start : part.stop])
            shapes = None if single_rows else self._part_passes[index]
            if self._decode(jobs, first, n_tokens, n_passes, cells, shapes):
                if self._greedy_rows and single_rows:
                    self._use_greedy_rows(jobs)
                else:
                    self._use_outputs(jobs, first)
            self.clock.lap("sample")
            first += n_tokens
        if self._greedy_rows is None and single_rows and self._carries():  # the plan's next steps: all greedy?
            self._greedy_rows = len(self._parts) == 1 and all(job.plain_greedy for job in in_batch)
        self.clock.steps += 1

    def _carries(self) -> bool:
        """Whether the next step decodes the plan of the step before (no job started or ended since)."""
        return self._carried is not None and self._carried_at == self._jobs_changed

    def _passes(self, part: range) -> list[Pass]:
        """The passes llama.cpp makes over a part of the batch just filled (:func:`.step_cost.pass_shapes`)."""
        counts, starts = self._batch_counts, self._batch_starts
        return pass_shapes([(*counts[i], starts[i]) for i in part])

    def _use_outputs(self, jobs: list[Job], first: int) -> None:
        """Sample (or read the embedding of) each job of a part just decoded whose tokens are all
        decoded; its batch indices become the part's (``first`` is the part's first index)."""
        now = time.perf_counter()
        together: list[Job] = []
        drawn: list[Job] = []
        for job in jobs:
            if job.logits_index < 0:
                continue
            job.logits_index -= first
            if job.draft_indices:
                job.draft_indices = [index - first for index in job.draft_indices]
            if not job.t_first:
                job.t_first = now
                job.result.prompt_ms = (now - job.t_start) * 1000.0
                prompt_cache_use.save_prefix(self.prompt_cache, self.context, job)
            if job.request.embed:
                self._embed(job)
            elif self._together(job):
                (together if job.plain_greedy else drawn).append(job)
            else:
                self._sample(job)
        if together:
            self._took_together(together, self.context.greedy_tokens([job.logits_index for job in together]))
            self.rows_sampled_together += len(together)
        if drawn:
            indices = [job.logits_index for job in drawn]
            self._took_together(drawn, self.context.drawn_tokens(indices, [job.state.sampler for job in drawn]))
            self.rows_sampled_together += len(drawn)
            self.rows_drawn_together += len(drawn)

    def _use_greedy_rows(self, jobs: list[Job]) -> None:
        """:meth:`_use_outputs` for a step of a carried plan whose jobs all sample greedily
        (:attr:`_greedy_rows`): row i of the decode is job i's (:meth:`_refill_batch`), and no job started,
        ended or drafted since the plan was made, so each still samples its row's argmax alone."""
        self._took_together(jobs, self.context.greedy_tokens(list(range(len(jobs)))))
        self.rows_sampled_together += len(jobs)

    def _took_together(self, jobs: list[Job], tokens: list[int]) -> None:
        """The tokens sampled together for ``jobs``: recorded, then through the stop rules.  A computing job
        whose only rules are the usual ones (``plain_rules``: end of generation, its limit, the output's
        size, a full context) goes on after a few comparisons when none of them applies; any other job,
        or one that a rule may stop, goes through :meth:`_took` (the same rules, in full)."""
        piece, is_eog, n_ctx_seq = self.model.piece, self.model.is_eog, self.n_ctx_seq
        self.generated_tokens += len(jobs)  # before any job ends: its caller may read the count at once
        for job, token in zip(jobs, tokens):
            data = piece(token)
            result, request = job.result, job.request
            result.generated.append(token)
            result.text += data
            if (
                job.plain_rules
                and len(result.generated) < request.limit
                and len(result.text) <= request.max_output_bytes
                and len(job.tokens) < n_ctx_seq
                and (request.stopping.ignore_eos or not is_eog(token))
            ):
                job.tokens.append(token)  # decoded in the next batch
            elif job.feed is not None:
                self._feed_token(job, token, data)
            else:
                self._took(job, token, data)

    @staticmethod
    def _together(job: Job) -> bool:
        """The job's next token is chosen from its logits row alone, with the others' of its part in one
        array operation: plain greedy (the row's argmax) or drawn as arrays (``row_draw``), no draft to
        verify, no ``n-probs``, a token still to make."""
        return (job.plain_greedy or job.row_draw) and not job.draft and len(job.result.generated) < job.request.limit

    def _plan_batch(self) -> list[tuple[Job, int]]:
        """(job, tokens to take) for this step (:mod:`.batch_plan`); counts a step whose prompt chunks the
        step budget cut."""
        planning = batch_plan.Planning(
            self._batch.capacity,
            self.n_ctx_seq,
            self.prefill_step_budget,
            self.decode_cost,
            self.budget_cost,
            lambda running: self.paused_streams.count(time.perf_counter(), running),
        )
        planned, capped, self._n_first = batch_plan.plan_step(self._active, planning)
        self.capped_prompt_steps += capped
        return planned

    @property
    def budget_cost(self) -> StepCost:
        """The cost model the step budget uses: the fitted one once the worker made
        :data:`~.prefill_budget.MIN_FIT_DECODES` decodes, the prior before."""
        return self.step_cost if self.decode_calls >= prefill_budget.MIN_FIT_DECODES else StepCost()

    def _fill_batch(self, planned: list[tuple[Job, int]]) -> list[Job]:
        batch = self._batch
        batch.clear()
        self._batch_counts = []
        self._batch_cells = []
        self._batch_rows = []
        self._batch_starts = []
        in_batch: list[Job] = []
        for job, take in planned:
            slot = job.slot
            assert slot is not None
            before = len(slot.kv)
            if job.images and not self._decode_images(job, take):
                continue
            start = len(slot.kv)
            take = self._text_run(job, start, take - (start - before))
            if take <= 0:
                continue
            last = start + take == len(job.tokens)
            wants = last and (job.request.embed or len(job.result.generated) < job.request.limit)
            index = -1
            shift = start - job.position(start) if job.images else 0
            for offset in range(take):
                at = start + offset
                index = batch.add(job.tokens[at], at - shift, slot.seq_id, wants and offset == take - 1)
            slot.kv.extend(job.tokens[start : start + take])
            self.prompt_tokens_decoded += max(0, min(start + take, len(job.request.tokens)) - start)
            job.logits_index = index if last else -1
            if job.draft and last:
                at = start + take - shift
                job.draft_indices = [index]
                job.draft_indices += [batch.add(t, at + i, slot.seq_id, True) for i, t in enumerate(job.draft)]
                slot.kv.extend(job.draft)
            else:
                job.draft = []
            self._batch_counts.append((slot.seq_id, take + len(job.draft)))
            self._batch_cells.append(attended(take + len(job.draft), start))
            self._batch_starts.append(start)
            self._batch_rows.append(0 if job.request.embed else int(wants) + len(job.draft))
            in_batch.append(job)
        return in_batch

    def _refill_batch(self, jobs: list[Job]) -> list[Job]:
        """The batch of a carried plan (:func:`.batch_plan.carriable`): each job's next token and position
        where its last one was (its sequence id and logits row stay), and the cells its token attends."""
        batch, cells = self._batch, self._batch_cells
        for index, job in enumerate(jobs):
            kv = job.slot.kv  # type: ignore[union-attr]
            start = len(kv)
            token = job.tokens[start]
            batch.rewrite(index, token, start)
            kv.append(token)
            job.logits_index = index
            cells[index] = start + 1  # step_cost.attended(1, start)
        return jobs

    @staticmethod
    def _text_run(job: Job, start: int, take: int) -> int:
        """``take`` shortened to stop before the job's next image (images are decoded on their own)."""
        for begin in job.images:
            if start <= begin < start + take:
                take = begin - start
        return take

    def _decode_images(self, job: Job, take: int) -> bool:
        """Decode the images at the job's next positions (within ``take`` tokens); False if one failed."""
        slot = job.slot
        assert slot is not None
        while (span := job.images.get(len(slot.kv))) is not None and take > 0:
            rc = self.context.decode_image(span, job.position(len(slot.kv)), slot.seq_id)
            self.decode_calls += 1
            if rc != 0:
                log.error("model %s: decoding an image of %d tokens failed with %d", self.name, span.n_tokens, rc)
                self.context.seq_rm(slot.seq_id, 0)
                slot.kv.clear()
                self._finish(job, StopReason.DECODE_FAILED)
                return False
            slot.kv.extend(job.tokens[span.start : span.start + span.n_tokens])
            self.decoded_tokens += span.n_tokens
            take -= span.n_tokens
        return True

    def _decode(
        self, in_batch: list[Job], first: int, n_tokens: int, n_passes: int, cells: int, shapes: list[Pass] | None
    ) -> bool:
        """Run ``n_tokens`` of the batch from index ``first`` (the tokens of ``in_batch``, in ``n_passes``
        passes (``shapes``; None: each of one row per sequence), attending ``cells`` KV cells); on
        failure, free the jobs' cells and fail them."""
        self._deliver(self._await_guests)  # an end the admission or the plan gave
        self.clock.lap("guests")
        began = time.perf_counter()
        rc = self.context.decode(self._batch, first, n_tokens)
        self.clock.lap("launch")
        with self._cv:  # while a GPU computes: requests submitted meanwhile join the waiting list
            self._take_incoming()
        self.clock.lap("admit")
        self.context.synchronize()
        self.clock.lap("device")
        seconds = time.perf_counter() - began
        self.decode_cost.record(n_tokens, n_passes, seconds)
        if shapes is None:
            self.step_cost.record_single_rows(n_tokens, n_passes, cells, seconds)
        else:
            self.step_cost.record_passes(shapes, seconds)
        self._copy_sources.clear()
        self._copy_targets.clear()
        self._pending_copies.clear()
        self.decode_calls += 1
        self.decode_passes += n_passes
        self.decoded_tokens += n_tokens
        self.sequences_decoded += len(in_batch)
        if rc == 0:
            return True
        log.error("model %s: llama_decode failed with %d for %d tokens", self.name, rc, n_tokens)
        for job in in_batch:
            slot = job.slot
            assert slot is not None
            self.context.seq_rm(slot.seq_id, 0)
            slot.kv.clear()
            self._finish(job, StopReason.DECODE_FAILED)
        return False

    def _embed(self, job: Job) -> None:
        slot = job.slot
        assert slot is not None
        job.result.embedding = self.context.embeddings(slot.seq_id, job.logits_index)
        self.context.seq_rm(slot.seq_id, 0)  # embeddings are one-shot: free the cells
        slot.kv.clear()
        self._finish(job, StopReason.EMBEDDING)

    def _sample(self, job: Job) -> None:
        if len(job.result.generated) >= job.request.limit:  # n-predict 0: prompt only
            self._finish(job, StopReason.LIMIT)
            return
        if job.draft:
            drafted, accepted = speculation.verify_draft(
                self.context, job, self._sample_token, self._stop_rule, self._finish
            )
            self.drafted_tokens += drafted
            self.accepted_draft_tokens += accepted
            return
        token, piece = self._sample_token(job)
        self._took(job, token, piece)

    def _took(self, job: Job, token: int, piece: bytes) -> None:
        """A plain token sampled for ``job`` (recorded): to its stream's feed, or through its stop rules
        (the job goes on with it decoded in the next batch, or ends)."""
        if job.feed is not None:
            self._feed_token(job, token, piece)
            return
        stop = (
            stop_rules.stream_stop(self.model, job, token, self.n_ctx_seq)
            if job.request.streaming
            else self._stop_rule(job, token, piece)
        )
        if stop is None:
            job.tokens.append(token)  # decoded in the next batch
        else:
            self._finish(job, stop)

    def _feed_token(self, job: Job, token: int, piece: bytes) -> None:
        """A stream's token to its feed, as the result of a one-token step; the job goes on (the token is
        decoded in the next batch) unless it ended the stream or its guest is the lookahead behind."""
        feed, result = job.feed, job.result
        assert feed is not None
        stop = stop_rules.stream_stop(self.model, job, token, self.n_ctx_seq)
        now = time.perf_counter()
        item = GenerationResult([token], bytearray(piece), result.probs[-1:], stop_reason=stop)
        if len(result.generated) == 1:
            item.prompt_ms, item.reused_tokens = result.prompt_ms, result.reused_tokens
        else:
            item.generation_ms = (now - job.t_token) * 1000.0
        job.t_token = now
        feed.undelivered += 1
        self._deliveries.append((feed, item))
        if stop is StopReason.TOKEN:
            job.tokens.append(token)
            if feed.backlog + feed.undelivered < feed.lookahead:
                return
        self._finish(job, stop)

    def _deliver(self, await_guests: bool = False) -> None:
        """Hand the tokens sampled since the last delivery to their streams' feeds, and the ends of the
        streams' jobs after them.  The worker delivers right before it calls llama.cpp (and before it
        waits for work): the guests it wakes then run while llama.cpp computes without the GIL, instead
        of taking it from the worker while it samples the other jobs.

        With ``await_guests`` (llama.cpp's threads take every core: :attr:`_await_guests`), the worker
        then waits for the guests it woke to come back for their next token (:class:`.GuestsBack`), at
        most :func:`guests_deadline`, so that they run before the decode instead of beside it, one after
        another.  A guest that misses the deadline :data:`~.stream_feed.LATE_AFTER` times in a row is not
        waited for again."""
        deliveries, self._deliveries = self._deliveries, []
        woken: dict[int, StreamFeed] = {}
        if await_guests:
            for feed, item in deliveries:
                if (
                    isinstance(item, GenerationResult)
                    and item.stop_reason is StopReason.TOKEN
                    and feed.waiting
                    and not feed.late
                    and feed.due(item)
                ):
                    woken[id(feed)] = feed
        back = self._guests_back
        if woken:
            self.guests_awaited += len(woken)
            for feed in woken.values():
                feed.comeback = back
        handed = 0
        try:
            for feed, item in deliveries:
                if isinstance(item, GenerationResult):
                    feed.undelivered -= 1
                    feed.put(item, wake=id(feed) not in woken)  # the awaited guests are woken in turn, below
                else:
                    feed.close(item[0])
                handed += 1
        except Exception:  # a bug: what was not handed over goes back, for _fail_all to close
            self._deliveries[:0] = deliveries[handed + 1 :]
            raise
        if woken:
            back.start(list(woken.values()))
        if woken and not back.wait(guests_deadline(len(woken))):
            for feed in woken.values():
                if feed.comeback is None:
                    feed.misses = 0
                    continue
                feed.comeback = None
                feed.misses += 1
                if feed.misses >= LATE_AFTER:
                    feed.late = True
                    self.late_guests += 1
        elif woken:
            for feed in woken.values():
                feed.misses = 0

    def _sample_token(self, job: Job) -> tuple[int, bytes]:
        """Sample one token, record it (and its alternatives with ``n-probs``), return it and its bytes."""
        state, result, n_probs = job.state, job.result, job.request.sampling.n_probs
        assert state.sampler is not None
        top = self.context.top_probabilities(job.logits_index, n_probs) if n_probs > 0 else []
        token = state.sampler.sample(self.context, job.logits_index)
        if n_probs > 0:
            result.probs.append((token, top))
        return token, self._record(job, token)

    def _record(self, job: Job, token: int) -> bytes:
        """Add a sampled token and its bytes to the job's result; its bytes."""
        piece = self.model.piece(token)
        result = job.result
        result.generated.append(token)
        result.text += piece
        self.generated_tokens += 1
        return piece

    def _stop_rule(self, job: Job, token: int, piece: bytes) -> StopReason | None:
        return stop_rules.stop_rule(self.model, self.context, job, token, piece, self.n_ctx_seq, self.name)

    def _finish(self, job: Job, reason: StopReason, message: str = "", kind: ErrorKind | None = None) -> None:
        """End a job: record why (an error for the failure reasons), free its slot, wake its caller."""
        result = job.result
        result.stop_reason = reason
        kind = kind or _FAILURES.get(reason)
        if kind is not None:
            result.error = WasiNNError(kind, f"compute on model {self.name}: {message or reason.value}")
        now = time.perf_counter()
        if job.t_first:
            result.generation_ms = (now - job.t_first) * 1000.0
        else:
            result.prompt_ms = (now - job.t_start) * 1000.0
        if job.slot is not None:
            job.slot.busy = False
            job.slot.last_used = now
            job.state.mid_stream = job.request.streaming and reason is StopReason.TOKEN
            if job.request.streaming:
                self.paused_streams.stepped(job.state, now, job.state.mid_stream)
            self._went_idle(job.state)
        if job in self._active:
            self._active.remove(job)
            self._jobs_changed += 1
        if job.feed is not None:
            if threading.current_thread() is self._thread:
                self._deliveries.append((job.feed, (result,)))  # after the tokens not delivered yet
            else:
                job.feed.close(result)
        job.done.set()
        if job.on_done is not None:
            try:
                job.on_done()
            except Exception:  # the caller's callback: its failure is not the worker's, nor the other jobs'
                log.exception("model %s: a request's completion callback failed", self.name)

    def _went_idle(self, state: ContextState) -> None:
        """A context's request is done (worker thread): it is now the most recently used idle context.

        Beyond ``warm_contexts`` idle ones, the least recently used gives up its slot (the cells stay,
        unowned, for any context whose tokens share their prefix) and its sampler (a new one is made
        for its next request, the same as a reset one), unless it is in the middle of a stream, whose
        sampler's history is kept.  So a guest's thousands of unused contexts hold no sequence and no
        sampler; their tokens are in the front end's context, and decoded again when they are used.
        """
        if state.closed:
            return
        self._idle[state] = None
        self._idle.move_to_end(state)
        while len(self._idle) > self.warm_contexts:
            old, _ = self._idle.popitem(last=False)
            if old.slot is not None:
                if old.slot.owner is old:
                    old.slot.owner = None
                old.slot = None
                self.paused_streams.lost_sequence(old)
            if old.sampler is not None and not old.mid_stream:
                old.sampler.close()
                old.sampler = None
                old.sampler_params = None
            self.evictions += 1
