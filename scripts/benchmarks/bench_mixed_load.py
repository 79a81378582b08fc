"""Benchmark: streaming guests beside a long prompt (chunked prefill), and many guests at once (fairness).

Every guest is ``guest_examples/chat.wasm`` (one stdin line, the answer streamed with ``compute_single``,
each piece written and flushed to stdout at once) run through one :class:`wasinn_host.WasiNN` from its own
thread; a reader thread per guest timestamps what arrives on the pipe of its stdout.  The model is the
random-weight F16 llama of ``bench_host``/``bench_concurrency`` (12 layers, 171 MB, built in a temp dir;
its context length raised to 4096), greedy, ``ignore-eos``, the byte-fallback and control tokens banned by
``logit-bias`` so that every token is a visible piece; ``ctx-size`` 2560, ``batch-size`` 512, ``flash-attn``
as ``--flash-attn`` says (default auto).  A new registry per run; before each measured run the fresh model
serves ``--streams`` + 1 short guests at once (24 tokens), so it has grown to its sequences and fitted its
decode cost as a running server would have.

**Mixed load** (default): ``--streams`` (7) guests stream ``--stream-tokens`` (160) tokens after a
32-letter line; once each has ``--start-after`` (16) tokens, one more guest sends a ``--long-tokens``
(2,300)-letter line and asks for one token, with the load-time key ``prefill-step-budget`` at
``--budget``.  Each run has three arms, each on a fresh host: ``mixed`` (that load), ``prompt`` (the
long prompt alone) and ``streams`` (the streams alone); with ``--unchunked`` a fourth, ``unchunked``,
the mixed load with the budget at 0 (prompts take whole batches).  Per arm:

* the streams' gaps between tokens (every piece after each stream's first): p50, p99, max, p99/p50;
* the long prompt's time to first token (from its guest's start to its first piece);
* llama.cpp's time (the worker's ``step_time``: launch + device), its decodes, the steps whose prompt
  tokens the budget cut and the steps split into two decodes (``split_steps``).

And the three targets, each a median over the runs with its spread: llama.cpp's time under mixed load
against the same tokens decoded apart (the prompt's arm plus the streams' arm), <= 1.3; the long
prompt's first token beside the streams against alone, <= 3; the streams' p99 gap against their
median, <= 8.  ``--runs N`` alternates the arms.

**Fairness** (``--fairness``): ``--guests`` (64) guests start at one moment (threads and a barrier) with
``--max-queue`` (16) and ``n-parallel`` ``--n-parallel`` (16): the queue fills, so some guests are
refused.  Printed: how many were refused at their first step (``compute_single`` answered Busy, errno
4) and how soon (max time from start to the refusal), how many were refused later in their stream, and
for the admitted ones tokens per second (from start to last token, and from first to last token):
median, min, max and max/median.

Usage: ``python scripts/benchmarks/bench_mixed_load.py [--runs 1] [--unchunked] [--threads 2] [--budget 7]
[--flash-attn auto] [--streams 7] [--stream-tokens 160] [--long-tokens 2300]
[--fairness [--guests 64] [--max-queue 16]]``.
Take figures on an idle machine: a process sharing the cores makes every gap longer and far noisier.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import wasmtime

from wasinn_host import Limits, ModelRegistry, RunOptions, WasiNN
from wasinn_host.backend.successor import CHAR_TOKEN_OFFSET
from wasinn_host.core.scheduling.prefill_budget import DEFAULT_STEP_BUDGET
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.core.scheduling.step_clock import LLAMA_PHASES
from wasinn_host.testing.gguf_models import write_random_model

ROOT = Path(__file__).resolve().parents[2]
GUEST = ROOT / "guest_examples" / "chat.wasm"
ALIAS = "bench"
CTX_SIZE = 2560
N_BATCH = 512
TARGET_LLAMA_RATIO = 1.3
"""llama.cpp's time under mixed load against the same tokens decoded apart."""
TARGET_TTFT_RATIO = 3.0
"""The long prompt's first token beside the streams against alone."""
TARGET_GAP_RATIO = 8.0
"""The streams' p99 gap against their median."""
TARGET_UNCHUNKED_RATIO = 1.5
BANNED = [[token, False] for token in range(CHAR_TOKEN_OFFSET)]
"""Control and byte-fallback tokens: a byte token may be half a UTF-8 character, an empty piece."""
ENGINE = wasmtime.Engine()
"""Every host of the benchmark shares it, so the guest is compiled once."""


