"""The real :class:`~wasinn_host.core.runtime.Runtime`: typed wrappers over llama-cpp-python's low-level API.

It loads a model, creates a multi-sequence context, tokenizes, decodes batches, edits the
KV cache per sequence and builds sampler chains; it knows nothing about guests or
handles.  The other modules that touch ``llama_cpp`` do so for one narrow job each:
``log.py`` (llama.cpp's log), ``model_check.py`` (loading untrusted files in a child process),
``core/config.py`` (llama.cpp's JSON-schema-to-grammar converter) and ``core/chat_template.py`` (reading a
GGUF's template).

llama.cpp aborts the whole process on some misuse (a batch larger than ``n_batch``,
non-consecutive positions), so callers (``core/scheduler.py``) keep those invariants.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from ..core.errors import ErrorKind, WasiNNError
from ..core.params import ModelParams, SamplingParams
from ..core.runtime import DEFAULT_SEQUENCES, MAX_DEFAULT_CTX, KvLayout
from . import devices
from .bindings import llama_cpp
from .gguf_layout import read_layout
from .grammar_sampling import GrammarSampler, GreedySampler
from .load_errors import load_failure_cause
from .log import CAPTURE_LOCK, capture_llama_log, init_backend, route_llama_log
from .offload import ModelSizes, choose_gpu_layers, fit_gpu_layers
from .piece_trie import has_token_elements, trie_of
from .vision import ImageSpan, Vision

log = logging.getLogger("wasinn_host")

LLAMA_CPP_PYTHON_VERSION: str = llama_cpp.__version__
# llama.cpp revision vendored by each supported llama-cpp-python release (its CHANGELOG), and that
# revision's release tag bNNNN (llama.cpp's LLAMA_BUILD_NUMBER, which WasmEdge reports).
_LLAMA_COMMITS = {"0.3.36": "0c1e57098"}
_BUILD_NUMBERS = {"0c1e570": 11312}


def _linked_commit() -> str:
    """The llama.cpp commit of the linked libraries (``ggml_commit()``), else the version table's."""
    try:
        ggml = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
        ggml.ggml_commit.restype = ctypes.c_char_p
        commit = (ggml.ggml_commit() or b"").decode().removesuffix("-dirty")
    except (OSError, AttributeError, UnicodeDecodeError):
        commit = ""
    return commit if commit and commit != "unknown" else _LLAMA_COMMITS.get(LLAMA_CPP_PYTHON_VERSION, "unknown")


LLAMA_COMMIT: str = _linked_commit()
LLAMA_BUILD_NUMBER: int = _BUILD_NUMBERS.get(LLAMA_COMMIT[:7], 0)
"""The bNNNN tag of the linked commit, from the table above (libllama does not expose it); 0 if unknown."""


def default_threads() -> int:
    """All cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def gpu_layers(path: Path, params: ModelParams) -> int:
    """The layers to offload: the target and ``n-gpu-layers`` mapped by :mod:`.offload`, fitted to the
    GPUs' free memory when that decides; the choice is logged (the GPU-less GPU target as a warning)."""
    choice = choose_gpu_layers(
        params.target,
        params.n_gpu_layers,
        devices.can_offload(),
        lambda: fit_gpu_layers(model_sizes(path, params), devices.gpu_free_bytes()),
    )
    log.log(choice.level, "model %s: %s", path.name, choice.reason)
    return choice.n_gpu_layers


def model_sizes(path: Path, params: ModelParams) -> ModelSizes:
    """The device memory offloading ``path`` costs per layer, for the context ``params`` will create
    (its first layout: ``ctx-size`` cells per sequence, ``n-parallel`` or the default sequences)."""
    layout = read_layout(path, devices.type_size)
    n_layer = int(layout.key("block_count", len(layout.layer_bytes)))
    n_ctx_train = int(layout.key("context_length", MAX_DEFAULT_CTX))
    n_cells = (params.ctx_size or min(n_ctx_train, MAX_DEFAULT_CTX)) * (params.n_parallel or DEFAULT_SEQUENCES)
    return ModelSizes(
        n_layer=n_layer,
        layer_bytes=max(layout.layer_bytes.values(), default=0),
        output_bytes=layout.output_bytes,
        kv_bytes_per_layer=n_cells * layout.kv_bytes_per_cell_per_layer(),
    )


