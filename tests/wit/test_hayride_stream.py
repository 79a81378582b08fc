"""Hayride's streaming interfaces (hayride:ai graph-stream, inference-stream, tensor-stream) through
``guest_examples/components/hayride_stream.wasm`` on real llama.cpp: the streamed text, one read per
token, Hayride's ``max_predict``, errors, ready pollables from wasmtime's own WASI, and the Store's
resources freed."""

from __future__ import annotations

import gc
import json
import pathlib
from typing import Any

import wasmtime
import wasmtime.component as cm

from wasinn_host import RunOptions, WasiNN
from wasinn_host.cli.run import _exit_code
from wasinn_host.launch.runner import run_instances
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS
from wasinn_host.wit.hayride_streams import VERSIONS

STREAM = GUESTS / "components" / "hayride_stream.wasm"


def stream(nn: WasiNN, tmp_path: pathlib.Path, *args: str) -> tuple[int, str, str]:
    out, err = tmp_path / "stream.out", tmp_path / "stream.err"
    code = nn.run(STREAM, list(args), RunOptions(stdout=str(out), stderr=str(err)))
    return code, out.read_text(), err.read_text()


def test_the_answer_streams_one_token_per_read(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """The same tokens as wasi:nn's compute (without the end-of-generation piece, as a stream ends before it)."""
    text = successor_text("hello")
    assert stream(nn, tmp_path, "succ", "hello") == (0, text + "\n", f"stream output, chunks: {len(text)}\n")
    complete = tmp_path / "complete.out"
    nn.run(GUESTS / "components" / "nn_complete.wasm", ["succ", "hello"], RunOptions(stdout=str(complete)))
    assert complete.read_text() == successor_text("hello") + "</s>\n"


def test_hayride_options_bound_the_stream(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    options = json.dumps({"temperature": 0, "max_predict": 3, "top_k": 0, "top_p": 0.9, "seed": 0})
    expected = (0, successor_text("abc", 3) + "\n", "stream Output, chunks: 3\n")
    assert stream(nn, tmp_path, "succ", "abc", options) == expected
    assert stream(nn, tmp_path, "succ", "abc", '{"n-predict": 0}') == (0, "\n", "stream Output, chunks: 0\n")


def test_errors_come_back_as_wasi_nn_errors(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, err = stream(nn, tmp_path, "nope", "abc")
    assert (code, out) == (1, "")
    assert err.startswith("wasi-nn error: load-by-name: not-found: load-by-name: model name 'nope' is not preloaded")
    code, out, err = stream(nn, tmp_path, "succ", "abc", '{"max_predict": "x"}')
    assert code == 1 and err.startswith("wasi-nn error: compute: ")


def test_every_hayride_version_is_defined_and_the_store_is_left_clean(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    assert VERSIONS[0] == "0.0.38" and VERSIONS[-1] == "0.0.63" and len(VERSIONS) == 26
    linker = cm.Linker(nn.engine)
    linker.add_wasip2()
    nn.add_to_component_linker(linker)
    store = wasmtime.Store(nn.engine)
    store.set_wasi(wasmtime.WasiConfig())
    nn.attach(store)
    instance = linker.instantiate(store, cm.Component(nn.engine, STREAM.read_bytes()))
    (state,) = nn.wit_imports.states()
    assert instance is not None and state.pollable_factory == {}, "the pollable factory is made on first use"
    del instance, store
    gc.collect()
    assert nn.wit_imports.states() == []


def test_streams_from_several_guests_at_once(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    results = run_instances(nn, STREAM, ["succ", "abc"], RunOptions(stdout=str(tmp_path / "o")), instances=3)
    assert [r.code for r in results] == [0, 0, 0]


def test_a_host_bug_in_a_guest_thread_is_one_line_and_a_failed_exit(nn: WasiNN, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)

    def broken(*args: object, **kwargs: object) -> int:
        raise ValueError("boom")

    monkeypatch.setattr(nn, "run", broken)
    results = run_instances(nn, STREAM, ["succ", "abc"], RunOptions())
    assert (results[0].code, results[0].error) == (None, "internal error: ValueError: boom")
    assert _exit_code(results) != 0


def test_a_new_compute_closes_the_contexts_older_stream(nn: WasiNN) -> None:
    """The streams of one context at the host's level: a second compute ends the first answer's stream."""
    from wasinn_host.wit.hayride_streams import HayrideStreams
    from wasinn_host.wit.tensors import HostTensor

    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    streams = HayrideStreams(nn.wit_imports)
    state = nn.wit_imports.state(store)
    context = streams.init_execution_context(state, streams.load_by_name(state, "succ").rep).rep

    def compute(prompt: bytes) -> Any:
        _name, handle = streams.compute(state, context, [("prompt", state.add_tensor(HostTensor.u8(prompt)))])
        return state.stream(handle.rep)

    first = compute(b"abc")
    HayrideStreams._step(state, first)
    second = compute(b"k")
    assert (first.done, bytes(first.pending)) == (True, successor_text("abc", 1).encode())
    while not second.done:
        HayrideStreams._step(state, second)
    assert bytes(second.pending) == successor_text("k").encode()
    nn.detach(store)
