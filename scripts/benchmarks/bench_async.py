"""Benchmark: C concurrent streams through asyncio sessions against the same load on threads.

One process, one model, one :class:`wasinn_host.WasiNN`.  ``async``: C tasks on one event loop, each
``async with nn.session_async(...)`` and ``async for piece in s.stream(prompt)`` (no thread waits for the
model).  ``threads``: C threads, each ``with nn.session(...)`` and ``for piece in s.stream(prompt)`` (the
blocking API, a thread per request, as an asyncio service calls it through ``asyncio.to_thread``).
Every stream makes ``--tokens`` tokens (``n-predict``, end of generation ignored).  Printed per arm:
aggregate tokens/s (the tokens the streams gave over the wall time from the common start to the last
stream's end), the median time to first piece and the process's CPU time per token (all threads:
steadier than the rate on a busy machine); medians of ``--runs`` alternated runs, with the spread.
One untimed run at the largest count of streams first: the model's context grows to that many sequences
once, outside the figures.

Usage: ``python scripts/benchmarks/bench_async.py --model M.gguf [--streams 1,8,64] [--tokens 64] [--runs 5]``
(each count of streams in turn, its arms alternated run by run).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from wasinn_host import WasiNN


def prompts(n: int) -> list[str]:
    return [f"request {i}: once upon a time" for i in range(n)]


def run_async(nn: WasiNN, config: dict[str, object], n: int) -> tuple[float, list[float]]:
    """The async arm: (wall seconds, times to first piece)."""

    async def one(prompt: str, start: float) -> float:
        first = 0.0
        async with nn.session_async("default", config) as session:
            async for _ in session.stream(prompt):
                if not first:
                    first = time.perf_counter() - start
        return first

    async def main() -> tuple[float, list[float]]:
        start = time.perf_counter()
        firsts = await asyncio.gather(*(one(p, start) for p in prompts(n)))
        return time.perf_counter() - start, list(firsts)

    return asyncio.run(main())


def run_threads(nn: WasiNN, config: dict[str, object], n: int) -> tuple[float, list[float]]:
    """The blocking arm: (wall seconds, times to first piece)."""
    firsts: list[float] = []
    lock = threading.Lock()
    go = threading.Event()
    start = 0.0

    def one(prompt: str) -> None:
        go.wait()
        first = 0.0
        with nn.session("default", config) as session:
            for _ in session.stream(prompt):
                if not first:
                    first = time.perf_counter() - start
        with lock:
            firsts.append(first)

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts(n)]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, firsts


def main() -> None:
    """Alternate the arms and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", default="16", help="concurrent streams: a count, or counts separated by commas")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    nn = WasiNN(preload=[f"default:GGML:AUTO:{args.model}"])
    config: dict[str, object] = {"n-predict": args.tokens, "ignore-eos": True}
    with nn.session("default", config) as warm:
        warm.complete("warm up")
    counts = [int(n) for n in args.streams.split(",")]
    run_threads(nn, config, max(counts))  # untimed: the model's context grows to the most streams once
    for streams in counts:
        compare(nn, config, streams, args)
    nn.close()


def compare(nn: WasiNN, config: dict[str, object], streams: int, args: argparse.Namespace) -> None:
    """The two arms at ``streams`` concurrent streams, alternated; their medians and spread."""
    arms = {"async": run_async, "threads": run_threads}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in arms}
    for run in range(args.runs):
        for name in list(arms) if run % 2 == 0 else list(reversed(arms)):
            cpu = time.process_time()
            wall, firsts = arms[name](nn, config, streams)
            made = streams * args.tokens  # the tokens the streams gave (their jobs may have sampled a few more)
            rate, cpu_us = made / wall, (time.process_time() - cpu) / made * 1e6
            first = statistics.median(firsts)
            results[name].append((rate, first, cpu_us))
            print(
                f"{streams} streams, run {run} {name}: {rate:.1f} tok/s, first piece {first * 1000:.0f} ms, "
                f"process CPU {cpu_us:.0f} us/token",
                flush=True,
            )
    print(f"\n{streams} streams x {args.tokens} tokens, model {args.model}")
    for name, rows in results.items():
        rates, firsts, cpus = [r[0] for r in rows], [r[1] * 1000 for r in rows], [r[2] for r in rows]
        print(
            f"{name:>8}: {statistics.median(rates):7.1f} tok/s (min {min(rates):.1f}, max {max(rates):.1f}); "
            f"first piece median {statistics.median(firsts):.0f} ms (min {min(firsts):.0f}, max {max(firsts):.0f}); "
            f"CPU {statistics.median(cpus):.0f} us/token ({min(cpus):.0f}-{max(cpus):.0f})"
        )
    ratio = statistics.median(r[0] for r in results["async"]) / statistics.median(r[0] for r in results["threads"])
    pairs = sorted(a[0] / t[0] for a, t in zip(results["async"], results["threads"]))
    print(
        f"   async/threads: {ratio:.2f} (medians); per run pair {', '.join(f'{r:.2f}' for r in pairs)} "
        f"(median {statistics.median(pairs):.2f})\n",
        flush=True,
    )


if __name__ == "__main__":
    main()
