"""A tiny reranker the project writes itself: a seeded random Qwen3 decoder with a classification head.

llama.cpp scores a sequence with rank pooling (``LLAMA_POOLING_TYPE_RANK``, config key ``reranking``)
by taking a Qwen3 model's last hidden state (after the output norm) through ``cls.output.weight`` (a
``2 x n_embd`` matrix, classes ``yes`` and ``no``) and a softmax: the probability of ``yes`` is the
sequence's score.  The vocabulary is the successor model's (characters,
bytes), with ``[SEP]`` as a control token at id 354; tokenization adds BOS, EOS and SEP where
llama-server's ``format_prompt_rerank`` puts them: ``<s>query</s>[SEP]document</s>``.  The weights
mean nothing; the scores differ from document to document, and llama.cpp computes them the same way
for the host and for a test driving llama-cpp-python directly.
"""

from __future__ import annotations

import math
import os
import pathlib

import gguf
import numpy as np

from .gguf_models import LlamaShape, Vocab, _build_vocab, write_llama_gguf

RERANKER_NAME = "wasinn-reranker"
SEP_ID = 354
"""The ``[SEP]`` control token."""
N_VOCAB = 384
LABELS = ("yes", "no")
"""The head's classes, as Qwen3 rerankers are converted: llama.cpp gives their softmax, the score is the first."""


def reranker_vocab() -> Vocab:
    """The successor vocabulary padded to :data:`N_VOCAB`, ``[SEP]`` a control token."""
    vocab = _build_vocab(N_VOCAB)
    tokens, types = list(vocab.tokens), list(vocab.types)
    tokens[SEP_ID], types[SEP_ID] = "[SEP]", int(gguf.TokenType.CONTROL)
    return Vocab(tokens=tokens, scores=vocab.scores, types=types)


def _tensors(shape: LlamaShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    d, f, h = shape.n_embd, shape.n_ff, shape.head_dim

    def normal(*dims: int, std: float) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    tensors = {"token_embd.weight": normal(shape.n_vocab, d, std=1.0)}
    for layer in range(shape.n_layer):
        prefix = f"blk.{layer}."
        tensors.update(
            {
                prefix + "attn_norm.weight": np.ones(d, dtype=np.float32),
                prefix + "attn_q.weight": normal(d, d, std=1.0 / math.sqrt(d)),
                prefix + "attn_k.weight": normal(d, d, std=1.0 / math.sqrt(d)),
                prefix + "attn_v.weight": normal(d, d, std=1.0 / math.sqrt(d)),
                prefix + "attn_output.weight": normal(d, d, std=0.5 / math.sqrt(d)),
                prefix + "attn_q_norm.weight": np.ones(h, dtype=np.float32),
                prefix + "attn_k_norm.weight": np.ones(h, dtype=np.float32),
                prefix + "ffn_norm.weight": np.ones(d, dtype=np.float32),
                prefix + "ffn_gate.weight": normal(f, d, std=1.0 / math.sqrt(d)),
                prefix + "ffn_up.weight": normal(f, d, std=1.0 / math.sqrt(d)),
                prefix + "ffn_down.weight": normal(d, f, std=0.5 / math.sqrt(f)),
            }
        )
    tensors["output_norm.weight"] = np.ones(d, dtype=np.float32)
    tensors["output.weight"] = normal(shape.n_vocab, d, std=1.0 / math.sqrt(d))
    tensors["cls.output.weight"] = normal(len(LABELS), d, std=0.1)
    return tensors


def write_reranker_model(
    path: str | os.PathLike[str], *, seed: int = 0, n_layer: int = 2, rerank_template: str | None = None
) -> pathlib.Path:
    """Write the reranker to ``path`` (about 0.5 MB, F32); the same seed writes the same file.

    ``rerank_template`` is stored as the model's ``rerank`` chat template (``{query}`` and ``{document}``
    are filled in), which llama-server's formatting prefers to BOS/EOS/SEP."""
    shape = LlamaShape(n_vocab=N_VOCAB, n_embd=64, n_layer=n_layer, n_head=4, n_ff=128, context_length=512)
    tensors = _tensors(shape, np.random.default_rng(seed))

    def extra(writer: gguf.GGUFWriter) -> None:
        writer.add_sep_token_id(SEP_ID)
        writer.add_add_sep_token(True)
        writer.add_classifier_output_labels(list(LABELS))
        if rerank_template is not None:
            writer.add_string("tokenizer.chat_template.rerank", rerank_template)

    return write_llama_gguf(
        path, shape, reranker_vocab(), tensors, name=RERANKER_NAME, f16=False, arch="qwen3", extra=extra, add_eos=True
    )
