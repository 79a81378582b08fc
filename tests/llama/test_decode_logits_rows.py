"""``decode-logits-rows`` on real llama.cpp: a step's sampled rows decoded in parts of at most that many
(the same texts as one decode a step, never more rows in one decode), and a new context's output buffer
resident for those rows only."""

from __future__ import annotations

import ctypes
import mmap
import pathlib
import threading
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.runtime import KvLayout
from wasinn_host.llama import context as llama_context
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.context import LlamaContext
from wasinn_host.llama.model import LlamaModel


@pytest.fixture(scope="module")
def model(big_vocab_model: LlamaModel) -> LlamaModel:
    return big_vocab_model


def resident_pages(address: int, size: int) -> list[bool]:
    """Whether each page of ``[address, address + size)`` is resident (``mincore``)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    start, end = address // page * page, -(-(address + size) // page) * page
    vector = (ctypes.c_ubyte * ((end - start) // page))()
    assert libc.mincore(start, end - start, vector) == 0, ctypes.get_errno()
    return [bool(v & 1) for v in vector]


def test_a_new_context_keeps_the_output_rows_it_may_write_resident(model: LlamaModel) -> None:
    row = model.n_vocab * 4
    for cap, kept in ((2, 2), (0, 8)):
        context = LlamaContext(model, ModelParams(threads=2, decode_logits_rows=cap), KvLayout(64, 8))
        try:
            address = ctypes.cast(llama_cpp.llama_get_logits(context.ptr), ctypes.c_void_p).value or 0
            # llama.cpp writes the whole buffer when it makes the context; a page in the middle of each row
            middles = [resident_pages(address + r * row + row // 2, 1)[0] for r in range(8)]
            assert middles == [r < kept for r in range(8)], (cap, middles)
        finally:
            context.close()


def test_a_decode_in_parts_gives_each_part_its_logits(model: LlamaModel) -> None:
    context = LlamaContext(model, ModelParams(threads=2, decode_logits_rows=2), KvLayout(64, 6))
    try:
        batch = context.new_batch()
        for seq in range(6):
            batch.add(10 + seq, 0, seq, True)
        whole = []
        assert context.decode(batch) == 0
        for i in range(6):
            whole.append(list(llama_cpp.llama_get_logits_ith(context.ptr, i)[:16]))
        for seq in range(6):
            context.seq_rm(seq, 0)
        for first in (0, 2, 4):
            assert context.decode(batch, first, 2) == 0
            for i in range(2):
                part = list(llama_cpp.llama_get_logits_ith(context.ptr, i)[:16])
                assert part == pytest.approx(whole[first + i], abs=1e-4)
        batch.close()
    finally:
        context.close()


def test_the_worker_decodes_at_most_the_cap_and_generates_the_same(
    successor_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows_per_decode: list[int] = []
    decode = LlamaContext.decode

    def counting(self: LlamaContext, batch: llama_context.Batch, first: int = 0, count: int | None = None) -> int:
        end = batch.n if count is None else first + count
        rows_per_decode.append(sum(1 for i in range(first, end) if batch.raw.logits[i]))
        return decode(self, batch, first, count)

    monkeypatch.setattr(LlamaContext, "decode", counting)
    prompts = ["a", "c", "f", "k", "p"]
    texts: dict[int, list[str]] = {}
    for cap in (0, 2):
        rows_per_decode.clear()
        registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
        try:
            config = {"n-predict": 6, "n-parallel": 5, "decode-logits-rows": cap}
            texts[cap] = generate_together(WasiNN(registry=registry), prompts, config)
        finally:
            registry.close()
        if cap:
            assert max(rows_per_decode) <= cap, rows_per_decode
        else:
            assert max(rows_per_decode) > 2, "the guests shared decodes"
    assert texts[2] == texts[0] == ["bcdefg", "defghi", "ghijkl", "lmnopq", "qrstuv"]


def generate_together(nn: WasiNN, prompts: list[str], config: dict[str, Any]) -> list[str]:
    """Each prompt's text, all computed at once on model ``succ`` (``decode-logits-rows`` from the config)."""
    texts = [""] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        with nn.session("succ", {"temp": 0, "ctx-size": 256, "batch-size": 64, **config}) as session:
            barrier.wait()
            texts[i] = session.complete(prompts[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return texts
