"""A llama.cpp context with one KV stream per sequence: batches, decoding, per-sequence KV edits and
saved state, embeddings and the probabilities of the next token.

llama.cpp aborts the whole process on some misuse (a batch larger than ``n_batch``,
non-consecutive positions), so callers (``core/scheduling/scheduler.py``) keep those invariants.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from ..core.config.kv_types import GGML_TYPES, check_flash_attn
from ..core.config.params import ModelParams, SamplingParams
from ..core.errors import ErrorKind, WasiNNError
from ..core.gil_calls import holding_gil
from ..core.runtime import KvLayout
from . import devices
from .batch_sampling import draw
from .bindings import llama_cpp
from .buffers import context_buffers, max_outputs, release_output_rows
from .context_params import set_embedding_and_rope
from .load_errors import load_failure_cause
from .log import capture_llama_log
from .model import LlamaModel, default_threads, kv_cache_bytes
from .sampler import Sampler
from .vision import ImageSpan

log = logging.getLogger("wasinn_host")


class Batch:
    """A reusable ``llama_batch`` of up to ``capacity`` tokens, one sequence id each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.n = 0
        self.n_outputs = 0
        """Tokens whose logits the batch asks for (llama.cpp's output rows)."""

    def clear(self) -> None:
        """Empty the batch."""
        self.n = 0
        self.n_outputs = 0

    def add(self, token: int, pos: int, seq_id: int, want_logits: bool) -> int:
        """Append a token; return its index in the batch (for sampling its logits)."""
        i = self.n
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq_id
        raw.logits[i] = want_logits
        self.n = i + 1
        self.n_outputs += want_logits
        return i

    def rewrite(self, index: int, token: int, pos: int) -> None:
        """Put another token and position at ``index``; its sequence id and logits flag stay."""
        raw = self.raw
        raw.token[index] = token
        raw.pos[index] = pos

    def part(self, first: int, count: int) -> llama_cpp.llama_batch:
        """A ``llama_batch`` over ``count`` of this batch's tokens from index ``first`` (its arrays,
        not a copy: valid until the batch is changed or freed)."""
        raw, view = self.raw, llama_cpp.llama_batch()
        view.n_tokens = count
        view.token = _advanced(raw.token, first)
        view.pos = _advanced(raw.pos, first)
        view.n_seq_id = _advanced(raw.n_seq_id, first)
        view.seq_id = _advanced(raw.seq_id, first)
        view.logits = _advanced(raw.logits, first)
        return view

    def close(self) -> None:
        """Free the batch."""
        if self.raw is not None:
            self.raw.n_tokens = self.capacity
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


def _advanced(pointer: Any, n: int) -> Any:
    """A ctypes pointer ``n`` elements past ``pointer``."""
    address = ctypes.cast(pointer, ctypes.c_void_p).value or 0
    return ctypes.cast(address + n * ctypes.sizeof(pointer._type_), type(pointer))


