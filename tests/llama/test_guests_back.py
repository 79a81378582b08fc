"""Streaming guests between decodes, on real llama.cpp: where llama.cpp's threads take every core, the
worker waits for the guests it handed tokens to before it decodes again (so they do not run beside the
decode); with a core to spare it does not wait; the texts are those of a compute either way."""

from __future__ import annotations

import os
import threading

import pytest

from wasinn_host import WasiNN

STREAMS = 4


def streamed(nn: WasiNN, threads: int) -> tuple[list[str], list[str], dict[str, int]]:
    """Each prompt streamed by its own session, all at once, and completed alone; the model's counters."""
    config = {"ctx-size": 256, "n-predict": 24, "ignore-eos": True, "temp": 0, "threads": threads}
    prompts = list("abcd"[:STREAMS])
    texts = [""] * STREAMS
    barrier = threading.Barrier(STREAMS)

    def run(i: int) -> None:
        with nn.session("succ", config) as session:
            barrier.wait()
            texts[i] = b"".join(session.stream(prompts[i])).decode()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    alone = []
    for prompt in prompts:
        with nn.session("succ", config) as session:
            alone.append(session.complete(prompt))
    (model,) = [m for m in nn.status()["models"] if m["params"]["threads"] == threads]
    return texts, alone, {key: model[key] for key in ("guests_awaited", "late_guests")}


def test_with_every_core_decoding_the_worker_waits_for_the_streaming_guests(successor_host: WasiNN) -> None:
    texts, alone, counters = streamed(successor_host, len(os.sched_getaffinity(0)))
    assert texts == alone and len(set(texts)) == STREAMS
    assert counters["guests_awaited"] > 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core to spare needs two cores")
def test_with_a_core_to_spare_the_guests_run_beside_the_decode(successor_host: WasiNN) -> None:
    texts, alone, counters = streamed(successor_host, 1)
    assert texts == alone and len(set(texts)) == STREAMS
    assert counters == {"guests_awaited": 0, "late_guests": 0}
