#!/usr/bin/env python3
"""Components against core modules on the same model, and the cost of a 1 MiB tensor round trip.

Two measurements in one run:

1. **Generation**: ``guest_examples/components/nn_complete.wasm`` (a wasi:nn component) and
   ``guest_examples/complete.wasm`` (the core-module guest) generate the same ``--n-predict`` tokens
   on the same model, each a whole ``WasiNN.run`` (instantiate, generate, exit), interleaved
   ``--rounds`` times; the ratio is core time / component time (1.0 = as fast; target >= 0.97).
2. **Round trip**: ``nn_roundtrip.wasm`` builds a tensor of ``--size`` bytes and reads it back
   ``--count`` times; the time per round trip (one ``list<u8>`` in, one out) is the difference
   between that run and a run with no round trips, divided by ``--count``; without the fast path
   (wasmtime-py's element-by-element conversion), with it (``wasinn_host.guest.fast_calls``), and
   with it after ``fast_calls.keep_list_heap()`` (process-wide: all that follows runs with it).

3. **Start-up**: compiling each guest against loading it from a warm compile cache
   (``wasinn_host.launch.compile_cache``; ``--startup X.wasm`` adds another guest).

4. **Breakdown** (``--breakdown``): where a round trip's time goes, per direction, on a WAT component
   whose imports take a ``list<u8>`` and return one: the same import with a host function that
   ignores the list (wasmtime's lifting and C conversion alone) or returns a list built the way
   wasmtime's C API documents (``wasmtime_component_vallist_new_uninit``), against the fast path;
   the Python part alone; the page faults per call; and the largest list a guest can pass.

Usage::

    python scripts/benchmarks/bench_component.py [--model PATH] [--rounds N] [--size BYTES] [--count N]
        [--breakdown] [--skip-generation] [--skip-startup]

Without ``--model`` the successor test model is written to a temporary directory (needs gguf).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import wasmtime
import wasmtime.component as cm

from wasinn_host import RunOptions, WasiNN
from wasinn_host.guest import callbacks, fast_calls
from wasinn_host.launch.compile_cache import CompileCache
from wasinn_host.launch.guest_load import COMPONENT_HEADER
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


LISTS_WAT = COMPONENTS / "lists.wat"
"""A guest whose exports call a host import taking a ``list<u8>`` or one returning it (see the file)."""

_KEEP_ALIVE: list[object] = []


def _define_raw(instance: cm.LinkerInstance, name: str, callback: Callable[..., int]) -> None:
    """Define ``name`` with a C callback that sees wasmtime's C values as they are."""
    native = wasmtime._ffi.wasmtime_component_func_callback_t(callback)
    _KEEP_ALIVE.append(native)
    encoded = name.encode()
    error = wasmtime._ffi.wasmtime_component_linker_instance_add_func(
        instance.ptr(), ctypes.create_string_buffer(encoded), len(encoded), native, None, callbacks.no_finalizer
    )
    assert not error


def lists_instance(engine: wasmtime.Engine, payload: bytes, raw: bool) -> tuple[wasmtime.Store, cm.Func, cm.Func]:
    """A Store and the ``take-n``/``give-n`` exports of ``lists.wat``.

    ``raw``: ``take`` ignores its list and ``give`` fills a ``vallist_new_uninit`` list in C order
    (wasmtime's C API as documented, nothing of ours); else both go through the fast path.
    """
    linker = cm.Linker(engine)
    with linker.root() as root, root.add_instance("host") as host:
        if raw:

            def give(_data: int, _ctx: Any, _ty: Any, args: Any, _n: int, results: Any, _r: int) -> int:
                count = args[0].of.u32
                items = wasmtime._ffi.wasmtime_component_vallist_t()
                wasmtime._ffi.wasmtime_component_vallist_new_uninit(ctypes.byref(items), count)
                slots = fast_calls._slots(ctypes.cast(items.data, ctypes.c_void_p).value or 0, count)
                slots[:, 0] = fast_calls.KIND_U8
                slots[:, fast_calls.PAYLOAD_OFFSET] = memoryview(payload)[:count]
                results[0].kind = fast_calls.KIND_LIST
                results[0].of.list = items
                return 0

            _define_raw(host, "take", lambda *_args: 0)
            _define_raw(host, "give", give)
        else:
            fast_calls.add_fast_func(host, "take", lambda _store, data: None)
            fast_calls.add_fast_func(host, "give", lambda _store, n: memoryview(payload)[:n])
    store = wasmtime.Store(engine)
    instance = linker.instantiate(store, cm.Component(engine, LISTS_WAT.read_text()))
    take, give_n = instance.get_func(store, "take-n"), instance.get_func(store, "give-n")
    assert take is not None and give_n is not None
    return store, take, give_n


