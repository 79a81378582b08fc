"""``wasinn bench`` without running a model: its defaults, its one-line errors, the guest it ships, how it
reads a run's output, and the chart it draws."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from wasinn_host.bench.guests import GUEST, BenchError, command, failure, parse_run
from wasinn_host.bench.plot import chart_title, svg_chart
from wasinn_host.cli import build_parser

pytestmark = pytest.mark.fast
ROOT = pathlib.Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def test_the_defaults_are_the_issues_benchmark() -> None:
    ns = build_parser().parse_args(["bench"])
    assert ns.model is None
    assert ns.guests == [1, 8, 32, 64] and ns.ways == ["compute", "stream"]
    assert (ns.tokens, ns.prompt_letters, ns.runs, ns.threads, ns.json, ns.plot) == (128, 32, 5, None, False, None)
    ns = build_parser().parse_args(
        ["bench", "m.gguf", "--guests", "64,8,8,1", "--ways", "stream", "--threads", "1", "--json"]
    )
    assert (ns.model, ns.guests, ns.ways, ns.threads, ns.json) == ("m.gguf", [64, 8, 1], ["stream"], 1, True)


def test_a_file_that_is_no_gguf_model_is_refused_before_any_guest_starts(tmp_path: pathlib.Path) -> None:
    figures = tmp_path / "figures.json"
    figures.write_text('{"rows": []}')
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "bench", str(figures)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr == f"wasinn: error: {figures}: not a GGUF model file (it does not start with 'GGUF')\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.gguf"], "wasinn: error: no such model file: missing.gguf"),
        (
            ["--guests", "1,x"],
            "wasinn: error: argument --guests: expected numbers separated by commas, like 1,8,32, "
            "got '1,x' (see 'wasinn bench --help')",
        ),
        (
            ["--guests", "0"],
            "wasinn: error: argument --guests: guest counts are 1 to 256, got 0 (see 'wasinn bench --help')",
        ),
        (
            ["--guests", "8,300"],
            "wasinn: error: argument --guests: guest counts are 1 to 256, got 300 (see 'wasinn bench --help')",
        ),
        (
            ["--ways", "batch"],
            "wasinn: error: argument --ways: ways are compute and stream, comma-separated, got "
            "'batch' (see 'wasinn bench --help')",
        ),
        (
            ["--threads", "two"],
            "wasinn: error: argument --threads: expected a positive integer, got 'two' (see 'wasinn bench --help')",
        ),
        (
            ["--runs", "0"],
            "wasinn: error: argument --runs: expected a positive integer, got '0' (see 'wasinn bench --help')",
        ),
        (["--plot", "/no/such/dir/x.svg"], "wasinn: error: --plot /no/such/dir/x.svg: no such directory"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "bench", *args], capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message + "\n")


def test_the_packaged_guest_is_the_one_built_from_guest_examples() -> None:
    assert GUEST.read_bytes() == (ROOT / "guest_examples" / "bench.wasm").read_bytes()
    line = command(pathlib.Path("m.gguf"), 8, "stream", 128, 32)
    assert line[1:] == [
        "-m",
        "wasinn_host",
        "run",
        "--status",
        "--instances",
        "8",
        "--nn-preload",
        "bench:GGML:AUTO:m.gguf",
        "--env",
        'WASINN_CONFIG={"temp":0,"ignore-eos":true}',
        str(GUEST),
        "bench",
        "stream",
        "128",
        "32",
    ]
    assert command(pathlib.Path("m.gguf"), 1, "compute", 8, 4, threads=3)[10] == (
        'WASINN_CONFIG={"temp":0,"ignore-eos":true,"threads":3}'
    )


def _guest_line(start: int, first: int, end: int, tokens: int = 4) -> str:
    return json.dumps(
        {"mode": "compute", "tokens": 4, "output_tokens": tokens, "start_ns": start, "first_ns": first, "end_ns": end}
    )


STATUS = json.dumps(
    {
        "models": [
            {
                "step_time": {"host_ms_per_step": 0.5, "steps": 9},
                "sequences_per_decode": 2.0,
                "params": {"threads": 0},
            }
        ]
    }
)


def test_a_run_is_read_from_the_guests_clocks_and_the_status_line() -> None:
    stdout = _guest_line(1_000_000_000, 1_020_000_000, 1_400_000_000) + "\n"
    stdout += _guest_line(1_100_000_000, 1_140_000_000, 1_500_000_000) + "\n"
    run = parse_run(2, "compute", 4, stdout, "a warning line\n" + STATUS + "\n")
    assert run.tokens_per_s == pytest.approx(2 * 4 / 0.5)  # from the first start to the last end
    assert run.ttft_ms == pytest.approx(30.0)  # the median of 20 and 40 ms
    assert run.host_us_per_sequence_step == pytest.approx(250.0)
    assert run.step_time["steps"] == 9


def test_a_failed_run_is_told_by_the_hosts_line_else_the_guests() -> None:
    stderr = (
        "wasinn: WARNING: wasi-nn load_by_name_with_config: llama.cpp could not load model file 'm.gguf': "
        "invalid magic characters\nwasi-nn error: load_by_name_with_config returned 1\n"
    )
    assert failure(stderr, 1) == "wasi-nn load_by_name_with_config: llama.cpp could not load model file 'm.gguf': " + (
        "invalid magic characters"
    )
    assert failure("wasi-nn error: compute returned 101\n", 1) == "wasi-nn error: compute returned 101"
    assert failure("", 134) == "exit status 134"


@pytest.mark.parametrize(
    ("stdout", "stderr", "message"),
    [
        (_guest_line(0, 1, 2), STATUS, "2 guests (compute): 1 answered"),
        (
            _guest_line(0, 1, 2) + "\n" + _guest_line(0, 1, 2, tokens=3),
            STATUS,
            "2 guests (compute): answers of 3 tokens, not 4",
        ),
        (_guest_line(0, 1, 2) + "\n" + _guest_line(0, 1, 2), "", "2 guests (compute): no --status line"),
    ],
)
def test_a_run_that_cannot_be_measured_says_why(stdout: str, stderr: str, message: str) -> None:
    with pytest.raises(BenchError) as caught:
        parse_run(2, "compute", 4, stdout, stderr)
    assert str(caught.value) == message


def test_the_chart_has_a_point_per_figure_on_its_axes() -> None:
    report = {
        "host": [
            {"guests": 1, "way": "compute", "tokens_per_s": 700.0},
            {"guests": 8, "way": "compute", "tokens_per_s": 2100.5},
            {"guests": 1, "way": "stream", "tokens_per_s": 800.0},
            {"guests": 8, "way": "stream", "tokens_per_s": 1900.0},
        ],
        "llama_cpp": [
            {"guests": 1, "tokens_per_s": 1000.0, "sampled_tokens_per_s": 900.0},
            {"guests": 8, "tokens_per_s": 2500.0, "sampled_tokens_per_s": 2300.0},
        ],
    }
    root = ET.fromstring(svg_chart(report, "a <title> & more"))
    assert root.tag == f"{SVG}svg"
    assert root.find(f"{SVG}text").text == "a <title> & more"  # type: ignore[union-attr]
    groups = {g.get("data-series"): g for g in root.iter(f"{SVG}g")}
    assert list(groups) == ["compute", "stream", "llama.cpp", "llama.cpp+sampler"]
    circles = {name: list(g.iter(f"{SVG}circle")) for name, g in groups.items()}
    assert [(c.get("data-guests"), c.get("data-tokens-per-s")) for c in circles["compute"]] == [
        ("1", "700"),
        ("8", "2100.5"),
    ]
    assert [c.get("data-tokens-per-s") for c in circles["llama.cpp+sampler"]] == ["900", "2300"]
    # tokens/s grow upwards (SVG's y grows down) and guests to the right, inside the plot
    compute = [(float(c.get("cx", "0")), float(c.get("cy", "0"))) for c in circles["compute"]]
    assert compute[1][0] > compute[0][0] and compute[1][1] < compute[0][1]
    llama = [float(c.get("cy", "0")) for c in circles["llama.cpp"]]
    assert min(llama) >= 40 and all(y < compute[0][1] for y in llama[1:])
    assert circles["compute"][1].find(f"{SVG}title").text == "wasinn, compute: 8 guests, 2100.5 tokens/s"  # type: ignore[union-attr]


def test_the_title_names_the_model_tokens_threads_and_date() -> None:
    report = {"model": "/m/fast-step.gguf", "tokens": 128, "threads": 1, "date": "2026-11-27 14:54 UTC"}
    assert (
        chart_title(report)
        == "wasinn bench: fast-step.gguf, 128 tokens a guest, 1 llama.cpp thread, 2026-11-27 14:54 UTC"
    )


def test_one_guest_count_is_drawn_in_the_middle() -> None:
    report = {"host": [{"guests": 4, "way": "compute", "tokens_per_s": 10.0}], "llama_cpp": []}
    (circle,) = ET.fromstring(svg_chart(report, "t")).iter(f"{SVG}circle")
    assert float(circle.get("cx", "0")) == pytest.approx(70 + (720 - 70 - 190) / 2)
