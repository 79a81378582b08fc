"""Deterministic GGUF test models, built by the project itself (no download, no training).

Two models are provided, both of the llama architecture with the same character vocabulary:

* The *successor* model (:func:`write_successor_model`) is constructed by hand so that its greedy
  output is known in advance. The attention-output and FFN-down matrices are zero, so every layer
  adds nothing to the residual stream and the network reduces to a bigram table: the embedding of
  token ``i`` is the one-hot vector ``e_i`` and the output matrix gives the successor of ``i`` a logit
  ``logit_gap`` above every other token (all others are 0). The successor table is:

  - ``<s>`` (BOS) -> ``'a'``
  - ``'a'``..``'y'`` -> next letter, ``'z'`` -> ``</s>``; likewise ``'A'``..``'Y'``, ``'Z'`` -> ``</s>``
  - ``'0'``..``'8'`` -> next digit, ``'9'`` -> ``'0'`` (an endless cycle, for n-predict and
    context-full tests)
  - every other token -> ``</s>`` (EOS)

  So greedy decoding of ``"a"`` gives ``"bcdefghijklmnopqrstuvwxyz"`` and then EOS, and ``"7"`` gives
  ``"890123456789..."`` for ever. :func:`successor_text` computes that continuation in pure Python.
  With the default gap of 20 the model is effectively deterministic even when sampling at
  temperature 1; with a small gap (say 1.0) sampling is genuinely random.

* The *random* model (:func:`write_random_model`) has seeded random weights and is sized so that a
  decode step costs milliseconds; it is meant for benchmarks and for "same greedy output twice" tests.

Vocabulary (SPM, ``tokenizer.ggml.model = "llama"``; :data:`SUCCESSOR_VOCAB_SIZE` = 354 tokens):

====================  ===================================================  ============
ids                   pieces                                               token type
====================  ===================================================  ============
0                     ``<unk>``                                            UNKNOWN (2)
1                     ``<s>`` (BOS)                                        CONTROL (3)
2                     ``</s>`` (EOS)                                       CONTROL (3)
3 .. 258              ``<0x00>`` .. ``<0xFF>`` (byte fallback, id 3 + b)   BYTE (6)
259 .. 353            printable ASCII 0x20..0x7E, id 259 + ord(c) - 0x20   NORMAL (1)
====================  ===================================================  ============

The space character (id 259) is stored as ``"▁"`` (U+2581), because llama.cpp's SPM tokenizer
replaces spaces by that character before matching and back again when turning tokens into text.
Characters outside printable ASCII tokenize to their UTF-8 bytes through the byte tokens. The random
model pads this vocabulary with NORMAL tokens ``"<t354>"``, ``"<t355>"``, ... up to its ``n_vocab``.

Write them from the command line with ``wasinn model successor PATH`` and ``wasinn model random PATH``.
"""

from __future__ import annotations

import math
import os
import pathlib
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np

from ..backend.successor import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    CHAR_TOKEN_OFFSET,
    EOS_ID,
    FIRST_PRINTABLE,
    LAST_PRINTABLE,
    SUCCESSOR_VOCAB_SIZE,
    UNK_ID,
    byte_token_id,
    char_token_id,
    successor_ends_with_eos,
    successor_of,
    successor_text,
    successor_tokenize,
    successor_tokens,
)

__all__ = [
    "BOS_ID",
    "LlamaShape",
    "Vocab",
    "BYTE_TOKEN_OFFSET",
    "CHAR_TOKEN_OFFSET",
    "EOS_ID",
    "SUCCESSOR_VOCAB_SIZE",
    "UNK_ID",
    "byte_token_id",
    "char_token_id",
    "successor_ends_with_eos",
    "successor_of",
    "successor_text",
    "successor_tokenize",
    "successor_tokens",
    "write_random_model",
    "write_llama_gguf",
    "write_successor_model",
    "write_test_models",
]

