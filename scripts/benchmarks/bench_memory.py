"""Benchmark: where a host's memory goes with many guests on one model, against weights + KV cache.

N guests (``guest_examples/complete.wasm``, greedy, ``ignore-eos``, ``n-predict`` T) run at one moment
through one :class:`wasinn_host.WasiNN` (each ``nn.run`` its own Store; the one loaded model's worker
batches their sequences), while a thread samples the process's resident memory (``VmRSS``) every 2 ms.
The peak, net of the RSS before the model was loaded (interpreter, wasmtime, llama.cpp's libraries, the
compiled guest), is split into

* **weights**: the model file's resident pages (``/proc/self/smaps`` of its mapping) plus the weights
  llama.cpp repacked for this CPU (``CPU_REPACK`` in its load log); ``llama_model_size`` is shown too;
* **model heap**: what malloc handed out while the model loaded (llama.cpp's vocabulary and metadata:
  about 50 MiB for Gemma 3's 262,144 tokens), from glibc's ``mallinfo2``;
* **KV cache**, **output buffer** (logits and embeddings rows), **compute buffers**: the sizes llama.cpp
  logs when it creates the inference context (``LlamaContext.buffers``), for the context the guests
  ended on (it grows with the guests computing at once); a compute buffer is reserved address space,
  resident only where a graph touched it, so the residual below can be negative;
* **Python heap / guests / other**: the rest (wasmtime Stores and guest memories, Python objects,
  samplers, allocator slack).

Target (issue 30): the net peak at most 15 % over weights (``llama_model_size``) + KV (llama.cpp's).

With ``--type-k``/``--type-v`` (e.g. ``q8_0``) it measures a quantized KV cache.  With
``--fit-gib G --ctx-size 4096`` it also prints how many guests of that context fit in G GiB (weights,
KV per guest, and the buffers as measured here), and ``--fit-run`` runs that many to measure their
peak memory and throughput (tokens/s for all guests together, from the common start to the last exit).

Usage: ``python scripts/benchmarks/bench_memory.py [--model smollm2|gemma3|M.gguf] [--guests 32]
[--tokens 64] [--prompt-tokens 32] [--ctx-size 768] [--threads 2] [--type-k f16] [--type-v f16]``.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import random
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from guests_together import run_together
from peak_rss import PeakRss, rss_bytes

from wasinn_host import Limits, ModelRegistry, WasiNN
from wasinn_host.core.config.kv_sizing import MAX_SEQUENCES
from wasinn_host.testing.real_models import model_file

ROOT = Path(__file__).resolve().parents[2]
GUEST = ROOT / "guest_examples" / "complete.wasm"
ALIAS = "bench"
TARGET = 0.15
MIB = 1 << 20


def mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    wanted = str(path.resolve())
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields[0]) > 8 and ":" not in fields[0]:
                inside = len(fields) >= 6 and fields[5] == wanted
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


class _MallInfo(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ]


def heap_in_use() -> int:
    """Bytes malloc has handed out from its arenas, not counting blocks it mmapped apart (glibc's
    ``mallinfo2``: ``uordblks``); 0 where that is not available."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo
        return int(libc.mallinfo2().uordblks)
    except (OSError, AttributeError):
        return 0


