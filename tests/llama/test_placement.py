"""``cpu-moe``, ``n-cpu-moe``, ``tensor-split``, ``split-mode`` and ``no-kv-offload`` reach llama.cpp as
WasmEdge passes them.  Without a GPU they change nothing visible, so this checks what llama.cpp
receives (the ``llama_model_params`` / ``llama_context_params`` handed to it, its own log of the tensors
whose buffer type was overridden), that the project's tiny mixture-of-experts model loads and answers
with them set, and that values llama.cpp cannot take are refused with errno 1's kind."""

from __future__ import annotations

import ctypes
import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.placement import BufferOverride, cpu_buffer_type
from wasinn_host.testing.gguf_models import successor_text, write_successor_model
from wasinn_host.testing.moe_model import EXPERT_TENSORS, write_moe_model

GREEDY = {"temp": 0, "ctx-size": 128, "n-parallel": 1}
ANSWER = successor_text("a") + "</s>"


@pytest.fixture(scope="module")
def nn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WasiNN]:
    path = write_moe_model(tmp_path_factory.mktemp("moe") / "moe.gguf")
    registry = ModelRegistry([f"moe:GGML:AUTO:{path}"])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the next model load and context creation hand llama.cpp, read before they return."""
    seen: dict[str, Any] = {}
    load, init = llama_cpp.llama_model_load_from_file, llama_cpp.llama_init_from_model

    def spy_load(path: bytes, mparams: Any) -> Any:
        overrides: list[tuple[bytes, int]] = []
        if mparams.tensor_buft_overrides:
            array = ctypes.cast(mparams.tensor_buft_overrides, ctypes.POINTER(BufferOverride))
            while array[len(overrides)].pattern is not None:
                overrides.append((array[len(overrides)].pattern, array[len(overrides)].buft))
        split = mparams.tensor_split
        seen.update(
            split_mode=mparams.split_mode,
            tensor_split=[split[i] for i in range(llama_cpp.llama_max_devices())] if split else None,
            overrides=overrides,
        )
        return load(path, mparams)

    def spy_init(model: Any, cparams: Any) -> Any:
        seen["offload_kqv"] = cparams.offload_kqv
        return init(model, cparams)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", spy_load)
    monkeypatch.setattr(llama_cpp, "llama_init_from_model", spy_init)
    return seen


def overridden(caplog: pytest.LogCaptureFixture) -> set[str]:
    """The tensors llama.cpp's log says it put in an overriding buffer type (``... overridden to CPU``)."""
    return {
        r.getMessage().split()[1]
        for r in caplog.records
        if r.name == "wasinn_host.llama" and "buffer type overridden to CPU" in r.getMessage()
    }


def experts(*layers: int) -> set[str]:
    return {f"blk.{layer}.{name}.weight" for layer in layers for name in EXPERT_TENSORS}


def answer(nn: WasiNN, keys: dict[str, Any]) -> str:
    with nn.session("moe", {**GREEDY, **keys}) as session:
        return session.complete("a")


def test_the_moe_model_answers(nn: WasiNN, received: dict[str, Any]) -> None:
    assert answer(nn, {}) == ANSWER
    assert received["overrides"] == [] and received["split_mode"] == llama_cpp.LLAMA_SPLIT_MODE_LAYER
    assert received["tensor_split"] is None and received["offload_kqv"] is True


def test_cpu_moe_keeps_every_expert_tensor_on_the_cpu(
    nn: WasiNN, received: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="wasinn_host.llama"):
        assert answer(nn, {"cpu-moe": True}) == ANSWER
    assert received["overrides"] == [(rb"\.ffn_(up|down|gate)_exps", cpu_buffer_type())]
    assert overridden(caplog) == experts(0, 1)


def test_n_cpu_moe_keeps_the_first_layers_experts_on_the_cpu(
    nn: WasiNN, received: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="wasinn_host.llama"):
        assert answer(nn, {"n-cpu-moe": 1}) == ANSWER
    assert [pattern for pattern, _ in received["overrides"]] == [rb"blk\.0\.ffn_(up|down|gate)_exps"]
    assert overridden(caplog) == experts(0)


def test_both_add_their_patterns_in_wasmedges_order(nn: WasiNN, received: dict[str, Any]) -> None:
    assert answer(nn, {"cpu-moe": True, "n-cpu-moe": 2}) == ANSWER
    assert [pattern for pattern, _ in received["overrides"]] == [
        rb"\.ffn_(up|down|gate)_exps",
        rb"blk\.0\.ffn_(up|down|gate)_exps",
        rb"blk\.1\.ffn_(up|down|gate)_exps",
    ]


def test_split_keys_and_no_kv_offload_reach_llama_cpp(nn: WasiNN, received: dict[str, Any]) -> None:
    assert answer(nn, {"split-mode": "row", "tensor-split": "3,2", "no-kv-offload": True}) == ANSWER
    assert received["split_mode"] == llama_cpp.LLAMA_SPLIT_MODE_ROW
    assert received["tensor_split"][:3] == [3.0, 2.0, 0.0] and not any(received["tensor_split"][2:])
    assert received["offload_kqv"] is False
    answer(nn, {"split-mode": "none"})
    assert received["split_mode"] == llama_cpp.LLAMA_SPLIT_MODE_NONE


def test_more_proportions_than_devices_are_refused(nn: WasiNN) -> None:
    too_many = ",".join(["1"] * (llama_cpp.llama_max_devices() + 1))
    with pytest.raises(WasiNNError) as err:
        answer(nn, {"tensor-split": too_many})
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "tensor-split" in str(err.value) and f"at most {llama_cpp.llama_max_devices()} devices" in str(err.value)
    assert answer(nn, {}) == ANSWER, "the host keeps serving"


def test_cpu_moe_on_a_dense_model_changes_nothing(tmp_path: pathlib.Path) -> None:
    """A model without experts has no tensor the patterns match: it loads and answers as without them."""
    path = write_successor_model(tmp_path / "dense.gguf")
    nn = WasiNN(preload=[f"d:GGML:AUTO:{path}"], registry=ModelRegistry())
    try:
        with nn.session("d", {**GREEDY, "cpu-moe": True, "n-cpu-moe": 4}) as session:
            assert session.complete("k") == successor_text("k") + "</s>"
    finally:
        nn.registry.close()
