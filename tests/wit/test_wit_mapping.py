"""The component front end on the fake runtime: tensor-name rules, Hayride's options, the byte fast path."""

from __future__ import annotations

import ctypes
import pathlib

import pytest
from conftest import MakeNN
from wasmtime import _ffi as ffi

from wasinn_host import Limits, RunOptions
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.guest import fast_calls
from wasinn_host.testing.guest_runs import GUESTS
from wasinn_host.wit.llm_mapping import answer_tensors, hayride_config, read_request
from wasinn_host.wit.tensors import HostTensor

pytestmark = pytest.mark.fast

LIMITS = Limits()


def test_prompt_is_named_or_the_only_u8_input() -> None:
    assert read_request([("prompt", HostTensor.u8(b"hi"))], LIMITS).prompt == b"hi"
    request = read_request([("x", HostTensor.u8(b"hi")), ("metadata", HostTensor.u8(b'{"temp": 0}'))], LIMITS)
    assert (request.prompt, dict(request.config.sampling) if request.config else None) == (b"hi", {"temp": 0.0})
    with pytest.raises(WasiNNError, match="no prompt"):
        read_request([("a", HostTensor.u8(b"1")), ("b", HostTensor.u8(b"2"))], LIMITS)
    with pytest.raises(WasiNNError, match="is FP32"):
        read_request([("prompt", HostTensor.f32([1.0]))], LIMITS)
    with pytest.raises(WasiNNError) as too_large:
        read_request([("prompt", HostTensor.u8(b"abc"))], Limits(max_prompt_bytes=2))
    assert too_large.value.kind is ErrorKind.TOO_LARGE


def test_hayride_options_map_to_our_keys_and_zero_means_default() -> None:
    config = hayride_config(
        b'{"temperature": 0.5, "num_context": 0, "num_batch": 256, "max_predict": 0, "top_k": 7, '
        b'"top_p": 0.9, "seed": 0, "min-p": 0.1}'
    )
    assert dict(config.sampling) == {"temp": 0.5, "top_k": 7, "top_p": 0.9, "min_p": 0.1}
    assert dict(config.model) == {"batch_size": 256}
    assert dict(config.stopping) == {}
    with pytest.raises(WasiNNError) as bad:
        hayride_config(b"[1]")
    assert bad.value.kind is ErrorKind.INVALID_ENCODING


def test_hayride_requests_get_the_single_output_tensor() -> None:
    hayride = read_request([("user", HostTensor.u8(b"a")), ("options", HostTensor.u8(b"{}"))], LIMITS)
    assert [name for name, _ in answer_tensors(hayride, b"b", None, b"{}")] == ["Output"]
    ours = read_request([("prompt", HostTensor.u8(b"a"))], LIMITS)
    answer = answer_tensors(ours, b"", [0.5, -1.0], b"{}")
    assert answer == [
        ("output", HostTensor((2,), "FP32", b"\x00\x00\x00?\x00\x00\x80\xbf")),
        ("metadata", HostTensor.u8(b"{}")),
    ]


@pytest.mark.parametrize("with_malloc", [True, False])
def test_byte_lists_round_trip_through_c_values(with_malloc: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # with glibc's malloc (wasmtime frees with it) or wasmtime's own vallist_new_uninit
    assert (fast_calls._malloc() is not None) is True
    if not with_malloc:
        monkeypatch.setattr(fast_calls, "_malloc", lambda: None)
    data = bytes(range(256)) * 17
    value = ffi.wasmtime_component_val_t()
    fast_calls.write_bytes(data, value)
    assert value.kind == fast_calls.KIND_LIST and value.of.list.size == len(data)
    assert all(value.of.list.data[i].kind == fast_calls.KIND_U8 for i in (0, 1, len(data) - 1))
    assert fast_calls.read_bytes(value) == data
    ffi.wasmtime_component_vallist_delete(ctypes.byref(value.of.list))
    fast_calls.write_bytes(b"", value)
    assert fast_calls.read_bytes(value) == b""


def test_components_run_on_the_fake_runtime(make_nn: MakeNN, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    code = make_nn().run(
        GUESTS / "components" / "nn_complete.wasm",
        ["succ", "hello"],
        RunOptions(stdout=str(out), stderr=str(tmp_path / "e")),
    )
    assert (code, out.read_text()) == (0, "pqrstuvwxyz</s>\n")
