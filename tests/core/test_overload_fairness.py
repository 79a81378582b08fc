"""Overload (issue 30 item 6): many streams at once on few sequences with ``max-queue`` reached.  The
refused get Busy at their first step, and every admitted stream progresses to its end: none is refused
in the middle of its stream, none starves (worker on the fake runtime, ``compute_single``-like loops)."""

from __future__ import annotations

import pathlib
import statistics
import threading
import time

import pytest

from wasinn_host.backend.fake import FakeRuntime
from wasinn_host.core.config.params import ModelParams, SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest, StopReason
from wasinn_host.core.runtime import KvLayout
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.testing.successor import successor_tokenize

pytestmark = pytest.mark.fast

STEPS = 16


def make_worker(model_path: pathlib.Path, n_seq: int) -> ModelWorker:
    runtime = FakeRuntime(decode_delay=0.002, token_delay=0.0002)
    params = ModelParams(n_parallel=n_seq, batch_size=256)
    model = runtime.load_model(model_path, params)
    return ModelWorker(model, runtime.new_context(model, params, KvLayout(128, n_seq)), "fake")


def test_admitted_streams_all_progress_and_the_refused_are_refused_at_once(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, n_seq=4)
    guests = 24
    barrier = threading.Barrier(guests)
    outcomes: list[tuple[int, StopReason, list[int]]] = []
    """(tokens received, how the stream ended, the worker's decode count at each token)."""

    def stream(i: int) -> None:
        state, prompt, generated, steps = ContextState(), successor_tokenize("7" * (i % 5 + 1)), list[int](), []
        barrier.wait()
        time.sleep(0.006 * i)  # they arrive over a few steps: the sequences fill, then the queue
        reason = StopReason.TOKEN
        for _ in range(STEPS):
            request = GenerationRequest(
                tuple(prompt + generated), 1, SamplingParams(), StopParams(), streaming=True, max_queue=4
            )
            result = worker.submit(request, state)
            reason = result.stop_reason
            if reason is not StopReason.TOKEN:
                break
            generated += result.generated
            steps.append(worker.decode_calls)
        outcomes.append((len(generated), reason, steps))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(guests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    worker.close()
    refused = [o for o in outcomes if o[1] is StopReason.QUEUE_FULL]
    admitted = [o for o in outcomes if o[1] is not StopReason.QUEUE_FULL]
    assert refused and len(admitted) > 4, "the queue filled, and more streams were admitted than sequences"
    assert all(n == 0 for n, _, _ in refused), "Busy comes at a stream's first step, never in its middle"
    assert all(n == STEPS for n, _, _ in admitted), "every admitted stream got all its tokens"
    # none starves: decodes between a stream's first and last token, against the median stream's
    spans = [steps[-1] - steps[0] for _, _, steps in admitted]
    assert max(spans) <= 2 * statistics.median(spans), spans
