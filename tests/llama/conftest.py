"""Fixtures shared by the llama tests: what the host's samplers see and choose; a host and llama.cpp
alone over the module's ``model_path`` (as ``m``)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.llama import context as host_context
from wasinn_host.llama import sampler as host_sampler
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.testing.native_llama import NativeModel


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[np.ndarray, int]]:
    """Every (logits, token) the host's samplers see and choose during the test."""
    steps: list[tuple[np.ndarray, int]] = []
    original = host_sampler.Sampler.sample

    def sample(self: host_sampler.Sampler, ctx: host_context.LlamaContext, batch_index: int) -> int:
        raw = llama_cpp.llama_get_logits_ith(ctx.ptr, batch_index)
        logits = np.ctypeslib.as_array(raw, shape=(ctx.model.n_vocab,)).copy()
        token = original(self, ctx, batch_index)
        steps.append((logits, token))
        return token

    monkeypatch.setattr(host_sampler.Sampler, "sample", sample)
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