class LlamaModel:
    """Loaded weights and vocabulary; safe to share, read-only after load."""

    def __init__(self, path: Path, params: ModelParams) -> None:
        init_backend()
        self.path = path
        mparams = llama_cpp.llama_model_default_params()
        self.n_gpu_layers: int = gpu_layers(path, params)
        """The layers offloaded, as chosen from the target or ``n-gpu-layers`` (-1 = all)."""
        mparams.n_gpu_layers = self.n_gpu_layers if self.n_gpu_layers >= 0 else 2**31 - 1
        mparams.main_gpu = params.main_gpu
        if params.use_mmap:
            mparams.load_mode = (
                llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK if params.use_mlock else llama_cpp.LLAMA_LOAD_MODE_MMAP
            )
        else:
            mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MLOCK if params.use_mlock else llama_cpp.LLAMA_LOAD_MODE_NONE
        with capture_llama_log() as lines:
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            cause = load_failure_cause(lines)
            raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"llama.cpp could not load model file {str(path)!r}: {cause}")
        self.ptr = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(model)
        self.n_embd: int = llama_cpp.llama_model_n_embd(model)
        self.size_bytes: int = llama_cpp.llama_model_size(model)
        self.bos: int = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self.vocab)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self.vision: Vision | None = None
        """The multimodal projector loaded with the model (``mmproj``), if the host configured one."""
        if params.mmproj:
            try:
                with capture_llama_log():
                    threads = params.threads if params.threads > 0 else default_threads()
                    on_gpu = self.n_gpu_layers != 0 and devices.can_offload()  # the projector follows the model
                    self.vision = Vision(Path(params.mmproj), model, threads, route_llama_log, on_gpu)
            except BaseException:
                self.close()
                raise

    @property
    def description(self) -> str:
        """llama.cpp's one-line model description (type, size, quantisation)."""
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.ptr, buf, len(buf))
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
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"tokenization failed ({n})")
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

    def chat_template(self) -> str | None:
        """The GGUF ``tokenizer.chat_template``, or None."""
        from ..core.chat_template import model_chat_template  # Jinja: imported when a template is asked for

        return model_chat_template(self.ptr)

    def check_sampling(self, params: SamplingParams) -> None:
        """Refuse (invalid argument) a grammar that does not parse or a logit-bias token outside the vocabulary."""
        check_sampling(self, params)

    def close(self) -> None:
        """Free the projector and the weights."""
        if self.vision is not None:
            self.vision.close()
            self.vision = None
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
        """Empty the batch."""
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
        """Free the batch."""
        if self.raw is not None:
            self.raw.n_tokens = self.capacity
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