SPM_SPACE = "\u2581"
RMS_NORM_EPS = 1e-6
SUCCESSOR_NAME = "wasinn-successor"
RANDOM_NAME = "wasinn-random"
SUCCESSOR_HEAD_DIM = 64
SUCCESSOR_N_FF = 64


# --------------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocab:
    """An SPM vocabulary: token pieces, scores and types (index = token id) and the special ids."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    eot_id: int | None = None


def _char_piece(code: int) -> str:
    """The vocabulary piece of printable ASCII ``code``; the space is SPM's ``▁``."""
    return SPM_SPACE if code == 0x20 else chr(code)


def _build_vocab(n_vocab: int) -> Vocab:
    """The shared vocabulary, padded with NORMAL ``<t{i}>`` tokens up to ``n_vocab`` entries."""
    if n_vocab < SUCCESSOR_VOCAB_SIZE:
        raise ValueError(f"n_vocab must be at least {SUCCESSOR_VOCAB_SIZE}, got {n_vocab}")
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [_char_piece(c) for c in range(FIRST_PRINTABLE, LAST_PRINTABLE + 1)]
    types += [gguf.TokenType.NORMAL] * (LAST_PRINTABLE - FIRST_PRINTABLE + 1)
    tokens += [f"<t{i}>" for i in range(len(tokens), n_vocab)]
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    # Every piece is a single character or a special token, so the SPM merge scores never decide
    # anything; give each token a distinct, decreasing score all the same, as SPM vocabularies do.
    scores = [-float(i) for i in range(n_vocab)]
    return Vocab(tokens=tokens, scores=scores, types=[int(t) for t in types])


