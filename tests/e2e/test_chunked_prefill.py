"""Chunked prefill through real guests and real llama.cpp: streaming ``chat.wasm`` guests keep their pace
while a ``complete.wasm`` guest's long prompt is decoded in chunks beside them, and every text is the
one the successor model gives alone.

The worker is driven to a known state rather than left to this machine's timing: its decodes are
recorded and, once all three streams generate (a step of one token for each of them), that step waits
until the long prompt has been submitted, so the prompt always arrives while every stream has almost all
of its tokens to go.  Until then the step budget is off (the streams' own prompts are decoded whole, not
cut beside the first stream), and the budget uses the cost model's prior (a token costs as much as a
pass) instead of the model it fits to this machine's decodes, so how far it cuts a chunk does not
depend on how fast the machine is.  The exact chunks under a measured cost are checked on the fake
runtime (``tests/core/test_prefill_steps.py``).
"""

from __future__ import annotations

import collections
import json
import pathlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wasinn_host import WasiNN
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.core.scheduling.step_cost import Pass, StepCost
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import run_guest

LONG = "abcdefghij" * 20
"""201 tokens with BOS; the successor model answers "klm..." after the last "j"."""
LONG_TOKENS = 201
STREAMS = 3
STREAM_TOKENS = 150
N_PARALLEL = STREAMS + 1
"""A sequence for every guest: none waits, and no context growth re-decodes a stream's tokens."""
WAIT = 60.0
"""The longest the test waits for the worker or a guest (only a failure waits that long)."""