class LlamaContext:
    """A llama.cpp context with ``layout.n_seq`` independent sequences of ``layout.n_ctx_seq`` tokens each."""

    def __init__(self, model: LlamaModel, params: ModelParams, layout: KvLayout) -> None:
        cparams = llama_cpp.llama_context_default_params()
        n_seq, n_ctx_seq = layout.n_seq, layout.n_ctx_seq
        cparams.n_ctx = layout.n_cells
        cparams.n_batch = params.batch_size
        cparams.n_ubatch = min(params.ubatch_size, params.batch_size)
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
        ctx = llama_cpp.llama_init_from_model(model.ptr, cparams)
        if not ctx:
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"llama.cpp could not create a context of {cparams.n_ctx} tokens for {str(model.path)!r}",
            )
        self.ptr = ctx
        self.model = model
        self.n_seq = n_seq
        self.n_ctx_seq = n_ctx_seq
        self.n_batch: int = llama_cpp.llama_n_batch(ctx)
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.threads = threads
        self.kv_bytes = kv_cache_bytes(model, cparams.n_ctx)

    def decode_image(self, span: ImageSpan, pos: int, seq_id: int) -> int:
        """Encode an image of the prompt and decode its embeddings into ``seq_id`` at ``pos`` (0 = done)."""
        if self.model.vision is None:
            return -1
        return self.model.vision.decode(self.ptr, span, pos, seq_id, self.n_batch)

    def new_batch(self) -> Batch:
        """A reusable batch of ``n_batch`` tokens."""
        return Batch(self.n_batch)

    def new_sampler(self, params: SamplingParams) -> "Sampler":
        """A sampler chain for one execution context."""
        return Sampler(self.model, params, self.n_ctx_seq)

    def top_probabilities(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        """The ``n`` most likely next tokens at ``batch_index`` and their probabilities."""
        return top_probabilities(self, batch_index, n)

    def decode(self, batch: Batch) -> int:
        """Run one ``llama_decode``; 0 on success (llama.cpp's return code otherwise)."""
        batch.raw.n_tokens = batch.n
        return int(llama_cpp.llama_decode(self.ptr, batch.raw))

    def seq_rm(self, seq_id: int, start: int) -> None:
        """Drop the sequence's cells from position ``start`` on."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, start, -1)

    def seq_copy(self, src: int, dst: int) -> None:
        """Replace ``dst``'s cells by a copy of ``src``'s.  Each sequence has its own stream (``kv_unified``
        off), so llama.cpp copies the whole stream's buffers at the next decode; it accepts nothing but
        the whole range there (any other aborts the process), so callers trim ``dst`` afterwards."""
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

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
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, keep, keep + discard)
        llama_cpp.llama_memory_seq_add(self.memory, seq_id, keep + discard, -1, -discard)

    def embeddings(self, seq_id: int, batch_index: int) -> list[float]:
        """The pooled embedding of a sequence, or the given token's if there is no pooling."""
        ptr = llama_cpp.llama_get_embeddings_seq(self.ptr, seq_id)
        if not ptr:
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


def kv_cache_bytes(model: LlamaModel, n_ctx: int) -> int:
    """F16 K and V cells for every layer (llama.cpp's default cache type)."""
    n_layer = llama_cpp.llama_model_n_layer(model.ptr)
    n_head = max(llama_cpp.llama_model_n_head(model.ptr), 1)
    n_head_kv = llama_cpp.llama_model_n_head_kv(model.ptr)
    n_embd_kv = model.n_embd // n_head * n_head_kv
    return 2 * n_layer * n_ctx * n_embd_kv * 2


class Sampler:
    """A context's sampling, built from :class:`SamplingParams` as llama.cpp's ``common_sampler_init``
    builds its chain (what WasmEdge's GGML plugin and llama-server use).

    logit bias -> penalties -> DRY -> top-k -> typical -> top-p -> min-p -> XTC -> temperature
    (dynamic if ``dynatemp-range`` > 0) -> distribution; with mirostat 1/2: logit bias -> temperature
    -> mirostat (no penalties, DRY or truncation, as llama.cpp).  Stages whose settings make them
    no-ops are left out.  A grammar is not in the chain: a
    :class:`~.grammar_sampling.GrammarSampler` checks the chain's draw and masks only after a
    rejection (``common_sampler_sample``'s order; ``grammar-first`` masks first).  With ``temp <= 0``
    a :class:`~.grammar_sampling.GreedySampler` makes the greedy choice: the same tokens, without a
    copy of every logit or a grammar pass over the whole vocabulary per token.
    """

    def __init__(self, model: LlamaModel, params: SamplingParams, n_ctx_seq: int) -> None:
        self.ptr: ctypes.c_void_p | None = None
        """The chain (None with a :class:`GreedySampler` or :class:`GrammarSampler`, which own the
        stages then)."""
        self.greedy: GreedySampler | None = None
        self.grammar: GrammarSampler | None = None
        if not params.grammar and not params.greedy:
            self.ptr = _chain(_pre_stages(model, params, n_ctx_seq) + _draw_stages(model, params))
            return
        grammar = grammar_sampler(model, params.grammar) if params.grammar else None  # invalid: raises first
        try:
            pre = _pre_stages(model, params, n_ctx_seq)
        except BaseException:
            if grammar is not None:
                llama_cpp.llama_sampler_free(grammar)
            raise
        if params.greedy:
            self.greedy = GreedySampler(_chain(pre) if pre else None, grammar, model.n_vocab)
            return
        assert grammar is not None
        top_k = params.top_k if params.mirostat == 0 else 0
        self.grammar = GrammarSampler(
            _chain(pre) if pre else None,
            grammar,
            _chain(_draw_stages(model, params)),
            top_k,
            model.n_vocab,
            grammar_first=params.grammar_first,
            trie=None if has_token_elements(params.grammar) else functools.partial(trie_of, model),
            piece=model.piece,
        )

    def sample(self, ctx: LlamaContext, batch_index: int) -> int:
        """Sample (and accept) a token from the logits at ``batch_index``."""
        if self.greedy is not None:
            return self.greedy.sample(ctx.ptr, batch_index)
        if self.grammar is not None:
            return self.grammar.sample(ctx.ptr, batch_index)
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, batch_index))

    def reset(self) -> None:
        """Forget the chain's history."""
        if self.greedy is not None:
            self.greedy.reset()
        elif self.grammar is not None:
            self.grammar.reset()
        elif self.ptr:
            llama_cpp.llama_sampler_reset(self.ptr)

    def close(self) -> None:
        """Free the chain (or the grammar sampler and the stages it owns)."""
        if self.greedy is not None:
            self.greedy.close()
            self.greedy = None
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None


