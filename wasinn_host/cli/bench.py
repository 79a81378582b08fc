"""``wasinn bench``: N guests computing and streaming against llama.cpp alone, on the user's own model.

The measuring is :mod:`wasinn_host.bench`; this module parses the options, says what runs on one
progress line (stderr), and prints the table, the JSON (``--json``) or writes the chart (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from .options import fail

BENCH_EPILOG = """\
Without MODEL the fast-step model (wasinn model random --layers 2 --embd 256 --heads 4 --ff 512
--vocab 32000) is written once to $XDG_CACHE_HOME/wasinn/bench (default ~/.cache/wasinn/bench).

examples:
  wasinn bench                                   # the fast-step model, 1, 8, 32 and 64 guests
  wasinn bench model.gguf --guests 1,8 --runs 3
  wasinn bench --json > figures.json --plot tokens.svg
"""


def guest_counts(text: str) -> list[int]:
    """``--guests``: a comma-separated list of guest counts, 1 to 256, kept in order, without repeats."""
    from ..bench.runner import MAX_GUESTS

    counts: list[int] = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected numbers separated by commas, like 1,8,32, got {text!r}"
            ) from None
        if not 1 <= value <= MAX_GUESTS:
            raise argparse.ArgumentTypeError(f"guest counts are 1 to {MAX_GUESTS}, got {value}")
        if value not in counts:
            counts.append(value)
    return counts


def ways(text: str) -> list[str]:
    """``--ways``: compute, stream or both, comma-separated."""
    from ..bench.guests import WAYS

    chosen = [w for w in text.split(",") if w]
    if not chosen or any(w not in WAYS for w in chosen):
        raise argparse.ArgumentTypeError(f"ways are {' and '.join(WAYS)}, comma-separated, got {text!r}") from None
    return list(dict.fromkeys(chosen))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    return value


def add_bench_parser(commands: Any) -> None:
    """``wasinn bench`` and its options."""
    bench = commands.add_parser(
        "bench",
        help="measure tokens/s of N guests computing and streaming against llama.cpp alone on a model",
        description="Run N wasm guests at once (wasinn run --instances N, default settings, greedy), computing "
        "(a first token, then the answer) and streaming (compute_single), and llama.cpp alone decoding as many "
        "sequences in a process of its own, on the same model; print tokens/s, the ratio to llama.cpp, the time "
        "to first token and the worker's time per step (--status's step_time). Medians of --runs runs.",
        epilog=BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("model", nargs="?", metavar="MODEL.gguf", help="the GGUF model (default: the fast-step model)")
    bench.add_argument(
        "--guests",
        type=guest_counts,
        default=[1, 8, 32, 64],
        metavar="N,N,...",
        help="guests at once, comma-separated, each 1 to 256 (default: 1,8,32,64)",
    )
    bench.add_argument(
        "--ways",
        type=ways,
        default=["compute", "stream"],
        metavar="WAY,...",
        help="how the guests answer: compute, stream or compute,stream (default)",
    )
    bench.add_argument(
        "--tokens", type=_positive, default=128, metavar="N", help="tokens a guest generates (default 128)"
    )
    bench.add_argument(
        "--prompt-letters",
        type=_positive,
        default=32,
        metavar="N",
        help="each guest's prompt: N random letters, no two alike (default 32)",
    )
    bench.add_argument(
        "--threads",
        type=_positive,
        metavar="N",
        help="llama.cpp threads of the guests (the threads config key) and of llama.cpp alone (default: the "
        "host's, all cores); on a machine busy with other work, the cores that are idle",
    )
    bench.add_argument("--runs", type=_positive, default=5, metavar="N", help="runs of each case; medians (default 5)")
    bench.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    bench.add_argument("--plot", metavar="FILE.svg", help="also write a chart of tokens/s against guests (SVG)")


class Progress:
    """One progress line on stderr: rewritten in place on a terminal, a line per stage otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()

    def __call__(self, text: str) -> None:
        """Show ``text`` as what runs now."""
        line = f"wasinn bench: {text}"
        self._stream.write(f"\r\x1b[K{line}" if self._tty else line + "\n")
        self._stream.flush()

    def done(self) -> None:
        """End the line (on a terminal, clear it)."""
        if self._tty:
            self._stream.write("\r\x1b[K")
            self._stream.flush()


def _not_gguf(path: str) -> str | None:
    """Why ``path`` is no GGUF model (read from its first bytes), or None: told at once, not after the
    guests have started."""
    try:
        with open(path, "rb") as file:
            magic = file.read(4)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return None if magic == b"GGUF" else "not a GGUF model file (it does not start with 'GGUF')"


def bench_command(ns: argparse.Namespace) -> int:
    """``wasinn bench``: 0 with the report printed, 2 with one error line."""
    from ..bench.guests import BenchError
    from ..bench.plot import chart_title, svg_chart
    from ..bench.report import table, to_json
    from ..bench.runner import default_model, run_bench
    from ..testing.model_catalog import ModelToolsMissing

    if ns.model is not None and not os.path.isfile(ns.model):
        return fail(f"no such model file: {ns.model}")
    if ns.model is not None and (problem := _not_gguf(ns.model)):
        return fail(f"{ns.model}: {problem}")
    if ns.plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(ns.plot))):
        return fail(f"--plot {ns.plot}: no such directory")
    progress = Progress(sys.stderr)
    try:
        model = Path(ns.model) if ns.model is not None else default_model()
        results = run_bench(
            model, ns.guests, ns.ways, ns.tokens, ns.prompt_letters, ns.runs, progress, threads=ns.threads
        )
    except (BenchError, ModelToolsMissing, RuntimeError) as exc:
        progress.done()
        return fail(str(exc))
    except OSError as exc:
        progress.done()
        return fail(f"{exc.filename or 'bench'}: {exc.strerror or exc}")
    progress.done()
    report = to_json(results)
    if ns.plot is not None:
        try:
            Path(ns.plot).write_text(svg_chart(report, chart_title(report)), encoding="utf-8")
        except OSError as exc:
            return fail(f"--plot {ns.plot}: {exc.strerror or exc}")
    print(json.dumps(report, indent=2) if ns.json else table(results))
    return 0
