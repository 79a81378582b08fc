"""Tiny text-to-speech models built by the project: an OuteTTS-shaped llama and a WavTokenizer decoder.

:func:`write_outetts_model` writes a llama GGUF with OuteTTS's special tokens (``<|im_start|>``,
``<|text_start|>``, ``<|text_sep|>``, ``<|space|>``, ``<|audio_start|>``, ``<|code_start|>`` ...) and
:data:`N_CODES` audio-code tokens ``<|0|>`` .. ``<|63|>`` at the end of the vocabulary (a real OuteTTS
vocabulary has 4,101 of them at ids 151672..155772; the host counts codes from the id of ``<|0|>``).
Like the successor model (``gguf_models.py``) it is a hand-built bigram table, so its greedy output is
known in advance: a newline (every OuteTTS prompt ends with one) is followed by ``<|code_start|>``, then
the :data:`CHAIN` of audio codes, ``<|code_end|>``, ``<|audio_end|>`` and ``<|im_end|>`` (end of
generation); every other token is followed by ``<|im_end|>``, with a logit 20 above the rest, so sampling
picks the chain too (``random_codes`` makes the codes random instead).  ``version="0.3"`` gives it the
chat template ``outetts-0.3``, from which the host takes the OuteTTS 0.3 prompt format.

:func:`write_wavtokenizer_model` writes a ``wavtokenizer-dec`` GGUF with seeded random weights in the
tensor layout llama.cpp's loader expects (token embedding, input convolution, a 6-block PosNet of ResNet
blocks, attention and a group norm, ConvNeXt blocks, a 1282-wide output: 641 log-magnitudes and 641
phases per code), tiny: a 64-entry codebook, 16 features, 64 channels.

:func:`write_speaker_file` writes an OuteTTS speaker profile (JSON) whose codes are in the tiny codebook.
"""

from __future__ import annotations

import math
import os
import pathlib

import gguf
import numpy as np
import orjson

from .gguf_models import (
    SUCCESSOR_HEAD_DIM,
    LlamaShape,
    Vocab,
    _build_vocab,
    _validate,
    layer_tensor_shapes,
    write_llama_gguf,
)

N_CODES = 64
"""Audio codes of the tiny models (the codebook of the vocoder)."""
CHAIN = tuple((17 + 37 * i) % N_CODES for i in range(40))
"""The audio codes the OuteTTS test model generates greedily, in order (40 codes: 12,800 samples)."""
SPECIALS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|text_start|>",
    "<|text_end|>",
    "<|text_sep|>",
    "<|space|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|code_start|>",
    "<|code_end|>",
)
NEWLINE_ID = 3 + 0x0A
"""``\\n`` is the byte-fallback token ``<0x0A>`` in the successor vocabulary."""
FRAME_WIDTH = 1282
N_FEATURES = 16
N_CHANNELS = 64
N_FF = 128
CONVNEXT_LAYERS = 2
POSNET_LAYERS = 6


def outetts_vocab() -> Vocab:
    """The successor vocabulary, then OuteTTS's special tokens, then the audio codes ``<|0|>`` .. ``<|63|>``."""
    base = _build_vocab(354)
    tokens = [*base.tokens, *SPECIALS, *(f"<|{code}|>" for code in range(N_CODES))]
    control = int(gguf.TokenType.CONTROL)
    user = int(gguf.TokenType.USER_DEFINED)
    types = [*base.types, control, control, *([user] * (len(SPECIALS) - 2)), *([user] * N_CODES)]
    scores = [-float(i) for i in range(len(tokens))]
    return Vocab(tokens, scores, types, eos_id=tokens.index("<|im_end|>"), eot_id=tokens.index("<|im_end|>"))


def token_id(name: str) -> int:
    """The id of a special token or ``<|N|>`` code in :func:`outetts_vocab`."""
    return outetts_vocab().tokens.index(name)


def successor_table(vocab: Vocab) -> list[int]:
    """Each token's greedy successor (see the module docstring)."""
    ids = {name: vocab.tokens.index(name) for name in SPECIALS}
    first_code = vocab.tokens.index("<|0|>")
    table = [ids["<|im_end|>"]] * len(vocab.tokens)
    table[NEWLINE_ID] = ids["<|code_start|>"]
    table[ids["<|code_start|>"]] = first_code + CHAIN[0]
    for code, after in zip(CHAIN, CHAIN[1:]):
        table[first_code + code] = first_code + after
    table[first_code + CHAIN[-1]] = ids["<|code_end|>"]
    table[ids["<|code_end|>"]] = ids["<|audio_end|>"]
    return table