class LoadLog(logging.Handler):
    """llama.cpp's load log (``wasinn_host.llama`` logger): the repacked weights' buffer."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.repack = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "REPACK model buffer size" in text:
            self.repack += int(float(text.split("=")[1].split()[0]) * MIB)


@dataclass
class Run:
    guests: int
    wall_s: float
    peak: int
    tokens: int


def prompts(rng: random.Random, count: int, length: int) -> list[str]:
    return ["".join(rng.choice(string.ascii_letters) for _ in range(length)) for _ in range(count)]


def mib(n: float) -> str:
    return f"{n / MIB:8.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3", help="smollm2, gemma3 (real models, fetched once) or a GGUF path")
    parser.add_argument("--guests", type=int, default=32, help="guests computing at once (default 32)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per guest (default 64)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt letters per guest (default 32)")
    parser.add_argument("--ctx-size", type=int, default=768, help="ctx-size per guest (default 768)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--type-k", default="f16", help="KV cache type of K (default f16)")
    parser.add_argument("--type-v", default="f16", help="KV cache type of V (default f16)")
    parser.add_argument(
        "--logits-rows", type=int, default=None, help="decode-logits-rows (default: the host's; 0 = no cap)"
    )
    parser.add_argument("--fit-gib", type=float, default=0.0, help="print how many guests fit in this many GiB")
    parser.add_argument("--fit-run", action="store_true", help="then run that many guests at once and measure them")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    load_log = LoadLog()
    started_all = time.perf_counter()
    path = Path(args.model) if args.model.endswith(".gguf") else model_file(args.model)
    config = {
        "temp": 0,
        "ignore-eos": True,
        "n-predict": args.tokens,
        "ctx-size": args.ctx_size,
        "threads": args.threads,
        "batch-size": 512,
        "type-k": args.type_k,
        "type-v": args.type_v,
    }
    if args.logits_rows is not None:
        config["decode-logits-rows"] = args.logits_rows
    nn = WasiNN(preload=[f"{ALIAS}:GGML:AUTO:{path}"], registry=ModelRegistry())
    module = nn.load_module(GUEST)
    llama_logger = logging.getLogger("wasinn_host.llama")
    llama_logger.addHandler(load_log)
    llama_logger.setLevel(logging.DEBUG)
    llama_logger.propagate = False
    before_load, heap_before = rss_bytes(), heap_in_use()
    run_together(nn, module, ALIAS, prompts(rng, 1, args.prompt_tokens), dict(config, **{"n-predict": 2}))
    model_heap = heap_in_use() - heap_before
    llama_logger.setLevel(logging.WARNING)
    (loaded,) = nn.registry.loaded()
    with PeakRss() as peak:
        together = run_together(nn, module, ALIAS, prompts(rng, args.guests, args.prompt_tokens), config)
    run = Run(args.guests, together.wall_s, peak.peak, args.guests * args.tokens)
    context = loaded.worker.context
    buffers = dict(getattr(context, "buffers", {}))
    weights_size = loaded.weights.size_bytes
    weights_resident = mapped_rss(path) + load_log.repack
    kv = buffers.get("kv", context.kv_bytes)
    output = buffers.get("output", 0)
    compute = buffers.get("compute", 0)
    net = run.peak - before_load
    other = net - weights_resident - model_heap - kv - output - compute
    expected = weights_size + kv
    n_seq = context.n_seq
    description = loaded.weights.description
    nn.registry.close()

    print(
        f"model {path.name} ({description}); {args.guests} guests at once, {args.tokens} tokens each "
        f"(greedy), ctx-size {args.ctx_size}, KV {args.type_k}/{args.type_v}, {args.threads} threads; "
        f"the context ended with {n_seq} sequences"
    )
    print(f"  RSS before the model was loaded   {mib(before_load)}")
    print(f"  peak RSS while the guests ran     {mib(run.peak)}   net of the above: {mib(net).strip()}")
    print("  breakdown of the net peak:")
    print(
        f"    weights resident                {mib(weights_resident)}   (llama_model_size {mib(weights_size).strip()})"
    )
    print(f"    model heap (vocabulary ...)     {mib(model_heap)}   (malloc'd while it loaded and a first guest ran)")
    print(f"    KV cache (llama.cpp)            {mib(kv)}")
    print(f"    output buffer (llama.cpp)       {mib(output)}")
    print(f"    compute buffers (reserved)      {mib(compute)}")
    print(f"    Python heap, guests, other      {mib(other)}")
    over = net / expected - 1
    verdict = "meets" if over <= TARGET else "misses"
    print(
        f"  net peak vs weights + KV ({mib(expected).strip()}): {over * 100:+.1f} %  "
        f"(target <= +{TARGET * 100:.0f} %: {verdict})"
    )
    print(f"  throughput: {run.tokens / run.wall_s:.1f} tokens/s for all guests ({run.wall_s:.1f} s)")
    if args.fit_gib:
        per_guest = kv / max(n_seq, 1) + (output + compute + max(other, 0)) / args.guests
        fixed = before_load + weights_resident + model_heap
        fit = min(int((args.fit_gib * (1 << 30) - fixed) // per_guest), MAX_SEQUENCES)
        print(
            f"  fits in {args.fit_gib:g} GiB: {fit} guests of ctx-size {args.ctx_size} "
            f"({mib(per_guest).strip()} a guest: its KV, logits rows and share of the rest as measured here; "
            f"{mib(fixed).strip()} before the first guest)"
        )
        if args.fit_run:
            budget = Limits(max_kv_bytes=int(args.fit_gib * (1 << 30)), max_queue=max(fit, 64))
            nn = WasiNN(preload=[f"{ALIAS}:GGML:AUTO:{path}"], registry=ModelRegistry(), limits=budget)
            module = nn.load_module(GUEST)
            fixed_seqs = dict(config, **{"n-parallel": fit})  # the worker would otherwise grow by doubling
            run_together(nn, module, ALIAS, prompts(rng, 1, args.prompt_tokens), dict(fixed_seqs, **{"n-predict": 2}))
            with PeakRss() as peak:
                together = run_together(nn, module, ALIAS, prompts(rng, fit, args.prompt_tokens), fixed_seqs)
            sequences = max(m.worker.context.n_seq for m in nn.registry.loaded())
            nn.registry.close()
            print(
                f"  ran {fit} guests at once ({sequences} sequences): peak RSS {mib(peak.peak).strip()} "
                f"({'within' if peak.peak <= args.fit_gib * (1 << 30) else 'over'} {args.fit_gib:g} GiB), "
                f"{fit * args.tokens / together.wall_s:.1f} tokens/s for all guests ({together.wall_s:.1f} s)"
            )
    print(f"total time {time.perf_counter() - started_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
