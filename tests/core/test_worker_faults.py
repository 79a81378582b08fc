"""A bug in the model's worker, wherever it strikes in a step, ends the jobs it held with an internal error
(their callers' ``RUNTIME_ERROR``) instead of leaving them waiting for ever, and the worker serves the next
request as a fresh one: every sequence's cells are freed, so nothing decoded before the bug is reused."""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from wasinn_host.backend.fake import FakeRuntime
from wasinn_host.core.config.params import ModelParams, SamplingParams, StopParams
from wasinn_host.core.errors import ErrorKind
from wasinn_host.core.generation import GenerationRequest, GenerationResult, StopReason
from wasinn_host.core.runtime import KvLayout
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.core.scheduling.stream_feed import StreamFeed
from wasinn_host.testing.successor import successor_tokenize

pytestmark = pytest.mark.fast


def make_worker(model_path: pathlib.Path) -> ModelWorker:
    runtime = FakeRuntime()
    params = ModelParams(n_parallel=4, batch_size=64)
    model = runtime.load_model(model_path, params)
    return ModelWorker(model, runtime.new_context(model, params, KvLayout(256, 4)), "fake")


def request(text: str, limit: int, **kwargs: Any) -> GenerationRequest:
    return GenerationRequest(tuple(successor_tokenize(text)), limit, SamplingParams(temp=0.0), StopParams(), **kwargs)


def fail_once(worker: ModelWorker, name: str, after: int = 0) -> list[int]:
    """Make the worker's method ``name`` raise at its call number ``after`` (0: the first); the calls made."""
    original: Callable[..., Any] = getattr(worker, name)
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == after + 1:
            raise RuntimeError(f"a bug in {name}")
        return original(*args, **kwargs)

    setattr(worker, name, failing)
    return calls


def text(result: GenerationResult) -> str:
    return bytes(result.text).decode()


