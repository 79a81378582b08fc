"""Fixtures shared by the llama tests: what the host's samplers see and choose; a host and llama.cpp
alone over the module's ``model_path`` (as ``m``)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams
from wasinn_host.llama import context as host_context
from wasinn_host.llama import sampler as host_sampler
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.model import LlamaModel
from wasinn_host.testing.gguf_models import write_random_model
from wasinn_host.testing.native_llama import NativeModel


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[np.ndarray, int]]:
    """Every (logits, token) the host's samplers see and choose during the test (row by row, or drawn
    together with other rows: :meth:`.LlamaContext.drawn_tokens`)."""
    steps: list[tuple[np.ndarray, int]] = []
    original = host_sampler.Sampler.sample

    def sample(self: host_sampler.Sampler, ctx: host_context.LlamaContext, batch_index: int) -> int:
        raw = llama_cpp.llama_get_logits_ith(ctx.ptr, batch_index)
        logits = np.ctypeslib.as_array(raw, shape=(ctx.model.n_vocab,)).copy()
        token = original(self, ctx, batch_index)
        steps.append((logits, token))
        return token

    original_drawn = host_context.LlamaContext.drawn_tokens

    def drawn_tokens(self: host_context.LlamaContext, batch_indices: list[int], samplers: list[Any]) -> list[int]:
        rows = [
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ptr, i), shape=(self.model.n_vocab,)).copy()
            for i in batch_indices
        ]
        tokens = original_drawn(self, batch_indices, samplers)
        steps.extend(zip(rows, tokens))
        return tokens

    monkeypatch.setattr(host_sampler.Sampler, "sample", sample)
    monkeypatch.setattr(host_context.LlamaContext, "drawn_tokens", drawn_tokens)  # rows drawn together
    return steps


@pytest.fixture(scope="module")
def nn(model_path: pathlib.Path) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"m:GGML:AUTO:{model_path}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="module")
def native(model_path: pathlib.Path) -> Iterator[NativeModel]:
    model = NativeModel(model_path)
    yield model
    model.close()


@pytest.fixture(scope="module")
def big_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    """A one-layer random model of 32,768 tokens: a logits row is 128 KiB, whole pages of llama.cpp's
    buffers, so the rows a context holds show in its memory."""
    path = write_random_model(
        tmp_path_factory.mktemp("big-vocab") / "big.gguf", n_layer=1, n_embd=64, n_head=2, n_ff=128, n_vocab=32768
    )
    model = LlamaModel(path, ModelParams(threads=2))
    yield model
    model.close()


@pytest.fixture
def successor_host(successor_path: pathlib.Path) -> Iterator[WasiNN]:
    """A host of its own serving the random-weight successor model as ``succ``."""
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path.parent / 'successor-random.gguf'}"])
    yield WasiNN(registry=registry)
    registry.close()
