"""``pooling-type`` and ``attention-type``: an embedding is pooled and attended as the guest asks, equal to
llama-cpp-python's embedding with the same context parameters, decoded alone in a context of the host's
shape (one sequence, ``n_ubatch`` = ``n_batch``, the same threads): the same calls, the same floats."""

from __future__ import annotations

import pathlib

import pytest

from wasinn_host import WasiNN
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.testing.gguf_models import write_random_model
from wasinn_host.testing.native_llama import NativeModel

CTX = 256
LOAD = {"embedding": True, "ctx-size": CTX, "n-parallel": 1, "threads": 2, "embd-normalize": -1}
TEXT = b"The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("pooling")
    return write_random_model(folder / "small.gguf", n_layer=2, n_embd=64, n_head=4, n_ff=128, f16=False)


def reference(native: NativeModel, pooling: int, attention: int) -> list[float]:
    """llama.cpp's embedding of ``TEXT``: the pooled one, or the last token's without pooling."""
    tokens = native.tokenize(TEXT)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = CTX, 2048, 2048, 1
    params.n_threads = params.n_threads_batch = 2
    params.kv_unified, params.embeddings = False, True
    params.pooling_type, params.attention_type = pooling, attention
    ctx = llama_cpp.llama_init_from_model(native.model, params)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        NativeModel.decode(ctx, batch, tokens, 0)
        out = llama_cpp.llama_get_embeddings_seq(ctx, 0) or llama_cpp.llama_get_embeddings_ith(ctx, len(tokens) - 1)
        return [float(v) for v in out[:64]]
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)


def host(nn: WasiNN, **keys: int) -> list[float]:
    with nn.session("m", {**LOAD, **keys}) as session:
        return session.embed(TEXT)


@pytest.mark.parametrize(
    ("pooling", "attention"),
    [(0, 0), (1, 0), (2, 0), (3, 0), (1, 1), (2, 1)],
)
def test_pooling_and_attention_are_llama_cpps(nn: WasiNN, native: NativeModel, pooling: int, attention: int) -> None:
    assert host(nn, **{"pooling-type": pooling, "attention-type": attention}) == reference(native, pooling, attention)


def test_each_choice_changes_the_embedding(nn: WasiNN) -> None:
    """So the keys are not ignored: mean, first token and last token differ, and so do causal and
    bidirectional attention under mean pooling; none is the last token's own embedding, as last is."""
    mean, cls, last, none = (host(nn, **{"pooling-type": p}) for p in (1, 2, 3, 0))
    assert len({tuple(mean), tuple(cls), tuple(last)}) == 3
    assert none == last
    assert host(nn, **{"pooling-type": 1, "attention-type": 1}) != mean
    assert host(nn) == last, "the llama architecture's own pooling: none, the last token"
