"""One worker thread per loaded model: sequences, continuous batching, KV prefix reuse.

The worker owns the llama.cpp context.  Guest threads never touch it: they submit a
:class:`Job` and wait on its event.  Each loop of the worker

1. gives waiting jobs a slot (a llama.cpp sequence id), preferring the slot that
   already holds the longest prefix of the job's tokens, and trims that slot's KV
   cache from the first differing token (so a repeated prompt prefix is not decoded
   again);
2. packs one token for every generating job and prompt chunks for the others into
   a single ``llama_decode`` of at most ``n_batch`` tokens;
3. samples every job whose tokens are all decoded and applies its stop rules.

A job asks for ``limit`` sampled tokens after ``tokens`` (prompt plus anything generated
before).  ``compute`` is one job with ``limit = n-predict``; each ``compute_single``
is one job with ``limit = 1`` whose tokens include the previously sampled ones.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .config import SamplingParams, StopParams
from .errors import Errno, WasiNNError
from .llama_backend import Batch, LlamaContext, LlamaModel, Sampler, top_probabilities

log = logging.getLogger("wasinn_host")


class Sequence:
    """The engine-side state of one execution context (its sampler and slot affinity)."""

    def __init__(self) -> None:
        self.sampler: Sampler | None = None
        self.sampler_params: SamplingParams | None = None
        self.slot: Slot | None = None
        self.closed = False
        self.cancelled = False


@dataclass
class Slot:
    """One llama.cpp sequence id and the tokens its KV cache holds."""

    seq_id: int
    kv: list[int] = field(default_factory=list)
    owner: Sequence | None = None
    busy: bool = False
    last_used: float = 0.0


@dataclass
class Job:
    """A request from a guest thread: decode ``tokens``, then sample up to ``limit`` tokens."""

    sequence: Sequence
    tokens: list[int]
    limit: int
    sampling: SamplingParams
    stopping: StopParams
    streaming: bool = False
    """A ``compute_single`` step: only end-of-generation and context-full stop it."""
    reset_sampler: bool = True
    cache_prompt: bool = True
    priority: int = 0
    queue_timeout_ms: int = 0
    ctx_shift: bool = False
    n_keep: int = 0
    max_output_bytes: int = 1 << 62
    embed: bool = False
    """Embedding mode: decode the prompt and return its embedding instead of sampling."""
    on_piece: Callable[[bytes], None] | None = None
    # results
    generated: list[int] = field(default_factory=list)
    probs: list[tuple[int, list[tuple[int, float]]]] = field(default_factory=list)
    embedding: list[float] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    errno: Errno = Errno.SUCCESS
    stop_reason: str = ""
    prompt_ms: float = 0.0
    generation_ms: float = 0.0
    reused_tokens: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    # worker state
    slot: Slot | None = None
    _order: int = 0
    _logits_index: int = -1
    _t_start: float = 0.0
    _t_first: float = 0.0


class ModelWorker:
    """Drives one llama.cpp context from one thread for every execution context of a model."""

    def __init__(self, model: LlamaModel, context: LlamaContext, name: str, max_queue: int = 256) -> None:
        self.model = model
        self.max_queue = max_queue
        self.context = context
        self.name = name
        self.n_ctx_seq = context.n_ctx_seq
        self.slots = [Slot(i) for i in range(context.n_seq)]
        self._batch = Batch(context.n_batch)
        self._incoming: collections.deque[Job] = collections.deque()
        self._waiting: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []
        self._releases: list[Sequence] = []
        self._cv = threading.Condition()
        self._closing = False
        self.decode_calls = 0
        self.decoded_tokens = 0
        self.generated_tokens = 0
        self.sequences_decoded = 0  # summed over decode calls: busy sequences per decode
        self.requests = 0
        self.rejected = 0
        self.reused_tokens = 0
        self._submitted = 0
        self._thread = threading.Thread(target=self._run, name=f"wasinn-model-{name}", daemon=True)
        self._thread.start()

    # -- guest-thread side ---------------------------------------------------------

    def submit(self, job: Job) -> Job:
        """Queue a job and wait until the worker finishes it."""
        if job.sequence.closed or job.sequence.cancelled:
            job.errno = Errno.RUNTIME_ERROR if job.sequence.cancelled else Errno.INVALID_ARGUMENT
            job.stop_reason = "cancelled" if job.sequence.cancelled else "context finalised"
            job.done.set()
            return job
        job._t_start = time.perf_counter()
        with self._cv:
            if self._closing:
                job.errno = Errno.RUNTIME_ERROR
                job.stop_reason = "model closed"
                job.done.set()
                return job
            if len(self._incoming) + len(self._waiting) >= self.max_queue:
                self.rejected += 1
                job.errno = Errno.BUSY
                job.stop_reason = f"queue full: {self.max_queue} requests are waiting for model {self.name}"
                job.done.set()
                return job
            self._submitted += 1
            job._order = self._submitted
            self.requests += 1
            self._incoming.append(job)
            self._cv.notify()
        job.done.wait()
        return job

    @property
    def queued(self) -> int:
        """Requests waiting for a free sequence."""
        return len(self._incoming) + len(self._waiting)

    @property
    def active(self) -> int:
        """Requests being decoded now."""
        return len(self._active)

    def release(self, sequence: Sequence) -> None:
        """Forget an execution context: free its sampler; its slot's KV stays reusable."""
        sequence.closed = True
        with self._cv:
            self._releases.append(sequence)
            self._cv.notify()

    def close(self) -> None:
        """Stop the thread (after the jobs in flight) and free the llama.cpp context."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()
        self._batch.close()
        self.context.close()

    @property
    def busy_sequences(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    # -- worker thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._incoming or self._releases or self._closing) and not self._active and not self._waiting:
                    self._cv.wait()
                if self._closing and not (self._incoming or self._active or self._waiting):
                    self._do_releases()
                    return
                self._waiting.extend(self._incoming)
                self._incoming.clear()
                self._do_releases()
            try:
                self._assign_slots()
                if self._active:
                    self._step()
                elif self._waiting:
                    with self._cv:  # every slot busy: wait for a job to finish
                        self._cv.wait(0.01)
            except Exception as exc:  # a bug must not hang guests
                log.exception("model %s: worker error: %s", self.name, exc)
                for job in self._active + list(self._waiting):
                    self._finish(job, Errno.RUNTIME_ERROR, "internal error")
                self._waiting.clear()

    def _do_releases(self) -> None:
        for sequence in self._releases:
            if sequence.slot is not None and sequence.slot.owner is sequence:
                sequence.slot.owner = None
            if sequence.sampler is not None:
                sequence.sampler.close()
                sequence.sampler = None
        self._releases.clear()

    def _assign_slots(self) -> None:
        """Start waiting jobs, highest priority first, then in arrival order; expire old ones."""
        still_waiting: collections.deque[Job] = collections.deque()
        now = time.perf_counter()
        for job in sorted(self._waiting, key=lambda j: (-j.priority, j._order)):
            if job.sequence.cancelled:
                self._finish(job, Errno.RUNTIME_ERROR, "cancelled")
                continue
            if job.queue_timeout_ms and (now - job._t_start) * 1000.0 > job.queue_timeout_ms:
                log.warning("model %s: a request waited more than queue-timeout-ms=%d for a free sequence; "
                            "answered Busy", self.name, job.queue_timeout_ms)
                self._finish(job, Errno.BUSY, "queue timeout")
                continue
            if still_waiting and not self._has_free_slot():
                still_waiting.append(job)
                continue
            slot = self._pick_slot(job)
            if slot is None:
                still_waiting.append(job)
                continue
            try:
                self._start(job, slot)
            except WasiNNError as err:
                log.warning("model %s: %s", self.name, err)
                self._finish(job, err.errno, err.message)
        self._waiting = still_waiting

    def _has_free_slot(self) -> bool:
        return any(not s.busy for s in self.slots)

    def _pick_slot(self, job: Job) -> Slot | None:
        """The job's own slot, else the free slot sharing the longest real prefix, else the lowest id.

        Keeping busy slots at low, consecutive ids matters: llama.cpp splits a batch whose
        sequence ids are not consecutive into several forward passes.
        """
        own = job.sequence.slot
        if own is not None and own.owner is job.sequence and not own.busy:
            return own
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None
        unowned = [s for s in free if s.owner is None] or free

        def score(slot: Slot) -> tuple[int, int]:
            shared = _common_prefix(slot.kv, job.tokens)
            return (shared if shared > 1 else 0, -slot.seq_id)  # BOS alone is no reuse

        return max(unowned, key=score)

    def _start(self, job: Job, slot: Slot) -> None:
        if not job.tokens:
            self._finish(job, Errno.INVALID_ARGUMENT, "empty prompt")
            return
        if slot.owner is not None and slot.owner is not job.sequence:
            slot.owner.slot = None
        slot.owner = job.sequence
        slot.busy = True
        job.sequence.slot = slot
        job.slot = slot
        keep = _common_prefix(slot.kv, job.tokens) if job.cache_prompt and not job.embed else 0
        if keep == len(job.tokens):
            keep -= 1  # the last token must be decoded again to get its logits
        if keep < len(slot.kv):
            self.context.seq_rm(slot.seq_id, keep)
            del slot.kv[keep:]
        job.reused_tokens = keep
        self.reused_tokens += keep
        sequence = job.sequence
        if sequence.sampler is None or sequence.sampler_params != job.sampling:
            if sequence.sampler is not None:
                sequence.sampler.close()
            sequence.sampler = Sampler(self.model, job.sampling, self.n_ctx_seq)
            sequence.sampler_params = job.sampling
        elif job.reset_sampler:
            sequence.sampler.reset()  # a streaming step keeps the chain's history
        self._active.append(job)

    def _step(self) -> None:
        for job in [j for j in self._active if j.sequence.cancelled]:
            self._finish(job, Errno.RUNTIME_ERROR, "cancelled")
        if not self._active:
            return
        batch = self._batch
        batch.clear()
        budget = batch.capacity
        # generating jobs first (one token each), then prompt chunks
        ordered = sorted(self._active, key=lambda j: len(j.tokens) - len(j.slot.kv) if j.slot else 0)
        planned: list[tuple[Job, int]] = []
        for job in ordered:
            slot = job.slot
            assert slot is not None
            pending = len(job.tokens) - len(slot.kv)
            if pending <= 0 or budget <= 0:
                continue
            take = min(pending, budget)
            budget -= take
            planned.append((job, take))
        # tokens in sequence-id order, so llama.cpp can run them in one pass
        planned.sort(key=lambda item: item[0].slot.seq_id if item[0].slot else 0)
        in_batch: list[Job] = []
        for job, take in planned:
            slot = job.slot
            assert slot is not None
            start = len(slot.kv)
            last = start + take == len(job.tokens)
            for offset in range(take):
                pos = start + offset
                index = batch.add(job.tokens[pos], pos, slot.seq_id, last and offset == take - 1)
            slot.kv.extend(job.tokens[start:start + take])
            job._logits_index = index if last else -1
            in_batch.append(job)
        if batch.n == 0:
            return
        rc = self.context.decode(batch)
        self.decode_calls += 1
        self.decoded_tokens += batch.n
        self.sequences_decoded += len(in_batch)
        if rc != 0:
            log.error("model %s: llama_decode failed with %d for %d tokens", self.name, rc, batch.n)
            for job in in_batch:
                slot = job.slot
                assert slot is not None
                self.context.seq_rm(slot.seq_id, 0)
                slot.kv.clear()
                self._finish(job, Errno.RUNTIME_ERROR, "decode failed")
            return
        now = time.perf_counter()
        for job in in_batch:
            if job._logits_index >= 0:
                if not job._t_first:
                    job._t_first = now
                    job.prompt_ms = (now - job._t_start) * 1000.0
                if job.embed:
                    self._embed(job)
                else:
                    self._sample(job)

    def _embed(self, job: Job) -> None:
        slot = job.slot
        assert slot is not None
        job.embedding = self.context.embeddings(slot.seq_id, job._logits_index)
        self.context.seq_rm(slot.seq_id, 0)  # embeddings are one-shot: free the cells
        slot.kv.clear()
        self._finish(job, Errno.SUCCESS, "embedding")

    def _sample(self, job: Job) -> None:
        if len(job.generated) >= job.limit:  # n-predict 0: prompt only
            self._finish(job, Errno.SUCCESS, "limit")
            return
        sequence = job.sequence
        assert sequence.sampler is not None
        if job.sampling.n_probs > 0:
            top = top_probabilities(self.context, job._logits_index, job.sampling.n_probs)
        token = sequence.sampler.sample(self.context, job._logits_index)
        if job.sampling.n_probs > 0:
            job.probs.append((token, top))
        piece = self.model.piece(token)
        job.generated.append(token)
        job.text += piece
        self.generated_tokens += 1
        eog = self.model.is_eog(token) and not job.stopping.ignore_eos
        if job.streaming:
            if eog:
                self._finish(job, Errno.END_OF_SEQUENCE, "eos")
            elif len(job.tokens) + 1 > self.n_ctx_seq:
                self._finish(job, Errno.CONTEXT_FULL, "context full")
            else:
                self._finish(job, Errno.SUCCESS, "token")
            return
        if job.on_piece is not None:
            job.on_piece(piece)
        stop = job.stopping
        if stop.reverse_prompt and stop.reverse_prompt.encode() in job.text:
            self._finish(job, Errno.SUCCESS, "reverse-prompt")
        elif stop.stop and _cut_at_stop(job.text, stop.stop, len(piece)):
            self._finish(job, Errno.SUCCESS, "stop")
        elif eog:
            self._finish(job, Errno.SUCCESS, "eos")
        elif len(job.generated) >= job.limit:
            self._finish(job, Errno.SUCCESS, "n-predict")
        elif stop.max_time_ms and (time.perf_counter() - job._t_start) * 1000.0 >= stop.max_time_ms:
            self._finish(job, Errno.SUCCESS, "max-time")
        elif len(job.text) > job.max_output_bytes:
            log.warning("model %s: output reached max_output_bytes=%d; generation stopped "
                        "(raise it with Limits(max_output_bytes=...) or `wasinn run --max-output-bytes`)",
                        self.name, job.max_output_bytes)
            self._finish(job, Errno.TOO_LARGE, "output limit")
        elif len(job.tokens) + 1 > self.n_ctx_seq and not (job.ctx_shift and self._shift(job)):
            self._finish(job, Errno.CONTEXT_FULL, "context full")
        else:
            job.tokens.append(token)  # decoded in the next batch

    def _shift(self, job: Job) -> bool:
        """Context shift (llama.cpp server style): keep ``n_keep`` tokens, drop half of the rest."""
        slot = job.slot
        assert slot is not None
        n_keep = len(job.tokens) if job.n_keep < 0 else min(job.n_keep, len(job.tokens))
        n_discard = (len(slot.kv) - n_keep) // 2
        if n_discard <= 0 or not self.context.can_shift():
            return False
        self.context.seq_shift(slot.seq_id, n_keep, n_discard)
        del slot.kv[n_keep:n_keep + n_discard]
        del job.tokens[n_keep:n_keep + n_discard]
        return True

    def _finish(self, job: Job, errno: Errno, reason: str) -> None:
        job.errno = errno
        job.stop_reason = reason
        now = time.perf_counter()
        if job._t_first:
            job.generation_ms = (now - job._t_first) * 1000.0
        else:
            job.prompt_ms = (now - job._t_start) * 1000.0
        if job.slot is not None:
            job.slot.busy = False
            job.slot.last_used = now
        if job in self._active:
            self._active.remove(job)
        job.done.set()


def _cut_at_stop(text: bytearray, stops: tuple[str, ...], new_bytes: int) -> bool:
    """If a stop string now occurs in ``text``, cut the text where it starts and return True."""
    for stop in stops:
        needle = stop.encode()
        if not needle:
            continue
        start = max(0, len(text) - new_bytes - len(needle) + 1)
        at = text.find(needle, start)
        if at >= 0:
            del text[at:]
            return True
    return False


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix (the usual cases, one list extending the other, at C speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def print_piece(piece: bytes) -> None:
    """``stream-stdout``: write a piece to the host's stdout at once."""
    out = sys.stdout
    try:
        out.flush()
        out.buffer.write(piece)
        out.buffer.flush()
    except (AttributeError, ValueError):
        out.write(piece.decode("utf-8", "replace"))
        out.flush()