class LlamaContext:
    """A llama.cpp context with ``layout.n_seq`` independent sequences of ``layout.n_ctx_seq`` tokens each."""

    def __init__(self, model: LlamaModel, params: ModelParams, layout: KvLayout) -> None:
        cparams = llama_cpp.llama_context_default_params()
        n_seq, n_ctx_seq = layout.n_seq, layout.n_ctx_seq
        cparams.n_ctx = layout.n_cells
        cparams.n_batch = params.batch_size
        cparams.n_ubatch = min(params.ubatch_size, params.batch_size)
        if params.embedding:  # a pooled sequence must be in one ubatch (llama.cpp's embedding example)
            cparams.n_ubatch = params.batch_size
        cparams.n_seq_max = n_seq
        threads = params.threads if params.threads > 0 else default_threads()
        cparams.n_threads = threads
        cparams.n_threads_batch = params.threads_batch if params.threads_batch > 0 else threads
        cparams.embeddings = params.embedding
        cparams.kv_unified = False  # one stream per sequence: attention only over its own cells
        cparams.flash_attn_type = {
            "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "enabled": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
            "disabled": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }.get(params.flash_attn, llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
        set_embedding_and_rope(cparams, params)
        check_flash_attn(params.type_v, params.flash_attn)
        cparams.type_k, cparams.type_v = GGML_TYPES[params.type_k], GGML_TYPES[params.type_v]
        if not cparams.embeddings:  # an embedding context outputs every token (llama.cpp's default then)
            cparams.n_outputs_max = max_outputs(n_seq)
        info: list[str] = []
        with capture_llama_log(info) as problems:
            ctx = llama_cpp.llama_init_from_model(model.ptr, cparams)
        if not ctx:
            cause = f": {load_failure_cause(problems)}" if problems else ""
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"llama.cpp could not create a context of {cparams.n_ctx} tokens for {str(model.path)!r}{cause}",
            )
        self.ptr = ctx
        self.model = model
        self.n_seq = n_seq
        self.n_ctx_seq = n_ctx_seq
        self.n_batch: int = llama_cpp.llama_n_batch(ctx)
        self.memory = llama_cpp.llama_get_memory(ctx)
        # where the last decode's logits are: read a step at a time, after llama_synchronize (no waiting)
        self.logits_base = holding_gil(llama_cpp.llama_get_logits, ctypes.c_void_p)
        self.logits_ith = holding_gil(llama_cpp.llama_get_logits_ith, ctypes.c_void_p)
        # the KV cache's bookkeeping (cells' metadata; a copy's buffers move at the next decode)
        self._seq_rm = holding_gil(llama_cpp.llama_memory_seq_rm)
        self._seq_cp = holding_gil(llama_cpp.llama_memory_seq_cp)
        self._seq_add = holding_gil(llama_cpp.llama_memory_seq_add)
        self._logits_view: tuple[int, int, Any] = (0, 0, None)
        self.threads = threads
        self.n_outputs_max: int = cparams.n_outputs_max or self.n_batch
        """The most logits rows one batch may ask for (llama.cpp aborts the process beyond it)."""
        self.offloaded = model.n_gpu_layers != 0 and devices.can_offload()
        """Whether the model's layers run on a GPU (the CPU threads then mostly wait for it)."""
        if not cparams.embeddings and not self.offloaded:
            release_output_rows(ctx, params.decode_logits_rows, n_seq, model.n_vocab)
        self.buffers: dict[str, int] = context_buffers(info)
        """Bytes of the KV cache, output buffer and compute buffers llama.cpp allocated (its log)."""
        self.kv_bytes = self.buffers.get("kv") or kv_cache_bytes(model, cparams.n_ctx, params.type_k, params.type_v)
        self.n_embd_out: int = model.n_embd
        """Floats of one sequence's embedding: a reranker's classes (``n_cls_out``) with rank pooling."""
        if llama_cpp.llama_pooling_type(ctx) == llama_cpp.LLAMA_POOLING_TYPE_RANK:
            self.n_embd_out = max(int(llama_cpp.llama_model_n_cls_out(model.ptr)), 1)

    def decode_image(self, span: ImageSpan, pos: int, seq_id: int) -> int:
        """Encode an image of the prompt and decode its embeddings into ``seq_id`` at ``pos`` (0 = done)."""
        if self.model.vision is None:
            return -1
        return self.model.vision.decode(self.ptr, span, pos, seq_id, self.n_batch)

    def new_batch(self) -> Batch:
        """A reusable batch of ``n_batch`` tokens."""
        return Batch(self.n_batch)

    def new_sampler(self, params: SamplingParams) -> Sampler:
        """A sampler chain for one execution context."""
        return Sampler(self.model, params, self.n_ctx_seq)

    def top_probabilities(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        """The ``n`` most likely next tokens at ``batch_index`` and their probabilities."""
        return top_probabilities(self, batch_index, n)

    def greedy_tokens(self, batch_indices: list[int]) -> list[int]:
        """The most likely token at each of ``batch_indices`` of the last decode (the first of equal
        maxima, as llama.cpp's greedy sampler): one ``numpy.argmax`` over their logits rows together."""
        return greedy_tokens(self, batch_indices)

    def drawn_tokens(self, batch_indices: list[int], samplers: list[Sampler]) -> list[int]:
        """The token each of ``samplers`` (drawing as arrays: :attr:`.Sampler.draws_together`) draws
        from its row at ``batch_indices`` of the last decode, the rows of one sampler kind together:
        the tokens llama.cpp's chain would draw (:mod:`.batch_sampling`)."""
        return drawn_tokens(self, batch_indices, samplers)

    def decode(self, batch: Batch, first: int = 0, count: int | None = None) -> int:
        """Run one ``llama_decode`` of ``count`` tokens (None: the rest) from index ``first`` of the batch;
        0 on success (llama.cpp's return code otherwise; -1, as llama.cpp answers an invalid batch, for
        more logits rows than the context has room for).  Logits are then indexed from ``first``."""
        count = batch.n - first if count is None else count
        whole = first == 0 and count == batch.n
        rows = batch.n_outputs if whole else sum(batch.raw.logits[first : first + count])
        if rows > self.n_outputs_max:
            log.error("a batch asks for %d logits rows; the context has room for %d", rows, self.n_outputs_max)
            return -1
        if whole:
            batch.raw.n_tokens = batch.n
            return int(llama_cpp.llama_decode(self.ptr, batch.raw))
        return int(llama_cpp.llama_decode(self.ptr, batch.part(first, count)))

    def logits_view(self, base: int, rows: int) -> Any:
        """The first ``rows`` rows of llama.cpp's logits array at address ``base`` as a numpy array (no
        copy); the same array while llama.cpp keeps its logits there (a view made anew costs tens of
        microseconds a step)."""
        import numpy as np

        held_base, held_rows, view = self._logits_view
        if held_base != base or held_rows < rows:
            n_vocab = self.model.n_vocab
            floats = (ctypes.c_float * (rows * n_vocab)).from_address(base)
            view = np.frombuffer(memoryview(floats), dtype=np.float32).reshape(rows, n_vocab)
            self._logits_view = (base, rows, view)
        return view[:rows]

    def synchronize(self) -> None:
        """``llama_synchronize``: wait until the device has finished the last decode."""
        llama_cpp.llama_synchronize(self.ptr)

    def seq_rm(self, seq_id: int, start: int) -> None:
        """Drop the sequence's cells from position ``start`` on."""
        self._seq_rm(self.memory, seq_id, start, -1)

    def seq_copy(self, src: int, dst: int) -> None:
        """Replace ``dst``'s cells by a copy of ``src``'s.  Each sequence has its own stream (``kv_unified``
        off), so llama.cpp copies the whole stream's buffers at the next decode; it accepts nothing but
        the whole range there (any other aborts the process), so callers trim ``dst`` afterwards."""
        self._seq_cp(self.memory, src, dst, -1, -1)

    def seq_length(self, seq_id: int) -> int:
        """Cells the sequence holds (``llama_memory_seq_pos_max`` + 1)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id)) + 1

    def state_get(self, seq_id: int) -> memoryview:
        """The KV state of one sequence (``llama_state_seq_get_data``)."""
        size = llama_cpp.llama_state_seq_get_size(self.ptr, seq_id)
        buf = (ctypes.c_ubyte * size)()
        written = llama_cpp.llama_state_seq_get_data(self.ptr, buf, size, seq_id)
        return memoryview(buf).cast("B")[:written]

    def state_set(self, seq_id: int, data: memoryview) -> bool:
        """Load a sequence's KV state (``llama_state_seq_set_data``, read in place from a writable
        buffer); False if llama.cpp refuses it (another layout, no room).  State saved by a context with
        another number of sequences (one KV stream each) is given this context's stream count first."""
        data = restreamed(data, self.n_seq, self.model)
        size = len(data)
        buf = (ctypes.c_ubyte * size).from_buffer(data)
        return size > 0 and int(llama_cpp.llama_state_seq_set_data(self.ptr, buf, size, seq_id)) == size

    def can_shift(self) -> bool:
        """Whether this model's KV cache supports moving positions (context shift)."""
        return bool(llama_cpp.llama_memory_can_shift(self.memory))

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None:
        """Drop ``discard`` cells after the first ``keep`` and move the rest back."""
        self._seq_rm(self.memory, seq_id, keep, keep + discard)
        self._seq_add(self.memory, seq_id, keep + discard, -1, -discard)

    def embeddings(self, seq_id: int, batch_index: int) -> list[float]:
        """The pooled embedding of a sequence (a reranker's scores with rank pooling), or the given token's
        if there is no pooling."""
        ptr = llama_cpp.llama_get_embeddings_seq(self.ptr, seq_id)
        if ptr:
            return list(ptr[: self.n_embd_out])
        ptr = llama_cpp.llama_get_embeddings_ith(self.ptr, batch_index)
        if not ptr:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, "llama.cpp returned no embedding")
        return list(ptr[: self.model.n_embd])

    def close(self) -> None:
        """Free the context."""
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None


