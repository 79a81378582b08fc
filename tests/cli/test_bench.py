"""``wasinn bench``: real guests through ``wasinn run --instances N`` and llama.cpp alone in its own
process, on small models, one run each (short: the figures are not judged, only what they are made of)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from wasinn_host.bench.report import Results, table, to_json
from wasinn_host.bench.runner import run_bench
from wasinn_host.testing.gguf_models import write_random_model

SVG = "{http://www.w3.org/2000/svg}"
STEP_KEYS = {"admit", "plan", "sample", "host", "guests", "llama_cpp"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """One run of 1 and 3 guests, 6 tokens each, on a small random model, llama.cpp with one thread."""
    model = write_random_model(
        tmp_path_factory.mktemp("bench") / "small.gguf", n_layer=2, n_embd=64, n_head=2, n_ff=128, n_vocab=400
    )
    stages: list[str] = []
    results = run_bench(model, [1, 3], ["compute", "stream"], 6, 12, 1, stages.append, threads=1)
    assert stages[0].startswith("warming up") and stages[-1] == "run 1/1: llama.cpp alone, 3 sequences"
    assert "run 1/1: 3 guests stream" in stages
    return results


def test_every_guest_answered_and_the_worker_decoded_them_together(small_run: Results) -> None:
    report = to_json(small_run)
    assert report["runs"] == 1 and report["guests"] == [1, 3] and report["ways"] == ["compute", "stream"]
    assert [(r["guests"], r["way"]) for r in report["host"]] == [
        (1, "compute"),
        (1, "stream"),
        (3, "compute"),
        (3, "stream"),
    ]
    for row in report["host"]:
        assert len(row["tokens_per_s_runs"]) == 1 and row["tokens_per_s"] > 0
        assert row["ratio_to_llama_cpp"] > 0 and row["ratio_to_llama_cpp_sampled"] > 0 and row["ttft_ms"] > 0
        assert set(row["step_ms"]) == STEP_KEYS
        assert row["step_ms"]["host"] == pytest.approx(
            row["step_ms"]["admit"] + row["step_ms"]["plan"] + row["step_ms"]["sample"], abs=0.002
        )
        # a step decodes at most one token per sequence once the prompts are in: 6 tokens need >= 5 steps
        assert row["steps"] >= 5 and 0 < row["sequences_per_decode"] <= row["guests"]
        assert row["host_us_per_sequence_step"] == pytest.approx(
            row["step_ms"]["host"] * 1000 / row["sequences_per_decode"], rel=0.01
        )
    assert [r["guests"] for r in report["llama_cpp"]] == [1, 3]
    for ref in report["llama_cpp"]:
        assert ref["tokens_per_s"] > 0 and ref["sampled_tokens_per_s"] > 0 and ref["ttft_ms"] > 0
    assert (report["threads"], report["threads_given"]) == (1, True) and report["machine"]["cpus"] >= 1
    assert {run.params["threads"] for runs in small_run.host.values() for run in runs} == {1}  # the guests' key
    assert json.loads(json.dumps(report)) == report


def test_the_table_has_a_line_per_guests_and_way_and_for_llama_cpp(small_run: Results) -> None:
    lines = table(small_run).splitlines()
    assert lines[0].startswith("model small.gguf (") and "6 tokens a guest after a 12-letter prompt" in lines[0]
    assert "default settings but --threads; llama.cpp threads 1; medians of 1 run " in lines[0]
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [r[:2] for r in rows] == [
        ["1", "compute"],
        ["1", "stream"],
        ["1", "llama.cpp"],
        ["1", "llama.cpp+sampler"],
        ["3", "compute"],
        ["3", "stream"],
        ["3", "llama.cpp"],
        ["3", "llama.cpp+sampler"],
    ]
    report = to_json(small_run)
    host_rows = [r for r in rows if r[1] in ("compute", "stream")]
    for row, figures in zip(host_rows, report["host"]):
        assert float(row[2]) == pytest.approx(figures["tokens_per_s"], abs=0.06)
        assert float(row[4]) == pytest.approx(figures["ratio_to_llama_cpp"], abs=0.0006)
        assert len(row) == 14  # tok/s, spread, 2 ratios, TTFT, 6 step columns, host us per sequence-step


def test_the_command_line_writes_the_default_model_json_and_chart(tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    chart = tmp_path / "tokens.svg"
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "bench", "--guests", "1,2", "--tokens", "4", "--runs", "1"]
        + ["--ways", "stream", "--json", "--plot", str(chart)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cache" / "wasinn" / "bench" / "fast-step.gguf").stat().st_size > 30_000_000
    progress = result.stderr.splitlines()
    assert progress[0] == "wasinn bench: warming up: the guest compiled, the model loaded"
    assert progress[-1] == "wasinn bench: run 1/1: llama.cpp alone, 2 sequences"
    report = json.loads(result.stdout)
    assert report["model"].endswith("fast-step.gguf") and report["tokens"] == 4 and report["prompt_letters"] == 32
    assert report["threads_given"] is False and report["threads"] == len(os.sched_getaffinity(0))
    assert [(r["guests"], r["way"]) for r in report["host"]] == [(1, "stream"), (2, "stream")]

    root = ET.parse(chart).getroot()
    assert root.tag == f"{SVG}svg"
    points: dict[str | None, object] = {
        group.get("data-series"): [
            (int(c.get("data-guests", "0")), float(c.get("data-tokens-per-s", "0"))) for c in group.iter(f"{SVG}circle")
        ]
        for group in root.iter(f"{SVG}g")
    }
    assert points == {
        "stream": [(r["guests"], pytest.approx(r["tokens_per_s"], rel=1e-5)) for r in report["host"]],
        "llama.cpp": [(r["guests"], pytest.approx(r["tokens_per_s"], rel=1e-5)) for r in report["llama_cpp"]],
        "llama.cpp+sampler": [
            (r["guests"], pytest.approx(r["sampled_tokens_per_s"], rel=1e-5)) for r in report["llama_cpp"]
        ],
    }


def test_a_file_llama_cpp_cannot_load_is_one_error_line(tmp_path: pathlib.Path) -> None:
    model = tmp_path / "notes.gguf"
    model.write_text("GGUF, then not a model")  # past the CLI's check of the first bytes, refused by llama.cpp
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "bench", str(model), "--guests", "1", "--runs", "1", "--tokens", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (result.returncode, result.stdout) == (2, "")
    progress, error = result.stderr.splitlines()
    assert progress == "wasinn bench: warming up: the guest compiled, the model loaded"
    assert error.startswith("wasinn: error: 1 guest (compute): wasinn run failed: wasi-nn load_by_name_with_config: ")
    assert f"could not load model file '{model}'" in error and "failed to read header" in error
