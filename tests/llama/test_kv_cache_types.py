"""KV cache types through a real guest and real llama.cpp: ``type-k``/``type-v`` (and WasmEdge's
``cache-type-k``/``-v``) make llama.cpp allocate a smaller cache, the host sizes sequences with it, a bad
value or a quantized V cache without flash attention is errno 1 with one log line, and the successor
model (whose attention is inert) still answers exactly."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import replace

import pytest

from wasinn_host import Errno, ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.core.registry import LoadedModel
from wasinn_host.llama.context import LlamaContext
from wasinn_host.llama.model import kv_cache_bytes
from wasinn_host.testing.abi_guest import AbiGuest

ALPHABET = "bcdefghijklmnopqrstuvwxyz"
CTX = 256


@pytest.fixture
def host(successor_path: pathlib.Path) -> Iterator[WasiNN]:
    """A host of its own (each test loads the model with other cache types)."""
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    yield WasiNN(registry=registry)
    registry.close()


def load(guest: AbiGuest, config: str) -> int:
    rc, graph = guest.load_by_name("succ", config)
    assert rc == 0, rc
    return graph


def model_for(host: WasiNN, type_k: str, type_v: str) -> LoadedModel:
    (loaded,) = [m for m in host.registry.loaded() if (m.params.type_k, m.params.type_v) == (type_k, type_v)]
    return loaded


def llama_context(loaded: LoadedModel) -> LlamaContext:
    context = loaded.worker.context
    assert isinstance(context, LlamaContext)
    return context


@pytest.mark.parametrize(
    ("config", "type_k", "type_v", "ratio"),
    [
        ('{"type-k": "q8_0", "type-v": "q8_0"}', "q8_0", "q8_0", 34 / 64),
        ('{"cache-type-k": 2, "cache-type-v": 2}', "q4_0", "q4_0", 18 / 64),  # WasmEdge's keys, ggml_type numbers
        ('{"type-k": "q8_0"}', "q8_0", "f16", (34 + 64) / 128),
    ],
)
def test_a_quantized_cache_is_smaller_as_llama_cpp_allocates_it(
    host: WasiNN, config: str, type_k: str, type_v: str, ratio: float
) -> None:
    guest, f16_guest = AbiGuest.create(host), AbiGuest.create(host)  # a Store caches a graph by name
    graph = load(guest, config[:-1] + f', "ctx-size": {CTX}}}')
    f16_graph = load(f16_guest, f'{{"ctx-size": {CTX}}}')
    assert guest.generate(graph, "a") == (0, ALPHABET + "</s>")
    assert f16_guest.generate(f16_graph, "a") == (0, ALPHABET + "</s>")
    f16, quantized = llama_context(model_for(host, "f16", "f16")), llama_context(model_for(host, type_k, type_v))
    assert quantized.n_seq == f16.n_seq
    reported_f16, reported = f16.buffers["kv"], quantized.buffers["kv"]  # llama.cpp's log: "KV buffer size"
    assert reported == pytest.approx(reported_f16 * ratio, rel=0.01)
    assert quantized.kv_bytes == reported  # what the status reports
    # the host sized the sequences with the type: its formula is llama.cpp's allocation
    n_cells = quantized.n_seq * quantized.n_ctx_seq
    assert kv_cache_bytes(quantized.model, n_cells, type_k, type_v) == pytest.approx(reported, abs=1 << 14)
    statuses = {(m["kv_cache_bytes"]) for m in host.status()["models"]}
    assert reported in statuses and reported_f16 in statuses


def test_the_kv_budget_counts_the_cache_type(successor_path: pathlib.Path) -> None:
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    try:
        f16 = ModelParams(ctx_size=CTX, n_parallel=8)
        q8 = replace(f16, type_k="q8_0", type_v="q8_0")
        f16_bytes = registry.runtime.kv_cache_bytes(registry.acquire_named("succ", f16).weights, 8 * CTX, f16)
        budget = f16_bytes * 3 // 4  # 8 f16 sequences do not fit; 8 q8_0 ones (53 %) do
        other = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
        try:
            with pytest.raises(WasiNNError) as refused:
                other.acquire_named("succ", f16, kv_budget=budget)
            assert refused.value.kind is ErrorKind.TOO_LARGE and "max_kv_bytes" in refused.value.message
            context = other.acquire_named("succ", q8, kv_budget=budget).worker.context
            assert context.n_seq == 8 and context.kv_bytes <= budget
        finally:
            other.close()
    finally:
        registry.close()


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('{"type-k": "q7"}', ["type-k", "q7", "q8_0"]),
        ('{"cache-type-v": 99}', ["type-v", "99", "q4_0"]),
        ('{"type-v": "q8_0", "flash-attn": "off"}', ["type-v", "flash attention", "flash-attn"]),
    ],
)
def test_a_refused_cache_type_is_errno_1_and_one_log_line(
    host: WasiNN, config: str, words: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    guest = AbiGuest.create(host)
    with caplog.at_level("WARNING", logger="wasinn_host"):
        rc, _graph = guest.load_by_name("succ", config)
    assert rc == Errno.INVALID_ARGUMENT
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("wasinn_host") and r.levelno >= 30]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert all(word in lines[0] for word in words), lines[0]
    other = AbiGuest.create(host)
    assert other.generate(load(other, "{}"), "a") == (0, ALPHABET + "</s>")  # the host keeps running
