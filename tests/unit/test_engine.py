"""The engine's scheduling and stop rules, driven directly on the fake runtime (no llama.cpp)."""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from collections.abc import Iterator

import pytest

from wasinn_host.backend.fake import FakeModel, FakeRuntime
from wasinn_host.core.engine import ContextState, ModelWorker
from wasinn_host.core.errors import ErrorKind
from wasinn_host.core.generation import GenerationRequest, GenerationResult, StopReason
from wasinn_host.core.params import ModelParams, SamplingParams, StopParams
from wasinn_host.core.runtime import KvLayout
from wasinn_host.testing.successor import successor_tokenize

GREEDY = SamplingParams(temp=0.0)


def make_worker(model_path: pathlib.Path, n_seq: int = 4, batch: int = 64, n_ctx_seq: int = 64,
                delay: float = 0.0, n_cells: int = 0) -> ModelWorker:
    """A worker on the fake runtime: ``n_seq`` sequences of ``n_ctx_seq`` cells each, or with ``n_cells``
    one shared pool of that many cells."""
    runtime = FakeRuntime(decode_delay=delay)
    params = ModelParams(n_parallel=n_seq, batch_size=batch)
    model = runtime.load_model(model_path, params)
    layout = KvLayout(n_ctx_seq, n_seq, n_cells or n_seq * n_ctx_seq, unified=bool(n_cells))
    return ModelWorker(model, runtime.new_context(model, params, layout), "fake")


@pytest.fixture
def worker(fake_model: pathlib.Path) -> Iterator[ModelWorker]:
    w = make_worker(fake_model)
    yield w
    w.close()


def request(prompt: str, limit: int = 100, **kwargs: object) -> GenerationRequest:
    stopping = kwargs.pop("stopping", StopParams())
    return GenerationRequest(tuple(successor_tokenize(prompt)), limit, GREEDY, stopping, **kwargs)  # type: ignore[arg-type]


def text(result: GenerationResult) -> str:
    return bytes(result.text).decode()


def test_stop_reasons(worker: ModelWorker) -> None:
    state = ContextState()
    eos = worker.submit(request("w"), state)
    assert (text(eos), eos.stop_reason, eos.error) == ("xyz</s>", StopReason.EOS, None)
    assert worker.submit(request("a", limit=3), state).stop_reason is StopReason.N_PREDICT
    assert worker.submit(request("a", limit=0), state).stop_reason is StopReason.LIMIT
    stop = worker.submit(request("a", stopping=StopParams(stop=("ef",))), state)
    assert (text(stop), stop.stop_reason) == ("bcd", StopReason.STOP)
    full = worker.submit(request("7"), state)  # an endless digit cycle: 64 cells hold BOS, "7" and 62 tokens
    assert (full.stop_reason, len(full.generated)) == (StopReason.CONTEXT_FULL, 64 - 2 + 1)  # + one not decoded
    step = worker.submit(request("a", limit=1, streaming=True), state)
    assert (text(step), step.stop_reason) == ("b", StopReason.TOKEN)


def test_output_limit_is_an_error_with_the_output_kept(worker: ModelWorker) -> None:
    result = worker.submit(request("a", max_output_bytes=3), ContextState())
    assert result.error is not None and result.error.kind is ErrorKind.TOO_LARGE
    assert (text(result), result.stop_reason) == ("bcde", StopReason.OUTPUT_LIMIT)


def test_prefix_is_reused_and_a_long_prompt_is_decoded_in_chunks(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, batch=4)
    state = ContextState()
    first = worker.submit(request("ABCDEFGHIJ", limit=1), state)  # 11 tokens in batches of at most 4
    assert (text(first), first.reused_tokens) == ("K", 0)
    second = worker.submit(request("ABCDEFGHIJKLM", limit=1), state)
    assert (text(second), second.reused_tokens) == ("N", 11)
    assert worker.decode_calls == 3 + 1
    worker.close()


