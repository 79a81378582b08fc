"""Sequences follow demand: guests that never set n-parallel all decode together (real llama.cpp), a
bigger context made beside the running one where the KV budget holds both (the fake runtime)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading

import pytest
from conftest import MakeNN

from wasinn_host import Limits
from wasinn_host.backend.fake import KV_BYTES_PER_CELL
from wasinn_host.core.scheduling import context_growth
from wasinn_host.testing.gguf_models import successor_text

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUESTS = ROOT / "guest_examples"


def test_32_instances_without_n_parallel_decode_together(successor_path: pathlib.Path) -> None:
    """`wasinn run --instances 32` of a guest setting only ctx-size, batch-size, threads and temp (as
    real guests do): all 32 answers are right, and the model started with room for all 32 (the
    instances are known before the model loads: no guest waits for the context to grow) so that the
    computing contexts shared decodes."""
    env = ["--env", "ctx_size=64", "--env", "batch_size=512", "--env", "threads=2", "--env", "temp=0"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wasinn_host",
            "run",
            "--nn-preload",
            f"default:GGML:AUTO:{successor_path}",
            "--instances",
            "32",
            "--status",
            *env,
            str(GUESTS / "complete.wasm"),
            "default",
            "hello",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [successor_text("hello") + "</s>"] * 32
    (model,) = json.loads(result.stderr.strip().splitlines()[-1])["models"]
    assert model["sequences_follow_demand"] and model["sequence_growths"] == 0
    assert model["sequences"] == 32 and model["sequences_high_water"] > 4
    assert model["sequences_per_decode"] > 2.0


@pytest.mark.parametrize(
    "budget_cells, cores, beside",
    [(1 << 20, 4, True), (10 * 512, 4, False), (1 << 20, 1, False)],
    ids=["room", "short budget", "no spare core"],
)
def test_a_bigger_context_is_made_beside_the_running_one_only_with_room_and_a_spare_core(
    make_nn: MakeNN, monkeypatch: pytest.MonkeyPatch, budget_cells: int, cores: int, beside: bool
) -> None:
    """Eight contexts computing at once on a model of 4 sequences x 512 cells (one thread): with room in
    the KV budget for the new context beside the old one and a core the decode leaves free, it is made
    while the running ones step; with room for 8 sequences but not for 4 + 8 at once, or with no core
    to spare, the old one is freed first.  The answers are the same."""
    monkeypatch.setattr(context_growth, "available_cores", lambda: cores)
    nn = make_nn(Limits(max_kv_bytes=budget_cells * KV_BYTES_PER_CELL), decode_delay=0.002)
    texts: list[str] = [""] * 8
    barrier = threading.Barrier(8)

    def run(i: int) -> None:
        with nn.session("succ", {"temp": 0, "n-predict": 20}) as session:
            barrier.wait()
            texts[i] = session.complete("a")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert texts == [successor_text("a")[:20]] * 8
    (model,) = nn.registry.loaded()
    assert model.worker.growths >= 1 and len(model.worker.slots) >= 8
    assert (model.worker.growths_beside > 0) is beside