def write_outetts_model(
    path: str | os.PathLike[str], *, version: str = "0.2", random_codes: bool = False, context_length: int = 8192
) -> pathlib.Path:
    """Write the OuteTTS-shaped bigram model (see the module docstring) to ``path``; with ``random_codes``,
    ``<|code_start|>`` and every code are followed by all 64 codes alike (sampling draws them at random, the
    output ends only at ``n-predict``); ValueError for a version other than 0.2 and 0.3 or a context length
    below 1."""
    if version not in ("0.2", "0.3"):
        raise ValueError(f"version must be 0.2 or 0.3, got {version!r}")
    vocab = outetts_vocab()
    n_vocab = len(vocab.tokens)
    n_embd = math.ceil(n_vocab / SUCCESSOR_HEAD_DIM) * SUCCESSOR_HEAD_DIM
    shape = LlamaShape(n_vocab, n_embd, 1, n_embd // SUCCESSOR_HEAD_DIM, 64, context_length)
    _validate(shape)
    output = np.zeros((n_vocab, n_embd), dtype=np.float32)
    scale = 20.0 * math.sqrt(1.0 / n_embd + shape.rms_eps)  # a logit 20 above the others: greedy in effect
    for token, successor in enumerate(successor_table(vocab)):
        output[successor, token] = scale
    if random_codes:
        first_code = vocab.tokens.index("<|0|>")
        for token in (vocab.tokens.index("<|code_start|>"), *range(first_code, first_code + N_CODES)):
            output[:, token] = 0.0
            output[first_code : first_code + N_CODES, token] = scale
    tensors = {
        "token_embd.weight": np.eye(n_vocab, n_embd, dtype=np.float32),
        "output_norm.weight": np.ones(n_embd, dtype=np.float32),
        "output.weight": output,
    }
    for name, dims in layer_tensor_shapes(shape).items():
        fill = np.ones if name.endswith("norm.weight") else np.zeros
        tensors[f"blk.0.{name}"] = fill(dims, dtype=np.float32)
    template = "outetts-0.3" if version == "0.3" else None
    return write_llama_gguf(
        path, shape, vocab, tensors, name=f"wasinn-outetts-{version}", f16=False, chat_template=template
    )


def _vocoder_tensors(seed: int) -> dict[str, np.ndarray]:
    """Seeded weights in llama.cpp's ``wavtokenizer-dec`` layout (numpy shapes: ggml's dimensions reversed)."""
    rng = np.random.default_rng(seed)
    c = N_CHANNELS

    def rand(*dims: int, fan_in: int) -> np.ndarray:
        return (rng.standard_normal(dims) / math.sqrt(fan_in)).astype(np.float32)

    def norm(prefix: str, *dims: int) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": np.ones(dims, np.float32), f"{prefix}.bias": np.zeros(dims, np.float32)}

    t: dict[str, np.ndarray] = {
        "token_embd.weight": rand(N_CODES, N_FEATURES, fan_in=1),
        "conv1d.weight": rand(c, N_FEATURES, 7, fan_in=7 * N_FEATURES),
        "conv1d.bias": rand(c, 1, fan_in=c),
    }
    for i in (0, 1, 3, 4):
        t |= norm(f"posnet.{i}.norm1", c, 1) | norm(f"posnet.{i}.norm2", c, 1)
        for conv in ("conv1", "conv2"):
            t[f"posnet.{i}.{conv}.weight"] = rand(c, c, 3, fan_in=3 * c)
            t[f"posnet.{i}.{conv}.bias"] = rand(c, 1, fan_in=c)
    t |= norm("posnet.2.attn_norm", c, 1)
    for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
        t[f"posnet.2.{part}.weight"] = rand(c, c, 1, fan_in=c)
        t[f"posnet.2.{part}.bias"] = rand(c, 1, fan_in=c)
    t |= norm("posnet.5.attn_norm", c, 1) | norm("token_embd_norm", c)
    for i in range(CONVNEXT_LAYERS):
        t[f"convnext.{i}.dw.weight"] = rand(c, 1, 7, fan_in=7)
        t[f"convnext.{i}.dw.bias"] = rand(c, 1, fan_in=c)
        t |= norm(f"convnext.{i}.norm", c)
        t[f"convnext.{i}.pw1.weight"] = rand(N_FF, c, fan_in=c)
        t[f"convnext.{i}.pw1.bias"] = rand(N_FF, fan_in=N_FF)
        t[f"convnext.{i}.pw2.weight"] = rand(c, N_FF, fan_in=N_FF)
        t[f"convnext.{i}.pw2.bias"] = rand(c, fan_in=c)
        t[f"convnext.{i}.gamma.weight"] = np.full(c, 0.5, np.float32)
    t |= norm("output_norm", c)
    t["output.weight"] = rand(FRAME_WIDTH, c, fan_in=c)
    t["output.bias"] = np.zeros(FRAME_WIDTH, np.float32)
    return t


def write_wavtokenizer_model(path: str | os.PathLike[str], *, seed: int = 0) -> pathlib.Path:
    """Write the tiny random ``wavtokenizer-dec`` vocoder (see the module docstring) to ``path``, atomically;
    ValueError for a negative seed."""
    if seed < 0:
        raise ValueError(f"seed must be at least 0, got {seed}")
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    arch = "wavtokenizer-dec"
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name("wasinn-wavtokenizer")
    writer.add_context_length(8192)
    writer.add_embedding_length(FRAME_WIDTH)
    writer.add_block_count(max(POSNET_LAYERS, CONVNEXT_LAYERS))
    writer.add_head_count(1)
    writer.add_layer_norm_eps(1e-6)
    writer.add_vocab_size(N_CODES)
    writer.add_features_length(N_FEATURES)
    writer.add_feed_forward_length(N_FF)
    writer.add_group_norm_eps(1e-6)
    writer.add_group_norm_groups(32)
    writer.add_posnet_embedding_length(N_CHANNELS)
    writer.add_posnet_block_count(POSNET_LAYERS)
    writer.add_convnext_embedding_length(N_CHANNELS)
    writer.add_convnext_block_count(CONVNEXT_LAYERS)
    writer.add_causal_attention(False)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")
    for name, data in _vocoder_tensors(seed).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def write_speaker_file(
    path: str | os.PathLike[str], words: tuple[tuple[str, float, tuple[int, ...]], ...], version: str | None = None
) -> pathlib.Path:
    """Write an OuteTTS speaker profile of ``words`` ((word, duration, codes), ...) to ``path``."""
    doc: dict[str, object] = {"words": [{"word": w, "duration": d, "codes": list(c)} for w, d, c in words]}
    if version is not None:
        doc["version"] = version
    out = pathlib.Path(path)
    out.write_bytes(orjson.dumps(doc))
    return out


TEST_SPEAKER = (("hello", 0.24, (3, 9, 27, 17)), ("there", 0.16, (5, 33)))
"""A two-word speaker whose codes are in the tiny codebook."""