class PriorCost(StepCost):
    """The step cost model's prior whatever the decodes take: a pass and a token cost 1 each, cells nothing."""

    def record(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """Decodes teach it nothing."""

    def record_passes(self, shapes: Sequence[Pass], seconds: float) -> None:
        """Nor their passes."""

    def record_single_rows(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """Nor a carried plan's."""


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:.0f} s for {what}"
        time.sleep(0.001)


def load_time_config(budget: float) -> dict[str, float | int]:
    return {"prefill-step-budget": budget, "ctx-size": 512, "n-parallel": N_PARALLEL}


def worker_for(nn: WasiNN, budget: float) -> ModelWorker:
    return next(
        m.worker
        for m in nn.registry.loaded()
        if m.params.prefill_step_budget == budget and m.params.n_parallel == N_PARALLEL
    )


@dataclass
class Mixed:
    """What one run of three streams and the long prompt decoded, from the step held for the long prompt on."""

    worker: ModelWorker
    batches: list[list[tuple[int, int]]]
    """(sequence id, tokens) of every decode."""
    long_seq: int
    reused: int
    """The long prompt's tokens the worker found in its sequence's cells (its BOS at most)."""
    generated_before: int
    """Tokens the streams had generated when the long prompt came: each has at least
    ``STREAM_TOKENS - generated_before - 1`` left after the step they waited in."""

    def long_prompt_takes(self) -> list[int]:
        """The long prompt's tokens in each decode of its prompt, in order."""
        takes, seen = [], 0
        for counts in self.batches:
            for seq, n in counts:
                if seq == self.long_seq and seen < LONG_TOKENS - self.reused:
                    takes.append(n)
                    seen += n
        return takes


def run_mixed(nn: WasiNN, tmp_path: pathlib.Path, budget: float) -> Mixed:
    """Three streams of ``STREAM_TOKENS`` tokens; once all three generate, the long prompt (3 tokens)."""
    config = json.dumps(load_time_config(budget))
    code, out, err = run_guest(nn, tmp_path, "complete", ["succ", "A"], env={"WASINN_CONFIG": config})
    assert (code, out) == (0, successor_text("A") + "</s>\n"), err  # the model is loaded; "A" shares only BOS
    worker = worker_for(nn, budget)
    decode, step_cost, window = worker.context.decode, worker.step_cost, worker.paused_streams.window_s
    worker.step_cost = PriorCost()
    worker.paused_streams.window_s = WAIT  # a stream counts as generating until it ends, however late it asks
    worker.prefill_step_budget = 0.0  # until the gate: the streams' prompts go whole
    batches: list[list[tuple[int, int]]] = []
    started, waiting, generated = threading.Event(), threading.Event(), worker.generated_tokens
    # decodes each stream's sequence was in: its prompt's (whole, the budget being off), then one a token
    decodes: collections.Counter[int] = collections.Counter()
    generated_before = -1

    def recorded(batch: object, first: int = 0, count: int | None = None) -> int:
        nonlocal generated_before
        counts = list(worker._batch_counts)
        if not started.is_set():  # the first stream's prompt waits for the other two: they start together
            wait_until(lambda: worker.active + worker.queued >= STREAMS, "the three streams to reach the worker")
            started.set()
        if not waiting.is_set():
            decodes.update(seq for seq, _ in counts)
            if len(decodes) == STREAMS and min(decodes.values()) >= 2:  # every stream generates
                # hold this step until the long prompt is queued, with the streams that are between two
                # steps (each asks for its next token now), and turn the budget on from the next step
                generated_before = worker.generated_tokens - generated
                worker.prefill_step_budget = budget
                waiting.set()
                expected = STREAMS - len(counts) + 1
                wait_until(lambda: worker.queued >= expected, "the long prompt to reach the worker")
        if waiting.is_set() and first == 0:  # a split step's second decode: the same batch
            batches.append(counts)
        return decode(batch, first, count)

    worker.context.decode = recorded  # type: ignore[method-assign]
    outputs: dict[str, tuple[int, str, str]] = {}
    env = {"WASINN_CONFIG": config, "n_predict": str(STREAM_TOKENS)}

    def stream(i: int) -> None:
        outputs[f"stream{i}"] = run_guest(nn, tmp_path / f"s{i}", "chat", ["succ"], stdin="7\n", env=env)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    try:
        for i, thread in enumerate(threads):
            (tmp_path / f"s{i}").mkdir(exist_ok=True)
            thread.start()
        assert waiting.wait(WAIT), "the three streams never generated together"
        long_env = {"WASINN_CONFIG": json.dumps({**load_time_config(budget), "n-predict": 3})}
        outputs["long"] = run_guest(nn, tmp_path, "complete", ["succ", LONG], env=long_env)
        for thread in threads:
            thread.join(WAIT)
    finally:
        worker.context.decode = decode  # type: ignore[method-assign]
        worker.step_cost, worker.paused_streams.window_s, worker.prefill_step_budget = step_cost, window, budget
    for i in range(STREAMS):
        code, out, err = outputs[f"stream{i}"]
        assert (code, out) == (0, successor_text("7", STREAM_TOKENS) + "\n"), err
    code, out, err = outputs["long"]
    assert (code, out) == (0, successor_text("j", 3) + "\n"), err
    reused = json.loads(err.splitlines()[-1])["reused_tokens"]
    long_seqs = {seq for counts in batches for seq, _ in counts} - set(decodes)
    assert len(long_seqs) == 1, batches
    return Mixed(worker, batches, long_seqs.pop(), reused, generated_before)


def test_a_long_prompt_beside_streaming_guests_under_the_budget(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """Budget 1: the texts are the successor model's own (``run_mixed`` checks them), and the long prompt
    is cut while the streams go on: a step may cost one plain step of the streams, which leaves at most a
    token for each stream between two steps (one, the floor, when all are in the step), until the last
    stream ends; then the rest goes at once.  So the 200 tokens take at least 67 steps, or as many as
    the streams had tokens to go if they ended first (each decodes one token a step)."""
    mixed = run_mixed(nn, tmp_path, budget=1.0)
    takes = mixed.long_prompt_takes()
    assert sum(takes) + mixed.reused == LONG_TOKENS and mixed.reused <= 1, (takes, mixed.reused)
    to_go = STREAM_TOKENS - mixed.generated_before - 1
    assert len(takes) >= min(-(-(LONG_TOKENS - 1) // STREAMS), to_go), (takes, to_go)
    assert max(takes[:-1]) <= STREAMS, takes
    assert mixed.worker.capped_prompt_steps >= len(takes) - 1


def test_without_the_budget_the_long_prompt_takes_one_batch(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """Budget 0: the whole prompt in one decode, while the streams still generate (they go on after it)."""
    mixed = run_mixed(nn, tmp_path, budget=0.0)
    takes = mixed.long_prompt_takes()
    assert takes == [LONG_TOKENS - mixed.reused] and mixed.reused <= 1, (takes, mixed.reused)
    at = next(i for i, counts in enumerate(mixed.batches) if any(seq == mixed.long_seq for seq, _ in counts))
    assert any(seq != mixed.long_seq for counts in mixed.batches[at + 1 :] for seq, _ in counts)
    assert mixed.worker.capped_prompt_steps == 0