def test_a_bug_in_a_step_fails_the_computation_and_the_next_one_is_served(
    fake_model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(fake_model)
    state = ContextState()
    first = worker.submit(request("1234", 6), state)
    assert text(first) == "567890"
    calls = fail_once(worker, "_plan_batch")
    with caplog.at_level(logging.ERROR, logger="wasinn_host"):
        failed = worker.submit(request("12345678", 6), state)
    assert failed.stop_reason is StopReason.INTERNAL_ERROR
    assert failed.error is not None and failed.error.kind is ErrorKind.RUNTIME_ERROR
    assert [r.message for r in caplog.records if "worker error" in r.message] == [
        "model fake: worker error: a bug in _plan_batch"
    ]
    assert all(not slot.kv for slot in worker.slots), "the cells decoded before the bug were freed"
    again = worker.submit(request("12345678", 6), state)
    worker.close()
    assert calls[0] > 1
    assert (text(again), again.stop_reason, again.error) == ("901234", StopReason.N_PREDICT, None)
    assert again.reused_tokens == 0, "nothing decoded before the bug is reused"


def test_a_bug_handing_a_stream_its_tokens_ends_the_stream_with_an_error(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model)
    feed = StreamFeed()
    fail_once(worker, "_deliver", after=3)
    worker.start_stream(request("7", 1 << 20, streaming=True), ContextState(), feed)
    taken: list[GenerationResult] = []

    def guest() -> None:
        while (item := feed.take()) is not None:
            taken.append(item)

    reader = threading.Thread(target=guest, daemon=True)
    reader.start()
    reader.join(10.0)
    assert not reader.is_alive(), "the stream's guest was left waiting"
    assert feed.final is not None and feed.final.stop_reason is StopReason.INTERNAL_ERROR
    assert feed.final.error is not None and feed.final.error.kind is ErrorKind.RUNTIME_ERROR
    tokens = "".join(text(item) for item in taken)
    assert tokens == "890"[: len(tokens)], "the tokens handed over before the bug are the stream's"
    after = worker.submit(request("7", 3), ContextState())
    worker.close()
    assert text(after) == "890"


def test_a_bug_releasing_a_context_is_logged_once_and_the_worker_still_closes(
    fake_model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(fake_model)
    state = ContextState()
    worker.submit(request("1234", 2), state)
    releasing = worker._do_releases

    def failing() -> None:  # a bug in releasing one context: it fails whenever that context is released
        if state in worker._releases:
            raise RuntimeError("a bug releasing a context")
        releasing()

    worker._do_releases = failing  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="wasinn_host"):
        worker.release(state)
        deadline = time.monotonic() + 10.0
        while not any("worker error" in r.message for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.001)
        after = worker.submit(request("1234", 2), ContextState())
        closer = threading.Thread(target=worker.close, daemon=True)
        closer.start()
        closer.join(10.0)
    assert not closer.is_alive(), "the worker did not close"
    assert text(after) == "56"
    assert [r.message for r in caplog.records if "worker error" in r.message] == [
        "model fake: worker error: a bug releasing a context"
    ]


def test_a_completion_callback_that_raises_costs_the_other_requests_nothing(
    fake_model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(fake_model)
    done = threading.Event()

    def on_done() -> None:
        done.set()
        raise RuntimeError("the caller's callback failed")

    with caplog.at_level(logging.ERROR, logger="wasinn_host"):
        bystander: list[GenerationResult] = []
        long = threading.Thread(target=lambda: bystander.append(worker.submit(request("1", 40), ContextState())))
        long.start()
        job = worker.submit_then(request("12", 3), ContextState(), on_done)
        assert done.wait(10.0)
        long.join(10.0)
        after = worker.submit(request("5", 2), ContextState())
    worker.close()
    assert text(job.result) == "345"
    assert [(text(r), r.stop_reason) for r in bystander] == [("2345678901" * 4, StopReason.N_PREDICT)]
    assert text(after) == "67"
    assert not [r for r in caplog.records if "worker error" in r.message]
    assert [r.message for r in caplog.records] == ["model fake: a request's completion callback failed"]


def test_a_stream_listener_that_raises_leaves_the_stream_its_tokens(
    fake_model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(fake_model)

    def listener() -> None:
        raise RuntimeError("the listener failed")

    feed = StreamFeed(listener=listener)
    with caplog.at_level(logging.ERROR, logger="wasinn_host"):
        worker.start_stream(request("7", 1 << 20, streaming=True), ContextState(), feed)
        taken = []
        for _ in range(10):  # fewer than the lookahead: the job cannot pause before they are taken
            item = feed.take()
            assert item is not None and item.error is None, item
            taken.append(text(item))
        feed.end()
        after = worker.submit(request("5", 2), ContextState())
    worker.close()
    assert "".join(taken) == "8901234567"
    assert text(after) == "67"
    assert not [r for r in caplog.records if "worker error" in r.message]
    assert {r.message for r in caplog.records} == {"wasinn: a stream's listener failed"}


def test_a_piece_callback_that_raises_ends_its_request_alone(
    fake_model: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(fake_model)
    pieces: list[bytes] = []

    def on_piece(piece: bytes) -> None:
        pieces.append(piece)
        if len(pieces) == 3:
            raise RuntimeError("the caller's sink failed")

    with caplog.at_level(logging.ERROR, logger="wasinn_host"):
        bystander: list[GenerationResult] = []
        long = threading.Thread(target=lambda: bystander.append(worker.submit(request("1", 40), ContextState())))
        long.start()
        failed = worker.submit(request("12", 10, on_piece=on_piece), ContextState())
        long.join(10.0)
        after = worker.submit(request("5", 2), ContextState())
    worker.close()
    assert pieces == [b"3", b"4", b"5"]
    assert failed.stop_reason is StopReason.INTERNAL_ERROR
    assert failed.error is not None and failed.error.kind is ErrorKind.RUNTIME_ERROR
    assert [(text(r), r.stop_reason) for r in bystander] == [("2345678901" * 4, StopReason.N_PREDICT)]
    assert text(after) == "67"
    assert not [r for r in caplog.records if "worker error" in r.message]
    assert [r.message for r in caplog.records] == ["model fake: a request's piece callback failed; the request ends"]
