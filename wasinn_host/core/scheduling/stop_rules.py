"""Stop rules: after each sampled token, whether a generation (or a streaming step) ends and why;
the context shift that lets a generation go on past a full context; stop strings cut from the text.

Pure functions over the scheduler's slot state (:mod:`.slot_state`) and the model and context they
are given (the worker's context changes when it grows, so none is kept here).
"""

from __future__ import annotations

import logging
import time

from ..generation import StopReason
from ..runtime import Context, Model
from .slot_state import Job

log = logging.getLogger("wasinn_host")


def is_eog(model: Model, job: Job, token: int) -> bool:
    """Whether ``token`` ends generation for this job (an end-of-generation token, unless ``ignore-eos``)."""
    return model.is_eog(token) and not job.request.stopping.ignore_eos


def stream_stop(model: Model, job: Job, token: int, n_ctx_seq: int) -> StopReason:
    """A streaming step always ends after its token: at end of generation, a full context, or done."""
    if is_eog(model, job, token):
        return StopReason.EOS
    if len(job.tokens) + 1 > n_ctx_seq:
        return StopReason.CONTEXT_FULL
    return StopReason.TOKEN


def stop_rule(
    model: Model, context: Context, job: Job, token: int, piece: bytes, n_ctx_seq: int, name: str
) -> StopReason | None:
    """The rule that ends a whole generation after this token, or None to go on (``name``: the model's,
    for the log).  Calls the request's ``on_piece`` first (one that raises ends this request alone, with an
    internal error: the worker's other requests go on); may shift the context (see :func:`shift`)."""
    request, result = job.request, job.result
    stop = request.stopping
    if request.on_piece is not None:
        try:
            request.on_piece(piece)
        except Exception:
            log.exception("model %s: a request's piece callback failed; the request ends", name)
            return StopReason.INTERNAL_ERROR
    if stop.reverse_prompt and stop.reverse_prompt.encode() in result.text:
        return StopReason.REVERSE_PROMPT
    if stop.stop and cut_at_stop(result.text, stop.stop, len(piece)):
        return StopReason.STOP
    if is_eog(model, job, token):
        return StopReason.EOS
    if len(result.generated) >= request.limit:
        return StopReason.N_PREDICT
    if stop.max_time_ms and (time.perf_counter() - job.t_start) * 1000.0 >= stop.max_time_ms:
        return StopReason.MAX_TIME
    if len(result.text) > request.max_output_bytes:
        log.warning(
            "model %s: output reached max_output_bytes=%d; generation stopped "
            "(raise it with Limits(max_output_bytes=...) or `wasinn run --max-output-bytes`)",
            name,
            request.max_output_bytes,
        )
        return StopReason.OUTPUT_LIMIT
    if len(job.tokens) + 1 > n_ctx_seq and not (request.ctx_shift and shift(context, job)):
        return StopReason.CONTEXT_FULL
    return None


def shift(context: Context, job: Job) -> bool:
    """Context shift (llama.cpp server style): keep ``n_keep`` tokens, drop half of the rest."""
    slot = job.slot
    assert slot is not None
    n_keep = len(job.tokens) if job.request.n_keep < 0 else min(job.request.n_keep, len(job.tokens))
    n_discard = (len(slot.kv) - n_keep) // 2
    if n_discard <= 0 or not context.can_shift() or job.position(len(job.tokens)) != len(job.tokens):
        return False  # M-RoPE images: positions are not token indices, so they cannot be moved
    context.seq_shift(slot.seq_id, n_keep, n_discard)
    del slot.kv[n_keep : n_keep + n_discard]
    del job.tokens[n_keep : n_keep + n_discard]
    job.drafter = None  # indexed the tokens before the shift
    job.images = {}  # all decoded by now, and their start indices no longer hold
    return True


def cut_at_stop(text: bytearray, stops: tuple[str, ...], new_bytes: int) -> bool:
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