_STATE_STREAMS_AT = 8
"""Where a sequence state's stream count starts (after llama.cpp's 8-byte header)."""


def restreamed(data: memoryview, n_stream: int, model: LlamaModel) -> memoryview:
    """One sequence's KV state for a context of ``n_stream`` streams.  llama.cpp writes the stream count,
    then per stream a cell count (0 for every stream but the sequence's) and that stream's cells, and
    refuses another count on reading; for a model with one KV cache (no sliding window: an iSWA model
    writes two caches, which this leaves alone) the count is rewritten and the missing streams added
    as empty, or dropped if they are empty."""
    at = _STATE_STREAMS_AT
    if len(data) < at + 4 or llama_cpp.llama_model_n_swa(model.ptr) > 0:
        return data
    saved = int.from_bytes(data[at : at + 4], "little")
    if saved == n_stream or not 0 < saved <= 4096:
        return data
    body = bytes(data[at + 4 :])
    if saved > n_stream:
        extra = (saved - n_stream) * 4
        if len(body) < extra or any(body[len(body) - extra :]):
            return data
        body = body[: len(body) - extra]
    else:
        body += bytes(4 * (n_stream - saved))
    return memoryview(bytearray(bytes(data[:at]) + n_stream.to_bytes(4, "little") + body))


