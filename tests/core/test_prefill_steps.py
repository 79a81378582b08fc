"""Chunked prefill in the worker, on the fake runtime whose decodes cost as on a CPU (a fixed part and a
part per token): while streams generate, no step costs more than ``prefill-step-budget`` plain decode
steps by the worker's own cost model; a lone prompt takes whole batches; the cap follows priority."""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from wasinn_host.backend.fake import FakeRuntime
from wasinn_host.core.config.params import ModelParams, SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest, GenerationResult, StopReason
from wasinn_host.core.runtime import KvLayout
from wasinn_host.core.scheduling.prefill_budget import OVER_LIMIT, step_limit
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.core.scheduling.stream_feed import StreamFeed
from wasinn_host.testing.successor import successor_tokenize

pytestmark = pytest.mark.fast

BATCH = 64
LONG = "abcdefghij" * 40  # 401 tokens with BOS; the successor model answers "a" -> "b" ... so "j" -> "k"


def make_worker(model_path: pathlib.Path, budget: float = 3.0, n_seq: int = 4) -> ModelWorker:
    """A worker whose decodes take 2 ms plus 0.5 ms per token."""
    runtime = FakeRuntime(decode_delay=0.002, token_delay=0.0005)
    params = ModelParams(n_parallel=n_seq, batch_size=BATCH)
    model = runtime.load_model(model_path, params)
    context = runtime.new_context(model, params, KvLayout(512, n_seq))
    return ModelWorker(model, context, "fake", prefill_step_budget=budget)


def request(tokens: list[int], limit: int, **kwargs: object) -> GenerationRequest:
    return GenerationRequest(tuple(tokens), limit, SamplingParams(temp=0.0), StopParams(), **kwargs)  # type: ignore[arg-type]


@dataclass
class Decode:
    counts: list[tuple[int, int]]
    generating: list[tuple[int, int]]
    """The streams' sequences in this batch."""
    streams: int
    """Streams between their first and their last token (in the batch or between two steps)."""
    seconds: float
    """The step's cost by the worker's model when it was planned (split or not, as it was planned)."""
    plain: float
    """A decode step of the streams alone, by the same model."""


@dataclass
class Recorder:
    """Wraps the worker's decode: what each batch held, and the streams generating at that moment."""

    worker: ModelWorker
    streams: list[ContextState] = field(default_factory=list)
    generating: set[int] = field(default_factory=set)
    decodes: list[Decode] = field(default_factory=list)

    def __post_init__(self) -> None:
        decode = self.worker.context.decode

        def recorded(batch: object, first: int = 0, count: int | None = None) -> int:
            if first > 0:  # the second decode of a split step: the step was recorded at its first
                return decode(batch, first, count)
            worker, cost = self.worker, self.worker.budget_cost
            counts = list(worker._batch_counts)
            entries = [(seq, n, start) for (seq, n), start in zip(counts, worker._batch_starts)]
            seqs = {s.slot.seq_id for i, s in enumerate(self.streams) if i in self.generating and s.slot is not None}
            gens = [(seq, n) for seq, n in counts if seq in seqs]
            n_streams = len(self.generating)
            # the streams' plain step at the positions of their tokens in this batch (their cells were added)
            plain = [(seq, n, len(worker.slots[seq].kv) - n) for seq, n in gens]
            self.decodes.append(
                Decode(
                    counts,
                    gens,
                    n_streams,
                    cost.step_seconds([e for e in entries if e[0] in seqs], [e for e in entries if e[0] not in seqs])[
                        0
                    ],
                    step_limit(plain, n_streams - len(gens), cost, 1.0) or 0.0,
                )
            )
            return decode(batch, first, count)

        self.worker.context.decode = recorded  # type: ignore[method-assign]

    def stream(self, index: int, steps: int, out: list[str]) -> Callable[[], None]:
        """A ``compute_single`` stream of ``steps`` tokens after the prompt "7" (the digits cycle), as the
        front end runs one: one job sampling into the stream's feed, ended after the last token taken."""
        state = ContextState()
        self.streams.append(state)

        def run() -> None:
            feed = StreamFeed()
            self.worker.start_stream(request(successor_tokenize("7"), 1 << 30, streaming=True), state, feed)
            generated: list[int] = []
            for step in range(steps):
                result = feed.take()
                assert result is not None and result.stop_reason is StopReason.TOKEN, result
                generated += result.generated
                if step == 0:
                    self.generating.add(index)
            self.generating.discard(index)
            feed.end()
            out.append(bytes(b for t in generated for b in self.worker.model.piece(t)).decode())

        return run