def _chain(stages: list[ctypes.c_void_p]) -> ctypes.c_void_p:
    """A sampler chain owning ``stages``."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for sampler in stages:
        llama_cpp.llama_sampler_chain_add(chain, sampler)
    return chain


@contextlib.contextmanager
def capture_stderr() -> Iterator[list[str]]:
    """Collect what C code prints on file descriptor 2 during a call (llama.cpp's grammar
    parser reports the position of a syntax error there, not through its log)."""
    lines: list[str] = []
    with CAPTURE_LOCK, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read(8192).decode("utf-8", "replace").splitlines())


def grammar_sampler(model: LlamaModel, grammar: str) -> ctypes.c_void_p:
    """A GBNF grammar sampler; an invalid-argument error with llama.cpp's parse message if the grammar is invalid."""
    with capture_stderr() as lines:
        sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
    if not sampler:
        detail = next((line.strip() for line in lines if "error" in line), "llama.cpp rejected it")
        raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"invalid grammar: {detail[:300]}")
    return sampler


def check_sampling(model: LlamaModel, params: SamplingParams) -> None:
    """Raise an invalid-argument error if the grammar does not parse or a logit-bias token is not in the vocabulary."""
    for token, _bias in params.logit_bias:
        if token >= model.n_vocab:
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"config key 'logit-bias': token id {token} is not in the vocabulary of {model.n_vocab}",
            )
    if params.grammar:
        llama_cpp.llama_sampler_free(grammar_sampler(model, params.grammar))


