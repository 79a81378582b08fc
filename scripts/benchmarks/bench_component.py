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


def generation(nn: WasiNN, name: str, prompt: str, n_predict: int, rounds: int) -> tuple[float, float]:
    """Median seconds of a whole run (instantiate, generate, exit) of the component guest and of the
    core-module guest, each compiled once, generating the same ``n_predict`` tokens."""
    component = nn.load_guest(COMPONENTS / "nn_complete.wasm")
    module = nn.load_guest(ROOT / "guest_examples" / "complete.wasm")
    quiet = RunOptions(stdout=os.devnull, stderr=os.devnull)
    core_options = RunOptions(env={"n_predict": str(n_predict)}, stdout=os.devnull, stderr=os.devnull)
    component_args = [name, prompt, json.dumps({"n-predict": n_predict})]
    comp_times, core_times = [], []

    def timed(guest: object, args: list[str], options: RunOptions) -> float:
        start = time.perf_counter()
        if nn.run(guest, args, options) != 0:  # type: ignore[arg-type]
            raise SystemExit(f"guest failed: {args}")
        return time.perf_counter() - start

    timed(component, component_args, quiet)  # warm the model
    timed(module, [name, prompt], core_options)
    for _ in range(rounds):
        comp_times.append(timed(component, component_args, quiet))
        core_times.append(timed(module, [name, prompt], core_options))
    return statistics.median(comp_times), statistics.median(core_times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF model (default: the successor test model)")
    parser.add_argument("--prompt", default="0", help="prompt for the generation comparison")
    parser.add_argument("--n-predict", type=int, default=256, help="tokens each guest generates")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--slow-count", type=int, default=1, help="round trips without the fast path")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from wasinn_host.testing.gguf_models import write_successor_model

            model = Path(tmp) / "successor.gguf"
            write_successor_model(model)
        nn = WasiNN(preload=[f"bench:GGML:AUTO:{model}"])
        fast = round_trip_ms(nn, args.size, args.count, fast=True)
        slow = round_trip_ms(nn, args.size, args.slow_count, fast=False)
        print(f"round trip of {args.size} bytes in + {args.size} out: {fast:.1f} ms fast path, {slow:.0f} ms without")
        comp, core = generation(nn, "bench", args.prompt, args.n_predict, args.rounds)
        print(
            f"generation, median of {args.rounds}: component {comp * 1000:.1f} ms, core module {core * 1000:.1f} ms, "
            f"ratio core/component {core / comp:.3f}"
        )
        nn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