def greedy_tokens(ctx: LlamaContext, batch_indices: list[int]) -> list[int]:
    """:meth:`LlamaContext.greedy_tokens`: one ``argmax`` over llama.cpp's rows up to the last asked for
    (:func:`logits_block`; no copy of them), or one a row where they are fewer than half of those."""
    import numpy as np

    if not batch_indices:
        return []
    block, rows = logits_block(ctx, batch_indices)
    if rows is None:
        return np.argmax(block, axis=1).tolist()
    if 2 * len(rows) >= len(block):
        return np.argmax(block, axis=1)[rows].tolist()
    return [int(block[row].argmax()) for row in rows]


def drawn_tokens(ctx: LlamaContext, batch_indices: list[int], samplers: list[Sampler]) -> list[int]:
    """:meth:`LlamaContext.drawn_tokens`: the rows (:func:`logits_rows`) drawn by kind as arrays."""
    if not batch_indices:
        return []
    draws = [sampler.draw for sampler in samplers]
    assert all(d is not None for d in draws), "drawn_tokens: a sampler that does not draw as arrays"
    return draw(logits_rows(ctx, batch_indices), draws)  # type: ignore[arg-type]


def logits_rows(ctx: LlamaContext, batch_indices: list[int]) -> Any:
    """The logits rows of ``batch_indices`` of the last decode as one ``(n, n_vocab)`` float32 array: a
    view of llama.cpp's array when they are its first rows in order (as a step of one token per sequence
    asks), else a copy of the rows (:func:`logits_block`)."""
    block, rows = logits_block(ctx, batch_indices)
    return block if rows is None else block[rows]


def logits_block(ctx: LlamaContext, batch_indices: list[int]) -> tuple[Any, list[int] | None]:
    """llama.cpp's logits rows of the last decode from its first up to the last of ``batch_indices``'
    rows (a view, no copy), and the row of each index in it (None: the view's rows are the indices'
    rows, in order).  llama.cpp keeps the logits of a decode's outputs as rows of one array
    (``llama_get_logits``), a batch index mapped to its row (``llama_get_logits_ith`` points into it);
    the rows are found from those pointers."""
    base = ctx.logits_base(ctx.ptr) or 0
    row_bytes = ctx.model.n_vocab * 4  # float32

    def row(index: int) -> int:
        address = ctx.logits_ith(ctx.ptr, index)
        if not address or not base:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"llama.cpp has no logits at batch index {index}")
        return (address - base) // row_bytes

    n = len(batch_indices)
    # rows follow the batch's order of outputs, each index at or after its row: indices 0 .. n-1 whose
    # last is row n-1 are rows 0 .. n-1 (every token of the batch asked for its logits)
    if batch_indices == list(range(n)) and row(n - 1) == n - 1:
        return ctx.logits_view(base, n), None
    rows = [row(index) for index in batch_indices]
    return ctx.logits_view(base, max(rows) + 1), rows


def top_probabilities(ctx: LlamaContext, batch_index: int, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely next tokens and their probabilities (softmax of the raw logits)."""
    import numpy as np

    logits_ptr = llama_cpp.llama_get_logits_ith(ctx.ptr, batch_index)
    logits = np.ctypeslib.as_array(logits_ptr, shape=(ctx.model.n_vocab,)).astype(np.float64)
    top = np.argpartition(-logits, min(n, len(logits) - 1))[:n]
    top = top[np.argsort(-logits[top])]
    exp = np.exp(logits - logits.max())
    probs = exp / exp.sum()
    return [(int(t), float(probs[t])) for t in top]
