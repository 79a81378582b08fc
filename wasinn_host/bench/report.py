"""``wasinn bench``'s results: the runs gathered, their medians and spread, as a table or as JSON.

Each figure is the median of the runs, its spread the lowest and highest run; a ratio to llama.cpp is
the median of each run's ratio to the reference run beside it (the two alternate, so drift on a
shared machine touches both alike).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from .guests import GuestRun
from .reference import ReferenceRun

STEP_PHASES = (
    ("admit", "admit"),
    ("plan", "plan"),
    ("sample", "sample"),
    ("host", "host"),
    ("guests", "guests"),
    ("llama_cpp", "llama"),
)
"""The step clock's columns: (name in the report, prefix of ``--status``'s ``step_time`` key)."""


@dataclass
class Results:
    """Every run of one ``wasinn bench``."""

    model: str
    model_bytes: int
    tokens: int
    prompt_letters: int
    threads: int
    guests: list[int]
    ways: list[str]
    machine: dict[str, Any]
    date: str
    threads_given: bool = False
    """Whether ``--threads`` chose the threads (else they are the host's default)."""
    host: dict[tuple[int, str], list[GuestRun]] = field(default_factory=dict)
    reference: dict[int, list[ReferenceRun]] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        """The runs done of every case (the fewest, if a run was cut short)."""
        counts = [len(r) for r in self.host.values()] + [len(r) for r in self.reference.values()]
        return min(counts) if counts else 0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def host_row(results: Results, guests: int, way: str) -> dict[str, Any]:
    """The medians of ``guests`` guests answering ``way``, JSON-ready."""
    runs = results.host.get((guests, way), [])
    refs = results.reference.get(guests, [])
    rates = [r.tokens_per_s for r in runs]
    step = {
        name: round(_median([r.step_time.get(f"{prefix}_ms_per_step", 0.0) for r in runs]), 4)
        for name, prefix in STEP_PHASES
    }
    return {
        "guests": guests,
        "way": way,
        "tokens_per_s": round(_median(rates), 2),
        "tokens_per_s_runs": [round(x, 2) for x in rates],
        "ratio_to_llama_cpp": round(_median([r.tokens_per_s / f.decode_tokens_per_s for r, f in zip(runs, refs)]), 4),
        "ratio_to_llama_cpp_sampled": round(
            _median([r.tokens_per_s / f.sampled_tokens_per_s for r, f in zip(runs, refs)]), 4
        ),
        "ttft_ms": round(_median([r.ttft_ms for r in runs]), 3),
        "step_ms": step,
        "host_us_per_sequence_step": round(_median([r.host_us_per_sequence_step for r in runs]), 2),
        "steps": int(_median([r.step_time.get("steps", 0) for r in runs])),
        "sequences_per_decode": round(_median([r.sequences_per_decode for r in runs]), 3),
    }


def reference_row(results: Results, guests: int) -> dict[str, Any]:
    """The medians of llama.cpp alone on ``guests`` sequences, JSON-ready."""
    refs = results.reference.get(guests, [])
    decode = [r.decode_tokens_per_s for r in refs]
    sampled = [r.sampled_tokens_per_s for r in refs]
    return {
        "guests": guests,
        "tokens_per_s": round(_median(decode), 2),
        "tokens_per_s_runs": [round(x, 2) for x in decode],
        "sampled_tokens_per_s": round(_median(sampled), 2),
        "sampled_tokens_per_s_runs": [round(x, 2) for x in sampled],
        "ttft_ms": round(_median([r.ttft_ms for r in refs]), 3),
    }


def to_json(results: Results) -> dict[str, Any]:
    """Everything measured, for machines (``wasinn bench --json``)."""
    return {
        "date": results.date,
        "machine": results.machine,
        "model": results.model,
        "model_bytes": results.model_bytes,
        "tokens": results.tokens,
        "prompt_letters": results.prompt_letters,
        "threads": results.threads,
        "threads_given": results.threads_given,
        "runs": results.runs,
        "guests": results.guests,
        "ways": results.ways,
        "host": [host_row(results, n, way) for n in results.guests for way in results.ways],
        "llama_cpp": [reference_row(results, n) for n in results.guests],
    }


def _spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if values else "-"


COLUMNS = (
    ("guests", 6),
    ("way", -17),
    ("tok/s", 9),
    ("spread", 13),
    ("vs llama.cpp", 13),
    ("vs +sampler", 12),
    ("TTFT ms", 9),
    ("admit", 7),
    ("plan", 7),
    ("sample", 7),
    ("host", 7),
    ("guests", 7),
    ("llama", 7),
    ("host us/seq", 12),
)
"""The table's columns: (heading, width; negative: left-aligned)."""


def _line(cells: list[str]) -> str:
    """One line of the table: each cell in its column, missing cells empty."""
    cells = cells + [""] * (len(COLUMNS) - len(cells))
    return "  ".join(c.ljust(-w) if w < 0 else c.rjust(w) for c, (_, w) in zip(cells, COLUMNS)).rstrip()


def table(results: Results) -> str:
    """The human-readable report (``wasinn bench`` without ``--json``)."""
    size = f"{results.model_bytes / 1e6:.1f} MB"
    lines = [
        f"model {os.path.basename(results.model)} ({size}); {results.tokens} tokens a guest after a "
        f"{results.prompt_letters}-letter prompt, greedy, default settings"
        f"{' but --threads' if results.threads_given else ''}; llama.cpp threads {results.threads}; "
        f"medians of {results.runs} run{'s' if results.runs != 1 else ''} (spread: lowest-highest)",
        _line([name for name, _ in COLUMNS]),
    ]
    for n in results.guests:
        for way in results.ways:
            row = host_row(results, n, way)
            s = row["step_ms"]
            lines.append(
                _line(
                    [
                        str(n),
                        way,
                        f"{row['tokens_per_s']:.1f}",
                        _spread(row["tokens_per_s_runs"]),
                        f"{row['ratio_to_llama_cpp']:.3f}",
                        f"{row['ratio_to_llama_cpp_sampled']:.3f}",
                        f"{row['ttft_ms']:.1f}",
                        *(f"{s[name]:.2f}" for name, _ in STEP_PHASES),
                        f"{row['host_us_per_sequence_step']:.1f}",
                    ]
                )
            )
        ref = reference_row(results, n)
        lines.append(_line([str(n), "llama.cpp", f"{ref['tokens_per_s']:.1f}", _spread(ref["tokens_per_s_runs"])]))
        lines.append(
            _line(
                [
                    str(n),
                    "llama.cpp+sampler",
                    f"{ref['sampled_tokens_per_s']:.1f}",
                    _spread(ref["sampled_tokens_per_s_runs"]),
                    "",
                    "",
                    f"{ref['ttft_ms']:.1f}",
                ]
            )
        )
    lines += [
        "vs llama.cpp: the host's tok/s over llama.cpp decoding as many sequences alone in a process of its own, "
        "no sampling; vs +sampler: over llama.cpp with a greedy sampler per sequence",
        "admit, plan, sample, host (their sum), guests (the wait for streaming guests between decodes), llama: ms "
        "per step (--status's step_time); host us/seq: the host's own time per sequence per step",
    ]
    return "\n".join(lines)