def run_mixed(worker: ModelWorker, steps: int = 24, streams: int = 3) -> tuple[Recorder, list[str], GenerationResult]:
    """``streams`` streams of ``steps`` tokens; once all have their first token, the long prompt.

    A stream whose guest thread is starved on a busy machine falls ``LOOKAHEAD`` tokens behind and its
    job pauses; past the worker's window for a paused stream it no longer counts as generating, and the
    prompt rightly takes whole batches.  The window is made long enough for any machine."""
    worker.paused_streams.window_s = 60.0
    recorder = Recorder(worker)
    texts: list[str] = []
    threads = [threading.Thread(target=recorder.stream(i, steps, texts)) for i in range(streams)]
    for thread in threads:
        thread.start()
    while len(recorder.generating) < streams:
        time.sleep(0.001)
    recorder.decodes.clear()
    long = worker.submit(request(successor_tokenize(LONG), 1), ContextState())
    for thread in threads:
        thread.join()
    return recorder, texts, long


def test_while_streams_generate_no_step_exceeds_the_budget(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, budget=3.0)
    recorder, texts, long = run_mixed(worker)
    worker.close()
    assert texts == ["8901234567890123456789012"[:24]] * 3
    assert (bytes(long.text), long.stop_reason) == (b"k", StopReason.N_PREDICT)
    mixed = [d for d in recorder.decodes if d.streams == 3 and len(d.counts) > len(d.generating)]
    assert len(mixed) > 401 // (BATCH - 3) + 1, "the long prompt was decoded in chunks while the streams generated"
    edges = {1 << k for k in range(12)} | {(1 << k) + 1 for k in range(12)}
    for decode in mixed:
        # a chunk at a row class's edge may go OVER_LIMIT over: the class is cheaper a token, or unpriced yet
        rows = sum(n for _, n in decode.counts) - sum(n for _, n in decode.generating)
        over = 1 + OVER_LIMIT if rows in edges else 1.0
        assert decode.seconds <= 3.0 * decode.plain * over * (1 + 1e-9), decode
    assert max(sum(n for _, n in d.counts) for d in mixed) < BATCH
    assert worker.capped_prompt_steps >= len(mixed) - 1


def test_off_the_long_prompt_takes_whole_batches_beside_streams(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, budget=0.0)
    recorder, texts, long = run_mixed(worker)
    worker.close()
    assert bytes(long.text) == b"k"
    mixed = [d for d in recorder.decodes if d.streams and len(d.counts) > len(d.generating)]
    assert max(sum(n for _, n in d.counts) for d in mixed) == BATCH
    assert worker.capped_prompt_steps == 0


def test_a_lone_prompt_takes_whole_batches(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model)
    recorder = Recorder(worker)
    state = ContextState()
    first = worker.submit(request(successor_tokenize("y"), 1, streaming=True), state)
    last = worker.submit(request([*successor_tokenize("y"), *first.generated], 1, streaming=True), state)
    assert (first.stop_reason, last.stop_reason) == (StopReason.TOKEN, StopReason.EOS)  # that stream ended
    recorder.decodes.clear()
    long = worker.submit(request(successor_tokenize(LONG), 1), ContextState())
    worker.close()
    assert bytes(long.text) == b"k"
    assert [sum(n for _, n in d.counts) for d in recorder.decodes] == [BATCH] * 6 + [401 - 6 * BATCH]


def test_a_stream_between_steps_keeps_the_cap(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model)
    worker.paused_streams.window_s = 60.0  # however slow this machine is today
    recorder = Recorder(worker)
    paused = worker.submit(request(successor_tokenize("7"), 1, streaming=True), ContextState())
    assert paused.stop_reason is StopReason.TOKEN  # its guest has not asked for the next token yet
    recorder.decodes.clear()
    worker.submit(request(successor_tokenize(LONG), 1), ContextState())
    worker.close()
    assert len(recorder.decodes) > 401 // BATCH + 1
    assert max(sum(n for _, n in d.counts) for d in recorder.decodes) < BATCH


def test_under_the_cap_the_higher_priority_prompt_goes_first(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model)
    recorder = Recorder(worker)
    done: list[str] = []
    texts: list[str] = []
    streams = [threading.Thread(target=recorder.stream(i, 60, texts)) for i in range(2)]  # as many as prompts
    for stream in streams:
        stream.start()
    while len(recorder.generating) < 2:
        time.sleep(0.001)

    def prompt(name: str, priority: int, text: str) -> None:
        worker.submit(request(successor_tokenize(text), 1, priority=priority), ContextState())
        done.append(name)

    low = threading.Thread(target=prompt, args=("low", 0, LONG[:200]))
    low.start()
    while sum(n for d in recorder.decodes for seq, n in d.counts if (seq, n) not in d.generating) < 30:
        time.sleep(0.001)  # the low-priority prompt is under way
    high = threading.Thread(target=prompt, args=("high", 5, LONG[1:201]))  # no prefix to share with low
    high.start()
    for thread in (low, high, *streams):
        thread.join()
    worker.close()
    assert done == ["high", "low"]
