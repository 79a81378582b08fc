"""Thin, typed wrappers over llama-cpp-python's low-level ``llama_cpp`` API.

This is the only module that calls llama.cpp.  It knows nothing about guests or
handles: it loads a model, creates a multi-sequence context, tokenizes, decodes
batches, edits the KV cache per sequence and builds sampler chains.

llama.cpp aborts the whole process on some misuse (a batch larger than ``n_batch``,
non-consecutive positions), so callers (``engine.py``) keep those invariants.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

import llama_cpp

from .config import ModelParams, SamplingParams
from .errors import Errno, WasiNNError

log = logging.getLogger("wasinn_host")
llama_log = logging.getLogger("wasinn_host.llama")

LLAMA_CPP_PYTHON_VERSION: str = llama_cpp.__version__
# llama.cpp revision vendored by each supported llama-cpp-python release (its CHANGELOG).
_LLAMA_COMMITS = {"0.3.36": "0c1e57098"}
LLAMA_COMMIT: str = _LLAMA_COMMITS.get(LLAMA_CPP_PYTHON_VERSION, "unknown")
LLAMA_BUILD_NUMBER: int = 0  # not exposed by libllama; WasmEdge reports its CMake build number

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}
_init_lock = threading.Lock()
_initialised = False


@llama_cpp.llama_log_callback
def _route_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """llama.cpp's own log lines go to the ``wasinn_host.llama`` logger (silent by default)."""
    try:
        message = text.decode("utf-8", "replace").rstrip("\n")
        if message:
            llama_log.log(_LEVELS.get(level, logging.DEBUG), "%s", message)
    except Exception:  # never raise into C
        pass


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logging."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        llama_cpp.llama_log_set(_route_llama_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialised = True


def default_threads() -> int:
    """All cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class LlamaModel:
    """Loaded weights and vocabulary; safe to share, read-only after load."""

    def __init__(self, path: Path, params: ModelParams) -> None:
        init_backend()
        self.path = path
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else 2**31 - 1
        mparams.main_gpu = params.main_gpu
        if params.use_mmap:
            mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK if params.use_mlock else llama_cpp.LLAMA_LOAD_MODE_MMAP
        else:
            mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MLOCK if params.use_mlock else llama_cpp.LLAMA_LOAD_MODE_NONE
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise WasiNNError(
                Errno.INVALID_ARGUMENT,
                f"llama.cpp could not load model file {str(path)!r} (not a valid GGUF model, or unsupported)",
            )
        self.ptr = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(model)
        self.n_embd: int = llama_cpp.llama_model_n_embd(model)
        self.size_bytes: int = llama_cpp.llama_model_size(model)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}

    @property
    def description(self) -> str:
        """llama.cpp's one-line model description (type, size, quantisation)."""
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None."""
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids (BOS added and special-token text parsed, as WasmEdge does)."""
        capacity = len(text) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, text, len(text), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, text, len(text), buf, capacity, add_special, parse_special)
        if n < 0:
            raise WasiNNError(Errno.RUNTIME_ERROR, f"tokenization failed ({n})")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token, special tokens rendered (cached)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        piece = buf.raw[: max(n, 0)]
        self._pieces[token] = piece
        return piece

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        cached = self._eog.get(token)
        if cached is None:
            cached = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return cached

    def close(self) -> None:
        """Free the weights."""
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


class Batch:
    """A reusable ``llama_batch`` of up to ``capacity`` tokens, one sequence id each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0

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
        return i

    def close(self) -> None:
        if self.raw is not None:
            self.raw.n_tokens = self.capacity
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


class LlamaContext:
    """A llama.cpp context with ``n_seq`` independent sequences of ``n_ctx_seq`` tokens each."""

    def __init__(self, model: LlamaModel, params: ModelParams, n_ctx_seq: int) -> None:
        cparams = llama_cpp.llama_context_default_params()
        n_seq = params.n_parallel
        cparams.n_ctx = n_ctx_seq * n_seq
        cparams.n_batch = params.batch_size
        cparams.n_ubatch = min(params.ubatch_size, params.batch_size)
        cparams.n_seq_max = n_seq
        threads = params.threads if params.threads > 0 else default_threads()
        cparams.n_threads = threads
        cparams.n_threads_batch = params.threads_batch if params.threads_batch > 0 else threads
        cparams.embeddings = params.embedding
        cparams.kv_unified = False
        cparams.flash_attn_type = {
            "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, "enabled": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED, "disabled": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }.get(params.flash_attn, llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
        ctx = llama_cpp.llama_init_from_model(model.ptr, cparams)
        if not ctx:
            raise WasiNNError(
                Errno.INVALID_ARGUMENT,
                f"llama.cpp could not create a context of {cparams.n_ctx} tokens for {str(model.path)!r}",
            )
        self.ptr = ctx
        self.model = model
        self.n_seq = n_seq
        self.n_ctx_seq = n_ctx_seq
        self.n_batch: int = llama_cpp.llama_n_batch(ctx)
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.threads = threads

    def decode(self, batch: Batch) -> int:
        """Run one ``llama_decode``; 0 on success (llama.cpp's return code otherwise)."""
        batch.raw.n_tokens = batch.n
        return int(llama_cpp.llama_decode(self.ptr, batch.raw))

    def seq_rm(self, seq_id: int, start: int) -> None:
        """Drop the sequence's cells from position ``start`` on."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, start, -1)

    def embeddings(self, seq_id: int, batch_index: int) -> list[float]:
        """The pooled embedding of a sequence, or the given token's if there is no pooling."""
        ptr = llama_cpp.llama_get_embeddings_seq(self.ptr, seq_id)
        if not ptr:
            ptr = llama_cpp.llama_get_embeddings_ith(self.ptr, batch_index)
        if not ptr:
            raise WasiNNError(Errno.RUNTIME_ERROR, "llama.cpp returned no embedding")
        return list(ptr[: self.model.n_embd])

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None


class Sampler:
    """A llama.cpp sampler chain built from :class:`SamplingParams`."""

    def __init__(self, model: LlamaModel, params: SamplingParams, n_ctx_seq: int) -> None:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = lambda s: llama_cpp.llama_sampler_chain_add(chain, s)  # noqa: E731
        last_n = n_ctx_seq if params.last_n_penalty < 0 else params.last_n_penalty
        if params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
            add(llama_cpp.llama_sampler_init_penalties(
                model.n_vocab, last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty))
        if params.greedy:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(llama_cpp.llama_sampler_init_top_k(params.top_k))
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temp))
            add(llama_cpp.llama_sampler_init_dist(params.seed))
        self.ptr = chain

    def sample(self, ctx: LlamaContext, batch_index: int) -> int:
        """Sample (and accept) a token from the logits at ``batch_index``."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, batch_index))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.ptr, token)

    def reset(self) -> None:
        llama_cpp.llama_sampler_reset(self.ptr)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