def letters(rng: random.Random, n: int) -> str:
    """``n`` random letters (one token each in this vocabulary)."""
    return "".join(rng.choice(string.ascii_letters) for _ in range(n))


@dataclass
class Guest:
    """One chat.wasm guest: its line, its tokens, and what came out."""

    line: str
    n_predict: int
    started: float = 0.0
    pieces: list[float] = field(default_factory=list)
    """When each read of its stdout returned (one flushed piece per token unless the reader lagged)."""
    code: int | None = None
    stderr: str = ""
    ended: float = 0.0

    @property
    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000.0 for a, b in zip(self.pieces, self.pieces[1:])]


def config(threads: int, budget: float, n_parallel: int = 0, flash_attn: str = "auto") -> dict[str, object]:
    made: dict[str, object] = {
        "flash-attn": flash_attn,
        "temp": 0,
        "ignore-eos": True,
        "ctx-size": CTX_SIZE,
        "batch-size": N_BATCH,
        "threads": threads,
        "logit-bias": BANNED,
        "prefill-step-budget": budget,
    }
    if n_parallel:
        made["n-parallel"] = n_parallel
    return made


def run_guest(nn: WasiNN, module: wasmtime.Module, guest: Guest, conf: dict[str, object], workdir: Path) -> None:
    """Run one guest to its end, timestamping what it writes to stdout."""
    index = id(guest)
    stdin = workdir / f"in{index}.txt"
    stdin.write_text(guest.line + "\n")
    err = workdir / f"err{index}.txt"
    read_fd, write_fd = os.pipe()

    def read() -> None:
        while chunk := os.read(read_fd, 1 << 16):
            if chunk.strip():
                guest.pieces.append(time.perf_counter())
        os.close(read_fd)

    reader = threading.Thread(target=read)
    reader.start()
    env = {"WASINN_CONFIG": json.dumps(conf), "n_predict": str(guest.n_predict)}
    options = RunOptions(
        env=env, stdin=str(stdin), stdout=f"/dev/fd/{write_fd}", stderr=str(err), close_fds=(write_fd,)
    )
    guest.started = time.perf_counter()
    try:
        guest.code = nn.run(module, [ALIAS], options)
    finally:
        guest.ended = time.perf_counter()
        reader.join()
    guest.stderr = err.read_text()