def _pre_stages(model: LlamaModel, p: SamplingParams, n_ctx_seq: int) -> list[ctypes.c_void_p]:
    """The stages that change logits token by token: logit bias (the model's suppressed tokens banned, as
    llama.cpp's ``common_sampler_init``), then (without mirostat) penalties and DRY."""
    stages = []
    for token, _bias in p.logit_bias:
        if token >= model.n_vocab:
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"config key 'logit-bias': token id {token} is not in the vocabulary of {model.n_vocab}",
            )
    n_suppress = ctypes.c_int32(0)
    suppress = llama_cpp.llama_vocab_get_suppress_tokens(model.vocab, ctypes.byref(n_suppress))
    merged = [*p.logit_bias, *((int(suppress[i]), float("-inf")) for i in range(n_suppress.value))]
    if merged:
        biases = (llama_cpp.llama_logit_bias * len(merged))()
        for i, (token, bias) in enumerate(merged):
            biases[i] = llama_cpp.llama_logit_bias(token, bias)
        stages.append(llama_cpp.llama_sampler_init_logit_bias(model.n_vocab, len(merged), biases))
    if p.mirostat != 0:
        return stages  # llama.cpp's mirostat chain: logit bias, temperature, mirostat
    last_n = n_ctx_seq if p.last_n_penalty < 0 else p.last_n_penalty
    if p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
        stages.append(
            llama_cpp.llama_sampler_init_penalties(
                model.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        )
    if p.dry_multiplier > 0:
        breakers = (ctypes.c_char_p * len(p.dry_sequence_breakers))(*(b.encode() for b in p.dry_sequence_breakers))
        dry_last_n = n_ctx_seq if p.dry_last_n < 0 else p.dry_last_n
        stages.append(
            llama_cpp.llama_sampler_init_dry(
                model.vocab,
                p.dry_multiplier,
                p.dry_base,
                p.dry_allowed_length,
                dry_last_n,
                breakers,
                len(p.dry_sequence_breakers),
            )
        )
    return stages


def _draw_stages(model: LlamaModel, p: SamplingParams) -> list[ctypes.c_void_p]:
    """The stages that choose, in ``common_sampler_init``'s order: truncation (top-k first), temperature and
    the draw; or temperature and mirostat."""
    if p.mirostat == 1:
        return [
            llama_cpp.llama_sampler_init_temp(p.temp),
            llama_cpp.llama_sampler_init_mirostat(model.n_vocab, p.seed, p.mirostat_ent, p.mirostat_eta, 100),
        ]
    if p.mirostat == 2:
        return [
            llama_cpp.llama_sampler_init_temp(p.temp),
            llama_cpp.llama_sampler_init_mirostat_v2(p.seed, p.mirostat_ent, p.mirostat_eta),
        ]
    stages = []
    min_keep = p.min_keep
    if p.top_k > 0:
        stages.append(llama_cpp.llama_sampler_init_top_k(p.top_k))
    if p.typ_p < 1.0:
        stages.append(llama_cpp.llama_sampler_init_typical(p.typ_p, min_keep))
    if p.top_p < 1.0:
        stages.append(llama_cpp.llama_sampler_init_top_p(p.top_p, min_keep))
    if p.min_p > 0.0:
        stages.append(llama_cpp.llama_sampler_init_min_p(p.min_p, min_keep))
    if p.xtc_probability > 0.0:
        stages.append(llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, min_keep, p.seed))
    stages.append(llama_cpp.llama_sampler_init_temp_ext(p.temp, p.dynatemp_range, p.dynatemp_exponent))
    stages.append(llama_cpp.llama_sampler_init_dist(p.seed))
    return stages


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


class LlamaRuntime:
    """llama.cpp through llama-cpp-python: the runtime every real model uses."""

    build_number = LLAMA_BUILD_NUMBER
    commit = LLAMA_COMMIT

    def load_model(self, path: Path, params: ModelParams) -> LlamaModel:
        """Load weights and vocabulary (invalid argument with llama.cpp's reason if it cannot)."""
        return LlamaModel(path, params)

    def new_context(self, model: LlamaModel, params: ModelParams, layout: KvLayout) -> LlamaContext:
        """A context laid out as ``layout`` says."""
        return LlamaContext(model, params, layout)

    def kv_cache_bytes(self, model: LlamaModel, n_ctx: int) -> int:
        """Bytes of KV cache for ``n_ctx`` cells."""
        return kv_cache_bytes(model, n_ctx)

    def check_model_file(self, path: Path) -> None:
        """Load an untrusted file in a child process first (llama.cpp aborts on some files)."""
        from .model_check import check_model_file

        check_model_file(path)