def test_contexts_decode_together(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, delay=0.005)
    results: list[GenerationResult] = []
    threads = [threading.Thread(target=lambda: results.append(worker.submit(request("a"), ContextState())))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [text(r) for r in results] == ["bcdefghijklmnopqrstuvwxyz</s>"] * 4
    assert worker.sequences_decoded / worker.decode_calls > 2.0, "four sequences share most decodes"
    worker.close()


def test_priority_then_arrival_order(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, n_seq=1, delay=0.01)
    order: list[str] = []
    blocker = threading.Thread(target=worker.submit, args=(request("7", limit=30), ContextState()))
    blocker.start()
    while worker.active != 1:
        pass

    def run(name: str, priority: int) -> None:
        worker.submit(request("a", limit=1, priority=priority), ContextState())
        order.append(name)

    threads = []
    for name, priority, queued in (("low", 0, 1), ("high", 5, 2), ("low2", 0, 3)):
        threads.append(threading.Thread(target=run, args=(name, priority)))
        threads[-1].start()
        while worker.queued != queued:
            pass
    for thread in [blocker, *threads]:
        thread.join()
    assert order == ["high", "low", "low2"]
    worker.close()


def test_full_queue_is_busy_and_cancel_is_a_runtime_error(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, n_seq=1, delay=0.01)
    state = ContextState()
    blocker = threading.Thread(target=worker.submit, args=(request("7", limit=1000), state))
    blocker.start()
    while worker.active != 1:
        pass
    busy = worker.submit(request("a", max_queue=0), ContextState())
    assert busy.error is not None and busy.error.kind is ErrorKind.BUSY
    state.cancelled = True
    blocker.join()
    again = worker.submit(request("a"), state)
    assert again.error is not None and again.error.kind is ErrorKind.RUNTIME_ERROR
    worker.close()


def test_context_shift_keeps_generating(worker: ModelWorker) -> None:
    result = worker.submit(request("7", limit=200, ctx_shift=True, n_keep=1), ContextState())
    assert (result.stop_reason, len(result.generated)) == (StopReason.N_PREDICT, 200)
    assert text(result) == ("8901234567" * 20)


def test_embedding_mode_frees_the_cells(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model)
    result = worker.submit(request("abc", embed=True, limit=0), ContextState())
    assert result.stop_reason is StopReason.EMBEDDING and len(result.embedding) == 8
    assert all(not slot.kv for slot in worker.slots)
    worker.close()


def test_request_records_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        request("a").limit = 3  # type: ignore[misc]


def test_fake_model_tokenizes_like_the_real_vocabulary(fake_model: pathlib.Path) -> None:
    model = FakeModel(fake_model, 512)
    assert model.tokenize(b"a b") == successor_tokenize("a b")
    assert model.tokenize("é".encode()) == successor_tokenize("é")
    assert b"".join(model.piece(t) for t in model.tokenize(b"<s>x</s>", add_special=False)) == b"<s>x</s>"


def test_shared_pool_decodes_every_context_and_pushes_back_when_full(fake_model: pathlib.Path) -> None:
    """16 sequence ids in a pool of 100 cells: 8 short contexts all decode together; 4 long ones
    cannot all fit, so some wait (or are pushed back) and still finish with the right text."""
    worker = make_worker(fake_model, n_seq=16, n_ctx_seq=64, n_cells=100, delay=0.002)
    results: list[GenerationResult] = []

    def run(prompt: str, limit: int) -> None:
        results.append(worker.submit(request(prompt, limit=limit), ContextState()))

    threads = [threading.Thread(target=run, args=("a", 5)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [text(r) for r in results] == ["bcdef"] * 8
    assert worker.sequences_high_water == 8 and worker.preemptions == 0
    results.clear()
    threads = [threading.Thread(target=run, args=("7", 40)) for _ in range(4)]  # 42 cells each
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [text(r) for r in results] == [("8901234567" * 4)] * 4
    assert worker.cells_used <= 100
    worker.close()
