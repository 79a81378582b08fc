"""wasmtime-py's variant lowering from several threads at once (:mod:`wasinn_host.guest.variant_scratch`):
each thread's scratch set is its own, and results lowered in threads side by side never fail."""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Iterator

import pytest
import wasmtime
from wasmtime import _ffi as ffi
from wasmtime.component import Component, ComponentInstanceType, FuncType, ResultType, Variant, _types

from wasinn_host.guest import variant_scratch
from wasinn_host.testing.guest_runs import GUESTS

pytestmark = pytest.mark.fast


@pytest.fixture
def fast_switches() -> Iterator[None]:
    """Threads switched every 10 microseconds: a race between them shows in thousands of steps, not millions."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def answer_types(engine: wasmtime.Engine) -> list[tuple[ResultType, object]]:
    """Two answers and a value of each whose lowering tests the value against a case's classes:
    Hayride's ``tensor-stream.read`` (``result<tensor-data, error>``, ``ok(b"ab")``) and wasi:io's
    ``blocking-write-and-flush`` (``result<_, stream-error>``, ``err(closed)``)."""
    component = Component(engine, (GUESTS / "components" / "hayride_stream.wasm").read_bytes())
    imports = component.type.imports(engine)
    answers = []
    for interface, func_name, value in [
        ("hayride:ai/tensor-stream@0.0.63", "[method]tensor-stream.read", b"ab"),
        ("wasi:io/streams@0.2.0", "[method]output-stream.blocking-write-and-flush", Variant("err", None)),
    ]:
        instance = imports[interface].ty
        assert isinstance(instance, ComponentInstanceType)
        func = instance.exports(engine)[func_name].ty
        assert isinstance(func, FuncType) and isinstance(func.result, ResultType)
        answers.append((func.result, value))
    return answers


def lower_in_threads(threads: int, rounds: int) -> list[str]:
    """Lower each answer ``rounds`` times in each of ``threads`` threads (half of them start with the
    second answer); the errors they met."""
    engine = wasmtime.Engine()
    answers = answer_types(engine)
    store = wasmtime.Store(engine)
    errors: list[str] = []

    def lower(first: int) -> None:
        value = ffi.wasmtime_component_val_t()
        for step in range(rounds):
            answer_type, answer = answers[(first + step) % len(answers)]
            try:
                answer_type.convert_to_c(store, answer, ctypes.pointer(value))
            except ValueError as exc:
                errors.append(str(exc))
                return
            ffi.wasmtime_component_val_delete(ctypes.byref(value))

    workers = [threading.Thread(target=lower, args=(index % 2,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


def test_each_thread_has_its_own_scratch_set() -> None:
    assert variant_scratch.install() and variant_scratch.install(), "installing twice changes nothing"
    scratch = _types.case_test_cache
    assert isinstance(scratch, variant_scratch.PerThreadSet)
    scratch.clear()
    scratch.add(int)
    seen: list[set[type]] = []

    def other() -> None:
        seen.append(set(scratch))
        scratch.add(str)
        scratch.clear()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [set()] and set(scratch) == {int} and int in scratch and len(scratch) == 1
    scratch.discard(int)
    assert not scratch


def test_results_lowered_in_threads_at_once_never_fail(fast_switches: None) -> None:
    variant_scratch.install()
    assert lower_in_threads(threads=4, rounds=4000) == []
