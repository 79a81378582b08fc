"""A loaded llama.cpp model: weights, vocabulary, the projector of a vision model, and the sizes that
decide how many layers go to a GPU and how large a KV cache is."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.config.kv_types import GGML_TYPES
from ..core.config.params import POOLING_RANK, ModelParams, SamplingParams
from ..core.errors import ErrorKind, WasiNNError, invalid
from ..core.gil_calls import holding_gil
from ..core.runtime import DEFAULT_SEQUENCES, MAX_DEFAULT_CTX
from . import cpu_probe, devices
from .bindings import llama_cpp
from .gguf_layout import GgufLayout, read_layout
from .load_errors import load_failure_cause
from .log import capture_llama_log, init_backend, route_llama_log
from .offload import ModelSizes, choose_gpu_layers, fit_gpu_layers
from .placement import set_placement
from .sampler import check_sampling
from .vision import Vision
from .vocoder import Vocoder

log = logging.getLogger("wasinn_host")


def default_threads() -> int:
    """All cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def model_chat_template(
    model: Any, reader: Callable[[Any, bytes | None], bytes | None] = llama_cpp.llama_model_chat_template
) -> str | None:
    """The GGUF ``tokenizer.chat_template`` of a loaded model (a ``llama_model_p``), or ``None``.

    ``reader`` is ``llama_cpp.llama_model_chat_template`` but for tests.  A template that is not UTF-8
    is an invalid argument.
    """
    raw = reader(model, None)
    if not raw:
        return None
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("chat-template: the model's tokenizer.chat_template is not valid UTF-8") from exc


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
        try:
            layout: GgufLayout | None = read_layout(path, devices.type_size)
        except WasiNNError:
            layout = None  # not a GGUF file llama.cpp can read either: its own load explains why below
        if layout is not None:
            cpu_probe.prepare(layout.weight_types)  # llama.cpp's extra CPU layouts, checked before weights go in
        if params.pooling_type == POOLING_RANK and (layout is None or not layout.has_classifier):
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"model file {path.name!r} has no classification head (cls.* tensors), so it cannot rerank: "
                "'reranking' (rank pooling) needs a reranker model",
            )
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
        placement = set_placement(mparams, params)  # the arrays it points to live until the load returns
        with capture_llama_log() as lines:
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        del placement
        if not model:
            cause = load_failure_cause(lines)
            raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"llama.cpp could not load model file {str(path)!r}: {cause}")
        self.ptr = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(model)
        self.n_embd: int = llama_cpp.llama_model_n_embd(model)
        self.size_bytes: int = llama_cpp.llama_model_size(model)
        self.kv_shape: tuple[int, int, int] = kv_shape(model)
        """(layers, K values, V values) of one KV cell (see :func:`kv_cache_bytes`)."""
        self.bos: int = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self.vocab)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._token_to_piece = holding_gil(llama_cpp.llama_token_to_piece)  # called a row at a time
        self._is_eog = holding_gil(llama_cpp.llama_vocab_is_eog)
        self.vision: Vision | None = None
        """The multimodal projector loaded with the model (``mmproj``), if the host configured one."""
        self.vocoder: Vocoder | None = None
        """The WavTokenizer vocoder of a TTS graph (``tts`` with ``model-vocoder``)."""
        if params.mmproj:
            try:
                with capture_llama_log():
                    threads = params.threads if params.threads > 0 else default_threads()
                    on_gpu = self.n_gpu_layers != 0 and devices.can_offload()  # the projector follows the model
                    self.vision = Vision(Path(params.mmproj), model, threads, route_llama_log, on_gpu)
            except BaseException:
                self.close()
                raise
        if params.tts:
            try:
                threads = params.threads if params.threads > 0 else default_threads()
                self.vocoder = Vocoder(Path(params.vocoder), threads, max(params.batch_size, params.ubatch_size))
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

    def rerank_tokens(self, query: bytes, document: bytes) -> list[int]:
        """The tokens a reranker scores for one (query, document) pair, as llama-server's
        ``format_prompt_rerank``: the model's ``rerank`` chat template with ``{query}`` and ``{document}``
        filled in, or else BOS, query, EOS, SEP, document, EOS (each special token where the
        vocabulary adds it; SEP stands in for a missing EOS)."""
        template = llama_cpp.llama_model_chat_template(self.ptr, b"rerank")
        if template:
            prompt = template.replace(b"{query}", query).replace(b"{document}", document)
            return self.tokenize(prompt, add_special=False, parse_special=True)
        vocab = self.vocab
        sep = int(llama_cpp.llama_vocab_sep(vocab))
        eos = self.eos if self.eos != llama_cpp.LLAMA_TOKEN_NULL else sep
        add_eos = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
        tokens = [self.bos] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
        tokens += self.tokenize(query, add_special=False, parse_special=False)
        tokens += [eos] if add_eos else []
        tokens += [sep] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        tokens += self.tokenize(document, add_special=False, parse_special=False)
        return tokens + ([eos] if add_eos else [])

    def piece(self, token: int) -> bytes:
        """The bytes of one token, special tokens rendered (cached)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = self._token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        piece = buf.raw[: max(n, 0)]
        self._pieces[token] = piece
        return piece

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        cached = self._eog.get(token)
        if cached is None:
            cached = self._eog[token] = bool(self._is_eog(self.vocab, token))
        return cached

    def chat_template(self) -> str | None:
        """The GGUF ``tokenizer.chat_template``, or None."""
        return model_chat_template(self.ptr)

    def check_sampling(self, params: SamplingParams) -> None:
        """Refuse (invalid argument) a JSON schema that does not convert to a grammar, a grammar that does not
        parse or a logit-bias token outside the vocabulary."""
        check_sampling(self, params)

    def close(self) -> None:
        """Free the projector, the vocoder and the weights."""
        if self.vocoder is not None:
            self.vocoder.close()
            self.vocoder = None
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


def kv_cache_bytes(model: LlamaModel, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """K and V cells of every layer for ``n_ctx`` cells, each of its cache type (``core/config/kv_types.py``'s names;
    f16 is llama.cpp's default), as llama.cpp allocates them with a full-size sliding-window cache (its
    default): per layer a row of ``n_head_kv`` heads of the key (value) length, which a model may set
    apart from ``n_embd / n_head`` (Gemma 3: 256 against 160)."""
    n_layer, k_width, v_width = model.kv_shape
    return n_layer * n_ctx * (_row_bytes(type_k, k_width) + _row_bytes(type_v, v_width))


def _row_bytes(name: str, width: int) -> int:
    """Bytes of ``width`` values of a KV cache type (ggml's block size and bytes per block)."""
    block, block_bytes = devices.type_size(GGML_TYPES[name])
    return -(-width // block) * block_bytes


def kv_shape(model_ptr: ctypes.c_void_p) -> tuple[int, int, int]:
    """(layers, K values per cell and layer, V values per cell and layer) of a loaded model: the heads of
    the KV cache times the key and value lengths of its GGUF metadata (``n_embd / n_head`` without them)."""
    n_layer = llama_cpp.llama_model_n_layer(model_ptr)
    n_head = max(llama_cpp.llama_model_n_head(model_ptr), 1)
    n_head_kv = llama_cpp.llama_model_n_head_kv(model_ptr)
    head = llama_cpp.llama_model_n_embd(model_ptr) // n_head
    arch = _meta(model_ptr, "general.architecture")
    k_len = int(_meta(model_ptr, f"{arch}.attention.key_length") or head)
    v_len = int(_meta(model_ptr, f"{arch}.attention.value_length") or head)
    return n_layer, k_len * n_head_kv, v_len * n_head_kv


def _meta(model_ptr: ctypes.c_void_p, key: str) -> str:
    """A GGUF metadata value as text ("" if the model has no such key)."""
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model_ptr, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""
