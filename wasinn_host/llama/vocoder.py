"""The vocoder of a TTS graph: a WavTokenizer decoder (``wavtokenizer-dec``) run by llama.cpp as an embedding model.

Audio codes go in as one batch of tokens (positions 0..n-1, one sequence) through ``llama_encode``, as
llama.cpp's ``tts`` tool does; out comes one frame of 1282 values per code (641 log-magnitudes and 641
phases), which ``core/tts/audio.py`` turns into samples.  The decoder attends over all codes at once, so
they must fit one micro-batch: the context is made as large as the codes of each call need, up to
``max_codes`` (the graph's larger of ``batch-size`` and ``ubatch-size``, as WasmEdge sizes its vocoder
context from the graph's).  One lock serialises the graph's computations on the one context.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.errors import ErrorKind, WasiNNError, invalid
from ..core.tts.audio import FRAME_WIDTH
from . import cpu_probe
from .bindings import llama_cpp
from .load_errors import load_failure_cause
from .log import capture_llama_log

ARCH = "wavtokenizer-dec"
_MIN_CONTEXT = 256


def _meta(model: Any, key: str) -> str:
    """A GGUF metadata value of ``model`` as text ("" if absent)."""
    buf = ctypes.create_string_buffer(128)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


class Vocoder:
    """A loaded WavTokenizer decoder: :meth:`frames` turns codes into spectrum frames."""

    def __init__(self, path: Path, threads: int, max_codes: int, n_gpu_layers: int = 0) -> None:
        self.path = path
        self.threads = threads
        self.max_codes = max_codes
        cpu_probe.prepare_for_file(path)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        with capture_llama_log() as lines:
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise invalid(
                f"config key 'model-vocoder': llama.cpp could not load {str(path)!r}: {load_failure_cause(lines)}"
            )
        self.ptr = model
        self.ctx: Any = None
        self._capacity = 0
        self._lock = threading.Lock()
        arch = _meta(model, "general.architecture")
        vocab_size = _meta(model, f"{arch}.vocab_size")
        self.n_vocab: int = int(vocab_size) if vocab_size.isdigit() else 0
        """The codebook size (the GGUF's ``vocab_size``: the decoder has no tokenizer)."""
        self.width: int = llama_cpp.llama_model_n_embd_out(model)
        if arch != ARCH or self.width != FRAME_WIDTH:
            self.close()
            raise invalid(
                f"config key 'model-vocoder': {str(path)!r} is a {arch!r} model with {self.width} outputs per "
                f"token; expected a WavTokenizer decoder ({ARCH!r}, {FRAME_WIDTH} outputs)"
            )

    def _context(self, n_codes: int) -> Any:
        """A context for ``n_codes`` codes in one micro-batch (made again, larger, when a call needs more)."""
        if self.ctx is not None and n_codes <= self._capacity:
            return self.ctx
        capacity = min(max(_MIN_CONTEXT, 1 << (n_codes - 1).bit_length()), self.max_codes)
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = capacity
        cparams.n_seq_max = 1
        cparams.embeddings = True
        cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        cparams.n_threads = cparams.n_threads_batch = self.threads
        with capture_llama_log():
            self.ctx = llama_cpp.llama_init_from_model(self.ptr, cparams)
        if not self.ctx:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"vocoder {self.path.name}: llama.cpp could not make a context")
        self._capacity = capacity
        return self.ctx

    def frames(self, codes: Sequence[int]) -> np.ndarray:
        """The spectrum frames of ``codes`` (an array of shape (len(codes), 1282)); a runtime error if the codes
        are empty, more than ``max_codes``, outside the vocoder's codebook, or llama.cpp fails."""
        n = len(codes)
        if n == 0:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, "text-to-speech: the model generated no audio codes")
        if n > self.max_codes:
            raise WasiNNError(
                ErrorKind.RUNTIME_ERROR,
                f"text-to-speech: {n} audio codes exceed the vocoder's batch of {self.max_codes} "
                "(raise batch-size and ubatch-size)",
            )
        bad = [code for code in codes if not 0 <= code < self.n_vocab]
        if bad:
            raise WasiNNError(
                ErrorKind.RUNTIME_ERROR,
                f"text-to-speech: audio code {bad[0]} is outside the vocoder's codebook of {self.n_vocab}",
            )
        with self._lock:
            ctx = self._context(n)
            batch = llama_cpp.llama_batch_init(n, 0, 1)
            try:
                for i, code in enumerate(codes):
                    batch.token[i] = code
                    batch.pos[i] = i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = True
                batch.n_tokens = n
                with capture_llama_log():
                    rc = llama_cpp.llama_encode(ctx, batch)
                if rc != 0:
                    raise WasiNNError(
                        ErrorKind.RUNTIME_ERROR, f"text-to-speech: the vocoder failed (llama_encode {rc})"
                    )
                data = llama_cpp.llama_get_embeddings(ctx)
                return np.ctypeslib.as_array(data, shape=(n * self.width,)).reshape(n, self.width).copy()
            finally:
                llama_cpp.llama_batch_free(batch)

    def close(self) -> None:
        """Free the context and the weights."""
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None