def per_call(store: wasmtime.Store, func: cm.Func, size: int, count: int = 4, rounds: int = 5) -> tuple[float, float]:
    """Milliseconds per call (best of ``rounds``) and minor page faults per call of ``func(size, count)``."""
    func(store, size, 1)
    best, faults = float("inf"), 0
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        func(store, size, count)
        best = min(best, (time.perf_counter() - start) / count)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return best * 1000, faults / count


def python_part_ms(size: int, rounds: int = 7) -> tuple[float, float]:
    """Milliseconds of the fast path's own work: reading a list's bytes, and building a list."""
    payload = bytes(range(256)) * (size // 256 + 1)
    value = wasmtime._ffi.wasmtime_component_val_t()
    write, read = float("inf"), float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fast_calls.write_bytes(payload[:size], value)
        middle = time.perf_counter()
        assert fast_calls.read_bytes(value) == payload[:size]
        write, read = min(write, middle - start), min(read, time.perf_counter() - middle)
        wasmtime._ffi.wasmtime_component_val_delete(ctypes.byref(value))
    return read * 1000, write * 1000


def largest_list_in(engine: wasmtime.Engine) -> int:
    """The most bytes a guest can pass in one ``list<u8>`` argument before wasmtime traps (bisection)."""
    low, high = 1 << 20, 8 << 20
    while high - low > 1:
        middle = (low + high) // 2
        store, take, _give = lists_instance(engine, b"", raw=True)
        try:
            take(store, middle, 1)
            low = middle
        except wasmtime.WasmtimeError:
            high = middle
    return low


def breakdown(engine: wasmtime.Engine, size: int, label: str) -> None:
    """Print where the time of one ``size``-byte crossing in and one out goes."""
    payload = bytes(range(256)) * (size // 256 + 1)
    read, write = python_part_ms(size)
    print(f"{label}: python part alone: read {read:.1f} ms, build {write:.1f} ms")
    for raw in (True, False):
        store, take, give = lists_instance(engine, payload, raw)
        (take_ms, take_faults), (give_ms, give_faults) = per_call(store, take, size), per_call(store, give, size)
        kind = "wasmtime alone (raw C callback)" if raw else "fast path"
        print(
            f"{label}, {kind}: in {take_ms:.1f} ms ({take_faults:.0f} page faults), "
            f"out {give_ms:.1f} ms ({give_faults:.0f} page faults), sum {take_ms + give_ms:.1f} ms"
        )


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
    parser.add_argument("--breakdown", action="store_true", help="also break a round trip down (WAT component)")
    parser.add_argument("--skip-generation", action="store_true", help="leave out the generation comparison")
    parser.add_argument("--skip-startup", action="store_true", help="leave out the start-up times")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from wasinn_host.testing.gguf_models import write_successor_model

            model = Path(tmp) / "successor.gguf"
            write_successor_model(model)
        nn = WasiNN(preload=[f"bench:GGML:AUTO:{model}"])
        guests = [*args.startup, COMPONENTS / "nn_complete.wasm", ROOT / "guest_examples" / "complete.wasm"]
        for guest in [] if args.skip_startup else guests:
            cold, warm = startup_ms(nn.engine, Path(guest))
            print(f"start-up of {Path(guest).name}: compile {cold:.1f} ms, from the compile cache {warm:.1f} ms")
        slow = round_trip_ms(nn, args.size, args.slow_count, fast=False)
        fast = round_trip_ms(nn, args.size, args.count, fast=True)
        if args.breakdown:
            breakdown(nn.engine, args.size, "default glibc malloc")
        fast_calls.keep_list_heap()
        kept = round_trip_ms(nn, args.size, args.count, fast=True)
        print(
            f"round trip of {args.size} bytes in + {args.size} out: {slow:.0f} ms without the fast path, "
            f"{fast:.1f} ms with it, {kept:.1f} ms with it after keep_list_heap()"
        )
        if args.breakdown:
            breakdown(nn.engine, args.size, "after keep_list_heap()")
            print(f"largest list<u8> a guest can pass to the host: {largest_list_in(nn.engine)} bytes")
        if not args.skip_generation:
            result = generation(nn, "bench", args.prompt, args.n_predict, args.rounds)
            for kind, (wall, overhead) in result.items():
                print(
                    f"{kind}: {args.n_predict} tokens, run {wall * 1000:.1f} ms, host overhead {overhead * 1000:.2f} ms"
                )
            ratio = result["core module"][0] / result["component"][0]
            print(f"speed ratio component/core (core time / component time, median of {args.rounds}): {ratio:.3f}")
        nn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
