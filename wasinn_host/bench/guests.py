"""N wasm guests answering at once, started as a user starts them: ``wasinn run --instances N --status``.

Each run is a ``wasinn run`` process of its own, so its ``--status`` (printed on stderr when the guests
have ended) covers that run alone: the worker's step clock (``step_time``) and the sequences a step
decoded (``sequences_per_decode``).  The guest is ``bench.wasm`` (source: ``guest_examples/bench.c``),
shipped in this package: ``compute`` answers a first token (``n-predict`` 1) then the whole answer,
``stream`` takes it a token at a time (``compute_single``); each instance makes up its own prompt of
random letters, and prints, on one JSON line, when it started, when its first token came back and
when its last did (the wall clock, in ns).  Tokens/s = guests x tokens / (the last end - the first
start): instantiating the guests and loading the model come before the first start, so the figure is
the serving, not the process's start.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GUEST = Path(__file__).with_name("bench.wasm")
ALIAS = "bench"
GUEST_CONFIG = {"temp": 0, "ignore-eos": True}
"""The guests' load config: greedy, and exactly the tokens asked for (everything else the defaults, and
``threads`` only when ``wasinn bench --threads`` sets it)."""
WAYS = ("compute", "stream")


class BenchError(RuntimeError):
    """A run that could not be measured (a guest failed, a process died); its message is one line."""


@dataclass(frozen=True)
class GuestRun:
    """One run of N guests: throughput, time to first token, and the worker's step clock."""

    guests: int
    way: str
    tokens_per_s: float
    ttft_ms: float
    """The median over the guests of the time from a guest's start to its first token."""
    step_time: dict[str, float]
    """``--status``'s ``step_time`` of the run (``admit_ms_per_step`` ... ``llama_ms_per_step``, ``steps``)."""
    sequences_per_decode: float
    params: dict[str, Any]
    """The loaded model's parameters as ``--status`` shows them (threads, context size, GPU layers)."""

    @property
    def host_us_per_sequence_step(self) -> float:
        """The host's own time (admit + plan + sample) per sequence per step, in microseconds."""
        per_step = self.step_time.get("host_ms_per_step", 0.0)
        return per_step * 1000.0 / self.sequences_per_decode if self.sequences_per_decode else 0.0


def case(guests: int, way: str) -> str:
    """How a case is named in messages: ``1 guest (compute)``, ``8 guests (stream)``."""
    return f"{guests} guest{'s' if guests != 1 else ''} ({way})"


def command(model: Path, guests: int, way: str, tokens: int, letters: int, threads: int | None = None) -> list[str]:
    """The ``wasinn run`` command line of one run (``threads``: llama.cpp's threads; None: the host's default)."""
    config = dict(GUEST_CONFIG, threads=threads) if threads else GUEST_CONFIG
    return [
        sys.executable,
        "-m",
        "wasinn_host",
        "run",
        "--status",
        "--instances",
        str(guests),
        "--nn-preload",
        f"{ALIAS}:GGML:AUTO:{model}",
        "--env",
        f"WASINN_CONFIG={json.dumps(config, separators=(',', ':'))}",
        str(GUEST),
        ALIAS,
        way,
        str(tokens),
        str(letters),
    ]


def run_guests(
    model: Path, guests: int, way: str, tokens: int, letters: int, timeout: float, threads: int | None = None
) -> GuestRun:
    """Run ``guests`` instances of the guest answering ``way`` and measure them."""
    try:
        proc = subprocess.run(
            command(model, guests, way, tokens, letters, threads), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{case(guests, way)} ran past {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise BenchError(f"{case(guests, way)}: wasinn run failed: {failure(proc.stderr, proc.returncode)}")
    return parse_run(guests, way, tokens, proc.stdout, proc.stderr)


def failure(stderr: str, code: int) -> str:
    """Why a ``wasinn run`` failed, in one line: the host's last message (its log or its error line,
    which name the cause), else the guest's last line, else the exit status."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("{")]
    host = [line.split(": ", 2)[-1] for line in lines if line.startswith("wasinn: ")]
    return host[-1] if host else lines[-1] if lines else f"exit status {code}"


def parse_run(guests: int, way: str, tokens: int, stdout: str, stderr: str) -> GuestRun:
    """A :class:`GuestRun` from the guests' lines (stdout) and ``--status`` (the last JSON line of stderr)."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if len(lines) != guests:
        raise BenchError(f"{case(guests, way)}: {len(lines)} answered")
    short = [line["output_tokens"] for line in lines if line["output_tokens"] != tokens]
    if short:
        raise BenchError(f"{case(guests, way)}: answers of {short[0]} tokens, not {tokens}")
    statuses = [line for line in stderr.splitlines() if line.startswith("{")]
    if not statuses:
        raise BenchError(f"{case(guests, way)}: no --status line")
    (model,) = json.loads(statuses[-1])["models"]
    start = min(line["start_ns"] for line in lines)
    end = max(line["end_ns"] for line in lines)
    return GuestRun(
        guests=guests,
        way=way,
        tokens_per_s=guests * tokens / max((end - start) / 1e9, 1e-9),
        ttft_ms=statistics.median((line["first_ns"] - line["start_ns"]) / 1e6 for line in lines),
        step_time=model["step_time"],
        sequences_per_decode=model["sequences_per_decode"],
        params=model["params"],
    )
