#!/usr/bin/env python3
"""Components against core modules on the same model, and the cost of a 1 MiB tensor round trip.

Two measurements in one run:

1. **Generation**: ``guest_examples/components/nn_complete.wasm`` (a wasi:nn component) and
   ``guest_examples/complete.wasm`` (the core-module guest) generate the same ``--n-predict`` tokens
   on the same model, each a whole ``WasiNN.run`` (instantiate, generate, exit), interleaved
   ``--rounds`` times; the ratio is core time / component time (1.0 = as fast; target >= 0.97).
2. **Round trip**: ``nn_roundtrip.wasm`` builds a tensor of ``--size`` bytes and reads it back
   ``--count`` times; the time per round trip (one ``list<u8>`` in, one out) is the difference
   between that run and a run with no round trips, divided by ``--count``; with the fast path
   (``wasinn_host.wit.fast_calls``) and without it (wasmtime-py's element-by-element conversion).

3. **Start-up**: compiling each guest against loading it from a warm compile cache
   (``wasinn_host.compile_cache``; ``--startup X.wasm`` adds another guest).

Usage::

    python scripts/benchmarks/bench_component.py [--model PATH] [--rounds N] [--size BYTES] [--count N]

Without ``--model`` the successor test model is written to a temporary directory (needs gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import wasmtime
import wasmtime.component as cm

from wasinn_host import RunOptions, WasiNN
from wasinn_host.compile_cache import CompileCache
from wasinn_host.host import COMPONENT_HEADER
from wasinn_host.wit.imports import WitNNImports

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ROOT / "guest_examples" / "components"


def run_component(nn: WasiNN, component: cm.Component, args: list[str], fast: bool = True) -> float:
    """Instantiate and run a command component once; return the seconds ``run`` took."""
    linker = cm.Linker(nn.engine)
    linker.add_wasip2()
    imports = nn.wit_imports if fast else WitNNImports(nn.backend, nn.limits, fast_lists=False)
    imports.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["guest", *args]
    wasi.stdout_file = os.devnull
    wasi.stderr_file = os.devnull
    store.set_wasi(wasi)
    imports.attach(store)
    instance = linker.instantiate(store, component)
    run_iface = instance.get_export_index(store, "wasi:cli/run@0.2.0")
    index = instance.get_export_index(store, "run", run_iface)
    assert index is not None
    run = instance.get_func(store, index)
    assert run is not None
    start = time.perf_counter()
    result = run(store)
    elapsed = time.perf_counter() - start
    if getattr(result, "tag", "ok") != "ok":
        raise SystemExit(f"guest failed: {args}")
    imports.detach(store)
    return elapsed


def round_trip_ms(nn: WasiNN, size: int, count: int, fast: bool) -> float:
    """Milliseconds per round trip of ``size`` bytes (in through the constructor, out through data())."""
    component = cm.Component.from_file(nn.engine, str(COMPONENTS / "nn_roundtrip.wasm"))
    base = min(run_component(nn, component, [str(size), "0"], fast) for _ in range(3))
    full = min(run_component(nn, component, [str(size), str(count)], fast) for _ in range(3))
    return (full - base) * 1000.0 / count


def generation(nn: WasiNN, name: str, prompt: str, n_predict: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Per guest kind, the median seconds of a whole run (instantiate, generate, exit) and the median
    host overhead (the run less the prompt and generation time its metadata reports).

    The component guest and the core-module guest, each compiled once, generate the same
    ``n_predict`` tokens; their order alternates from round to round.
    """
    component = nn.load_guest(COMPONENTS / "nn_complete.wasm")
    module = nn.load_guest(ROOT / "guest_examples" / "complete.wasm")
    runs = {
        "component": (component, [name, prompt, json.dumps({"n-predict": n_predict})], {}),
        "core module": (module, [name, prompt], {"n_predict": str(n_predict)}),
    }
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in runs}
    with tempfile.TemporaryDirectory() as tmp:
        err = str(Path(tmp) / "stderr")

        def timed(kind: str) -> tuple[float, float]:
            guest, args, env = runs[kind]
            options = RunOptions(env=env, stdout=os.devnull, stderr=err)
            start = time.perf_counter()
            if nn.run(guest, args, options) != 0:
                raise SystemExit(f"{kind} guest failed")
            wall = time.perf_counter() - start
            meta = json.loads(Path(err).read_text().splitlines()[-1])
            return wall, wall - (meta["prompt_ms"] + meta["generation_ms"]) / 1000

        for kind in runs:  # warm the model
            timed(kind)
        for i in range(rounds):
            for kind in runs if i % 2 == 0 else reversed(list(runs)):
                times[kind].append(timed(kind))
    return {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for k, v in times.items()}


def startup_ms(engine: wasmtime.Engine, path: Path, rounds: int = 5) -> tuple[float, float]:
    """Median milliseconds to get a compiled guest: compiling it, and loading it from a warm compile cache."""
    wasm = path.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        cache = CompileCache(engine, Path(tmp))
        load = cache.component if wasm.startswith(COMPONENT_HEADER) else cache.module
        load(wasm)  # fill the cache
        cold, warm = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            _compile(engine, wasm)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            load(wasm)
            warm.append(time.perf_counter() - start)
        assert cache.hits == rounds
    return statistics.median(cold) * 1000, statistics.median(warm) * 1000


def _compile(engine: wasmtime.Engine, wasm: bytes) -> object:
    if wasm.startswith(COMPONENT_HEADER):
        return cm.Component(engine, wasm)
    return wasmtime.Module(engine, wasm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF model (default: the successor test model)")
    parser.add_argument("--prompt", default="0", help="prompt for the generation comparison")
    parser.add_argument("--n-predict", type=int, default=256, help="tokens each guest generates")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--startup", action="append", default=[], help="also time compiling this .wasm")
    parser.add_argument("--slow-count", type=int, default=1, help="round trips without the fast path")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from wasinn_host.testing.gguf_models import write_successor_model

            model = Path(tmp) / "successor.gguf"
            write_successor_model(model)
        nn = WasiNN(preload=[f"bench:GGML:AUTO:{model}"])
        for guest in [*args.startup, COMPONENTS / "nn_complete.wasm", ROOT / "guest_examples" / "complete.wasm"]:
            cold, warm = startup_ms(nn.engine, Path(guest))
            print(f"start-up of {Path(guest).name}: compile {cold:.1f} ms, from the compile cache {warm:.1f} ms")
        fast = round_trip_ms(nn, args.size, args.count, fast=True)
        slow = round_trip_ms(nn, args.size, args.slow_count, fast=False)
        print(f"round trip of {args.size} bytes in + {args.size} out: {fast:.1f} ms fast path, {slow:.0f} ms without")
        result = generation(nn, "bench", args.prompt, args.n_predict, args.rounds)
        for kind, (wall, overhead) in result.items():
            print(f"{kind}: {args.n_predict} tokens, run {wall * 1000:.1f} ms, host overhead {overhead * 1000:.2f} ms")
        ratio = result["core module"][0] / result["component"][0]
        print(f"speed ratio component/core (core time / component time, median of {args.rounds}): {ratio:.3f}")
        nn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
