"""Sequences follow demand: guests that never set n-parallel all decode together (real llama.cpp)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from wasinn_host.testing.gguf_models import successor_text

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUESTS = ROOT / "guest_examples"


def test_32_instances_without_n_parallel_decode_together(successor_path: pathlib.Path) -> None:
    """`wasinn run --instances 32` of a guest setting only ctx-size, batch-size, threads and temp (as
    real guests do): all 32 answers are right, and the model grew past its 4 starting sequences
    so that the computing contexts shared decodes."""
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
    assert model["sequences_follow_demand"] and model["sequence_growths"] >= 1
    assert model["sequences"] > 4 and model["sequences_high_water"] > 4
    assert model["sequences_per_decode"] > 2.0