# --------------------------------------------------------------------------------------------------
# GGUF writing
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    """Hyperparameters of a llama model."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    context_length: int
    rms_eps: float = RMS_NORM_EPS
    rope_base: float | None = None
    """Written only when given (llama.cpp's default is 10000)."""

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.n_embd // self.n_head


def _validate(shape: LlamaShape) -> None:
    """Reject shapes llama.cpp would refuse or that make no sense."""
    for field in ("n_vocab", "n_embd", "n_layer", "n_head", "n_ff", "context_length"):
        if getattr(shape, field) < 1:
            raise ValueError(f"{field} must be positive")
    if shape.n_embd % shape.n_head or shape.head_dim % 2:
        raise ValueError("n_embd must be n_head times an even head dimension")


def write_llama_gguf(
    path: str | os.PathLike[str],
    shape: LlamaShape,
    vocab: Vocab,
    tensors: dict[str, np.ndarray],
    *,
    name: str,
    f16: bool,
    description: str | None = None,
    chat_template: str | None = None,
    arch: str = "llama",
    rope_sections: tuple[int, int, int, int] | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
    add_eos: bool = False,
) -> pathlib.Path:
    """Write a llama-architecture GGUF with an SPM vocabulary, atomically.

    ``tensors`` are in PyTorch ``nn.Linear`` layout; 2-D ones are stored as F16 when ``f16``,
    everything else (norms, biases) as F32.  Used for the test models and by
    ``scripts/train_demo_model.py`` for the demo model.  ``arch`` names another llama-shaped
    architecture (``"qwen2vl"``: the tensors must include the attention biases, and
    ``rope_sections`` gives its M-RoPE sections).  ``extra`` writes further keys (another
    architecture's); ``add_eos`` makes tokenization append EOS (``tokenizer.ggml.add_eos_token``).
    """
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(name)
    if description is not None:
        writer.add_description(description)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_dimension_count(shape.head_dim)
    if rope_sections is not None:
        writer.add_rope_dimension_sections(list(rope_sections))
    if shape.rope_base is not None:
        writer.add_rope_freq_base(shape.rope_base)
    writer.add_vocab_size(shape.n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.eot_id is not None:
        writer.add_eot_token_id(vocab.eot_id)
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(add_eos)
    writer.add_add_space_prefix(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if extra is not None:
        extra(writer)
    for tensor_name, data in tensors.items():
        matrix = data.ndim == 2
        writer.add_tensor(tensor_name, data.astype(np.float16 if f16 and matrix else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def layer_tensor_shapes(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Per-layer tensor names (without the ``blk.N.`` prefix) and their PyTorch shapes."""
    d, f = shape.n_embd, shape.n_ff
    return {
        "attn_norm.weight": (d,),
        "attn_q.weight": (d, d),
        "attn_k.weight": (d, d),
        "attn_v.weight": (d, d),
        "attn_output.weight": (d, d),
        "ffn_norm.weight": (d,),
        "ffn_gate.weight": (f, d),
        "ffn_up.weight": (f, d),
        "ffn_down.weight": (d, f),
    }


# --------------------------------------------------------------------------------------------------
# The successor model
# --------------------------------------------------------------------------------------------------


def _successor_shape(context_length: int, n_layer: int) -> LlamaShape:
    """Smallest convenient shape: one embedding dimension per token, 64-wide heads."""
    n_embd = math.ceil(SUCCESSOR_VOCAB_SIZE / SUCCESSOR_HEAD_DIM) * SUCCESSOR_HEAD_DIM
    return LlamaShape(
        n_vocab=SUCCESSOR_VOCAB_SIZE,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_embd // SUCCESSOR_HEAD_DIM,
        n_ff=SUCCESSOR_N_FF,
        context_length=context_length,
    )


def _successor_output(shape: LlamaShape, logit_gap: float) -> np.ndarray:
    """Output matrix mapping the normed one-hot ``e_i`` to logit ``logit_gap`` at ``successor_of(i)``.

    RMSNorm turns the one-hot embedding ``e_i`` into ``e_i / sqrt(1/n_embd + eps)``, so column ``i``
    carries ``logit_gap * sqrt(1/n_embd + eps)`` in row ``successor_of(i)`` and zeros elsewhere.
    """
    weight = np.zeros((shape.n_vocab, shape.n_embd), dtype=np.float32)
    scale = logit_gap * math.sqrt(1.0 / shape.n_embd + RMS_NORM_EPS)
    for token in range(shape.n_vocab):
        weight[successor_of(token), token] = scale
    return weight


def _successor_tensors(shape: LlamaShape, logit_gap: float) -> dict[str, np.ndarray]:
    """All tensors: one-hot embeddings, unit norms, zero layers, the successor output matrix."""
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": np.eye(shape.n_vocab, shape.n_embd, dtype=np.float32),
        "output_norm.weight": np.ones(shape.n_embd, dtype=np.float32),
        "output.weight": _successor_output(shape, logit_gap),
    }
    for layer in range(shape.n_layer):
        for name, dims in layer_tensor_shapes(shape).items():
            fill = np.ones if name.endswith("norm.weight") else np.zeros
            tensors[f"blk.{layer}.{name}"] = fill(dims, dtype=np.float32)
    return tensors


def write_successor_model(
    path: str | os.PathLike[str],
    *,
    context_length: int = 512,
    logit_gap: float = 20.0,
    n_layer: int = 1,
    f16: bool = False,
) -> pathlib.Path:
    """Write the hand-built successor model (see the module docstring) to ``path``; return the path.

    ``logit_gap`` is how far the successor's logit stands above all others (which are 0): 20 makes
    sampling effectively deterministic, about 1 makes it genuinely random. ``n_layer`` adds more
    (inert) layers; ``f16`` stores the matrices as F16 instead of F32. About 3 MB per layer in F32.
    """
    shape = _successor_shape(context_length, n_layer)
    _validate(shape)
    return write_llama_gguf(
        path, shape, _build_vocab(shape.n_vocab), _successor_tensors(shape, logit_gap), name=SUCCESSOR_NAME, f16=f16
    )


# --------------------------------------------------------------------------------------------------
# The random model
# --------------------------------------------------------------------------------------------------


def _random_tensors(shape: LlamaShape, seed: int, logit_std: float = 3.0) -> dict[str, np.ndarray]:
    """Seeded weights, scaled GPT-2 style so activations stay of order one.

    Inputs to each matrix are RMS-normed (order one per component), so a std of ``1/sqrt(fan_in)``
    keeps outputs of order one; the residual-writing matrices are scaled down by ``sqrt(2*n_layer)``.
    Weights are uniform rather than Gaussian: numpy draws them about three times faster.
    """
    rng = np.random.default_rng(seed)

    def uniform(dims: tuple[int, ...], std: float) -> np.ndarray:
        """Zero-mean uniform noise with standard deviation ``std``."""
        data = rng.random(dims, dtype=np.float32)
        data -= np.float32(0.5)
        data *= np.float32(std * math.sqrt(12.0))
        return data

    d = shape.n_embd
    residual = 1.0 / math.sqrt(2 * shape.n_layer)
    tensors: dict[str, np.ndarray] = {"token_embd.weight": uniform((shape.n_vocab, d), 1.0)}
    for layer in range(shape.n_layer):
        for name, dims in layer_tensor_shapes(shape).items():
            if name.endswith("norm.weight"):
                data = np.ones(dims, dtype=np.float32)
            else:
                std = 1.0 / math.sqrt(dims[1])
                if name in ("attn_output.weight", "ffn_down.weight"):
                    std *= residual
                data = uniform(dims, std)
            tensors[f"blk.{layer}.{name}"] = data
    tensors["output_norm.weight"] = np.ones(d, dtype=np.float32)
    # Logits with a standard deviation of about ``logit_std``.
    tensors["output.weight"] = uniform((shape.n_vocab, d), logit_std / math.sqrt(d))
    return tensors


def write_random_model(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 12,
    n_embd: int = 768,
    n_head: int = 12,
    n_ff: int = 2048,
    n_vocab: int = 512,
    context_length: int = 2048,
    seed: int = 0,
    f16: bool = True,
    arch: str = "llama",
    logit_std: float = 3.0,
) -> pathlib.Path:
    """Write a seeded random-weight llama model to ``path``; return the path.

    The defaults give about 86 M parameters (171 MB in F16), the benchmark model of the design
    notes, built in a few seconds. The vocabulary is the successor model's, padded with ``<t{i}>``
    tokens to ``n_vocab``. The same arguments always produce the same file.  ``arch="qwen2vl"``
    writes the same network as a Qwen2-VL text model: random attention biases and M-RoPE sections
    covering the head (its positions have four parts, as libmtmd gives image tokens).
    ``logit_std`` is the spread of the output logits: 3 gives clear argmaxes and still-varied
    sampling; a large value (say 50) makes default sampling pick the greedy token every time.
    """
    shape = LlamaShape(
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_ff=n_ff,
        context_length=context_length,
    )
    _validate(shape)
    vocab = _build_vocab(n_vocab)  # fails fast on a too-small vocabulary, before drawing weights
    tensors = _random_tensors(shape, seed, logit_std)
    if arch == "llama":
        return write_llama_gguf(path, shape, vocab, tensors, name=RANDOM_NAME, f16=f16)
    if arch != "qwen2vl":
        raise ValueError(f"arch {arch!r}: expected llama or qwen2vl")
    rng = np.random.default_rng(seed + 1)
    for layer in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v"):
            tensors[f"blk.{layer}.{name}.bias"] = (rng.standard_normal(n_embd) * 0.1).astype(np.float32)
    pairs = shape.head_dim // 2  # M-RoPE rotates head_dim/2 pairs: time, height, width (none left over)
    sections = (pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0)
    return write_llama_gguf(path, shape, vocab, tensors, name=RANDOM_NAME, f16=f16, arch=arch, rope_sections=sections)


def write_test_models(directory: str | os.PathLike[str], *, random: bool = True) -> dict[str, pathlib.Path]:
    """Write ``successor.gguf`` (and, unless ``random=False``, ``random.gguf``) with default settings.

    Returns ``{"successor": path, "random": path}`` (without ``"random"`` when not asked for).
    """
    folder = pathlib.Path(directory)
    models = {"successor": write_successor_model(folder / "successor.gguf")}
    if random:
        models["random"] = write_random_model(folder / "random.gguf")
    return models