def run_all(nn: WasiNN, module: wasmtime.Module, guests: list[Guest], conf: dict[str, object]) -> None:
    """Start every guest at one moment (threads and a barrier) and wait for all."""
    barrier = threading.Barrier(len(guests))
    with tempfile.TemporaryDirectory() as tmp:

        def go(guest: Guest) -> None:
            barrier.wait()
            run_guest(nn, module, guest, conf, Path(tmp))

        threads = [threading.Thread(target=go, args=(g,)) for g in guests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def fresh_host(model: Path, module: wasmtime.Module, conf: dict[str, object], guests: int, limits: Limits) -> WasiNN:
    """A new registry with the model, warmed by ``guests`` short guests at once."""
    nn = WasiNN(registry=ModelRegistry([f"{ALIAS}:GGML:AUTO:{model}"]), limits=limits, engine=ENGINE)
    rng = random.Random(7)
    warm = [Guest(letters(rng, 32), 24) for _ in range(guests)]
    run_all(nn, module, warm, conf)
    if any(g.code != 0 for g in warm):
        raise SystemExit(f"warm-up guest failed: {[g.stderr for g in warm if g.code != 0]}")
    return nn


def worker_of(nn: WasiNN) -> ModelWorker:
    return nn.registry.loaded()[0].worker


# -- mixed load ------------------------------------------------------------------------------------


@dataclass
class Mixed:
    """One run of one arm: the streams' gaps, the long prompt's first token, llama.cpp's time."""

    p50: float
    p99: float
    max: float
    ttft_s: float
    decodes: int
    capped: int
    split: int
    llama_s: float
    """Seconds the worker spent in llama.cpp (``step_time``'s launch + device) over the run."""

    @property
    def ratio(self) -> float:
        return self.p99 / self.p50 if self.p50 else 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def llama_seconds(worker: ModelWorker) -> float:
    return sum(worker.clock.seconds[phase] for phase in LLAMA_PHASES)


def mixed_run(
    model: Path, module: wasmtime.Module, args: argparse.Namespace, budget: float, seed: int, arm: str
) -> Mixed:
    """One run: ``arm`` "mixed" (the streams and the long prompt), "prompt" (the long prompt alone) or
    "streams" (the streams alone)."""
    conf = config(args.threads, budget, flash_attn=args.flash_attn)
    nn = fresh_host(model, module, conf, args.streams + 1, Limits())
    rng = random.Random(seed)
    streams = [Guest(letters(rng, 32), args.stream_tokens) for _ in range(args.streams)]
    long = Guest(letters(rng, args.long_tokens), 1)
    worker = worker_of(nn)
    calls, capped, llama = worker.decode_calls, worker.capped_prompt_steps, llama_seconds(worker)
    split = getattr(worker, "split_steps", 0)
    if arm == "prompt":
        streams = []

    def send_long() -> None:
        # until every stream has its first tokens (or has ended: a failed one is reported below)
        while any(len(s.pieces) < args.start_after and not s.ended for s in streams):
            time.sleep(0.001)
        with tempfile.TemporaryDirectory() as tmp:
            run_guest(nn, module, long, conf, Path(tmp))

    sender = threading.Thread(target=send_long) if arm != "streams" else None
    if sender is not None:
        sender.start()
    if streams:
        run_all(nn, module, streams, conf)
    if sender is not None:
        sender.join()
    nn.registry.close()
    guests = [*streams, long] if sender is not None else streams
    failed = [g.stderr for g in guests if g.code != 0 or "error" in g.stderr]
    if failed or (sender is not None and not long.pieces):
        raise SystemExit(f"guest failed: {failed}")
    gaps = [gap for s in streams for gap in s.gaps_ms] or [0.0]
    return Mixed(
        statistics.median(gaps),
        percentile(gaps, 0.99),
        max(gaps),
        long.pieces[0] - long.started if long.pieces else 0.0,
        worker.decode_calls - calls,
        worker.capped_prompt_steps - capped,
        getattr(worker, "split_steps", 0) - split,
        llama_seconds(worker) - llama,
    )


def show(label: str, run: Mixed) -> None:
    print(
        f"  {label:<10} gaps p50 {run.p50:6.1f} ms  p99 {run.p99:7.1f} ms  max {run.max:7.1f} ms  "
        f"p99/p50 {run.ratio:5.2f}  long TTFT {run.ttft_s:6.2f} s  llama.cpp {run.llama_s:6.2f} s  "
        f"decodes {run.decodes:4d}  capped {run.capped}  split {run.split}",
        flush=True,
    )


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def verdict(label: str, values: list[float], target: float) -> None:
    met = "meets" if statistics.median(values) <= target else "misses"
    print(f"  {label} {spread(values)}: {met} <= {target:g}")


def mixed(model: Path, module: wasmtime.Module, args: argparse.Namespace) -> None:
    arms = ["mixed", "prompt", "streams"] + (["unchunked"] if args.unchunked else [])
    print(
        f"{args.streams} streams x {args.stream_tokens} tokens + one {args.long_tokens}-token prompt after "
        f"{args.start_after} tokens, prefill-step-budget {args.budget:g}, flash-attn {args.flash_attn}; "
        f"the same prompt alone and the same streams alone" + ("; and unchunked (budget 0)" if args.unchunked else ""),
        flush=True,
    )
    runs: dict[str, list[Mixed]] = {arm: [] for arm in arms}
    for index in range(args.runs):
        print(f"run {index + 1}/{args.runs}", flush=True)
        for arm in arms:
            budget = 0.0 if arm == "unchunked" else args.budget
            runs[arm].append(mixed_run(model, module, args, budget, index, "mixed" if arm == "unchunked" else arm))
            show(arm, runs[arm][-1])
    print(f"\nmedian (min-max) over {args.runs} run(s):")
    for arm in arms:
        rs = runs[arm]
        print(
            f"  {arm:<10} p50 {spread([r.p50 for r in rs], ' ms')}  p99 {spread([r.p99 for r in rs], ' ms')}  "
            f"p99/p50 {spread([r.ratio for r in rs])}  TTFT {spread([r.ttft_s for r in rs], ' s')}  "
            f"llama.cpp {spread([r.llama_s for r in rs], ' s')}"
        )
    mix, prompt, alone = runs["mixed"], runs["prompt"], runs["streams"]
    verdict(
        "llama.cpp time, mixed / (prompt alone + streams alone)",
        [m.llama_s / (p.llama_s + s.llama_s) for m, p, s in zip(mix, prompt, alone)],
        TARGET_LLAMA_RATIO,
    )
    verdict(
        "long prompt's TTFT, with the streams / alone",
        [m.ttft_s / p.ttft_s for m, p in zip(mix, prompt)],
        TARGET_TTFT_RATIO,
    )
    verdict("streams' gaps p99 / p50", [m.ratio for m in mix], TARGET_GAP_RATIO)
    if args.unchunked:
        verdict(
            "long prompt's TTFT, chunked / unchunked",
            [m.ttft_s / u.ttft_s for m, u in zip(mix, runs["unchunked"])],
            TARGET_UNCHUNKED_RATIO,
        )


# -- fairness --------------------------------------------------------------------------------------


def fairness(model: Path, module: wasmtime.Module, args: argparse.Namespace) -> None:
    conf = config(args.threads, args.budget, args.n_parallel, args.flash_attn)
    limits = Limits(max_queue=args.max_queue)
    nn = fresh_host(model, module, conf, min(args.n_parallel, args.guests), limits)
    rng = random.Random(11)
    guests = [Guest(letters(rng, 16), args.fair_tokens) for _ in range(args.guests)]
    run_all(nn, module, guests, conf)
    nn.registry.close()
    busy = "returned 4"
    at_once = [g for g in guests if busy in g.stderr and not g.pieces]
    later = [g for g in guests if busy in g.stderr and g.pieces]
    other = [g for g in guests if g not in at_once and g not in later and (g.code != 0 or "error" in g.stderr)]
    admitted = [g for g in guests if g not in at_once and g not in other]
    print(
        f"{args.guests} guests at once, n-parallel {args.n_parallel}, max-queue {args.max_queue}, "
        f"{args.fair_tokens} tokens each"
    )
    refused_ms = max(((g.ended - g.started) * 1000.0 for g in at_once), default=0.0)
    print(
        f"  refused at the first step (Busy): {len(at_once)}, each within {refused_ms:.0f} ms of its start; "
        f"refused later in their stream: {len(later)}"
    )
    if other:
        print(f"  failed otherwise: {len(other)}: {other[0].stderr.strip()[:200]}")
    whole = [len(g.pieces) / (g.pieces[-1] - g.started) for g in admitted if g.pieces]
    decoding = [(len(g.pieces) - 1) / (g.pieces[-1] - g.pieces[0]) for g in admitted if len(g.pieces) > 1]
    for label, rates in (("from start", whole), ("from 1st token", decoding)):
        if rates:
            median = statistics.median(rates)
            print(
                f"  admitted {len(rates)}: tokens/s {label}: median {median:.1f}, min {min(rates):.1f}, "
                f"max {max(rates):.1f}, max/median {max(rates) / median:.2f}, min/median {min(rates) / median:.2f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of every arm, alternating (default 1)")
    parser.add_argument("--unchunked", action="store_true", help="also run the mixed load with the budget off")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="the flash-attn key of every arm (default auto, the key's: on for a CPU)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_STEP_BUDGET,
        help=f"prefill-step-budget of the chunked runs (default {DEFAULT_STEP_BUDGET:g}, the key's)",
    )
    parser.add_argument("--streams", type=int, default=7, help="streaming guests (default 7)")
    parser.add_argument("--stream-tokens", type=int, default=160, help="tokens each stream generates (default 160)")
    parser.add_argument("--long-tokens", type=int, default=2300, help="letters of the long prompt (default 2300)")
    parser.add_argument(
        "--start-after", type=int, default=16, help="stream tokens before the long prompt starts (default 16)"
    )
    parser.add_argument("--fairness", action="store_true", help="measure fairness under overload instead")
    parser.add_argument("--guests", type=int, default=64, help="fairness: guests at once (default 64)")
    parser.add_argument("--max-queue", type=int, default=16, help="fairness: max-queue (default 16)")
    parser.add_argument("--n-parallel", type=int, default=16, help="fairness: n-parallel (default 16)")
    parser.add_argument("--fair-tokens", type=int, default=48, help="fairness: tokens per guest (default 48)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_random_model(Path(tmp) / "random.gguf", context_length=4096)
        module = wasmtime.Module.from_file(ENGINE, str(GUEST))
        if args.fairness:
            fairness(model, module, args)
        else:
            mixed(model, module, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
