"""Chunked prefill through real guests and real llama.cpp: streaming ``chat.wasm`` guests keep their pace
while a ``complete.wasm`` guest's long prompt is decoded in chunks beside them, and every text is the
one the successor model gives alone."""

from __future__ import annotations

import json
import pathlib
import threading
import time

from wasinn_host import WasiNN
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import run_guest

LONG = "abcdefghij" * 20
"""201 tokens with BOS; the successor model answers "klm..." after the last "j"."""
STREAM_TOKENS = 150


def worker_with_budget(nn: WasiNN, budget: float) -> ModelWorker:
    return next(m.worker for m in nn.registry.loaded() if m.params.prefill_step_budget == budget)


def run_mixed(nn: WasiNN, tmp_path: pathlib.Path, budget: float) -> tuple[ModelWorker, list[list[tuple[int, int]]]]:
    """Three streams of ``STREAM_TOKENS`` tokens; once they generate, the long prompt (3 tokens)."""
    config = json.dumps({"prefill-step-budget": budget, "ctx-size": 512})
    code, out, err = run_guest(nn, tmp_path, "complete", ["succ", "a"], env={"WASINN_CONFIG": config})
    assert (code, out) == (0, successor_text("a") + "</s>\n"), err  # the model is loaded
    worker = worker_with_budget(nn, budget)
    batches: list[list[tuple[int, int]]] = []
    decode = worker.context.decode

    def recorded(batch: object, first: int = 0, count: int | None = None) -> int:
        batches.append(list(worker._batch_counts))
        return decode(batch, first, count)

    worker.context.decode = recorded  # type: ignore[method-assign]
    outputs: dict[str, tuple[int, str, str]] = {}
    env = {"WASINN_CONFIG": config, "n_predict": str(STREAM_TOKENS)}

    def stream(i: int) -> None:
        outputs[f"stream{i}"] = run_guest(nn, tmp_path / f"s{i}", "chat", ["succ"], stdin="7\n", env=env)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    generated = worker.generated_tokens
    for i, thread in enumerate(threads):
        (tmp_path / f"s{i}").mkdir(exist_ok=True)
        thread.start()
    while worker.generated_tokens < generated + 6:
        time.sleep(0.001)
    long_env = {"WASINN_CONFIG": json.dumps({"prefill-step-budget": budget, "ctx-size": 512, "n-predict": 3})}
    outputs["long"] = run_guest(nn, tmp_path, "complete", ["succ", LONG], env=long_env)
    for thread in threads:
        thread.join()
    worker.context.decode = decode  # type: ignore[method-assign]
    for i in range(3):
        code, out, err = outputs[f"stream{i}"]
        assert (code, out) == (0, successor_text("7", STREAM_TOKENS) + "\n"), err
    code, out, err = outputs["long"]
    assert (code, out) == (0, successor_text("j", 3) + "\n"), err
    return worker, batches


def long_prompt_steps(batches: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """(tokens of the long prompt, tokens of other sequences) in each batch that decoded part of it."""
    totals: dict[int, int] = {}
    for counts in batches:
        for seq, n in counts:
            totals[seq] = totals.get(seq, 0) + n
    long_seq = max(totals, key=lambda seq: totals[seq])
    steps, seen = [], 0
    for counts in batches:
        for seq, n in counts:
            if seq == long_seq and seen < 201:
                steps.append((n, sum(m for other, m in counts if other != long_seq)))
                seen += n
    return steps


def long_prompt_decodes(batches: list[list[tuple[int, int]]]) -> list[int]:
    """The tokens the long prompt's sequence had in each batch that decoded part of its prompt."""
    return [take for take, _ in long_prompt_steps(batches)]


def test_a_long_prompt_beside_streaming_guests_under_the_budget(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """Budget 1: every text is the successor model's own (``run_mixed`` checks them) and the prompt is all
    decoded.  How the prompt is cut depends on when the streams step on this machine (a stream between two
    steps, one re-decoding after losing its sequence), so the exact chunks are checked on the fake runtime
    (``tests/core/test_prefill_steps.py``)."""
    _worker, batches = run_mixed(nn, tmp_path, budget=1.0)
    steps = long_prompt_steps(batches)
    assert sum(take for take, _ in steps) >= 200, steps


def test_without_the_budget_the_long_prompt_takes_one_batch(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    worker, batches = run_mixed(nn, tmp_path, budget=0.0)
    assert long_prompt_decodes(batches)[0] >= 201 - 1  # all of it at once (its BOS may be reused)
    assert worker.capped_prompt_steps == 0
