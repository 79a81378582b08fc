"""Benchmark: serving at GPU speed, with the defaults a user gets, against llama.cpp batched.

The host's own costs per step and per token hide behind a slow step (a 12-layer model on a 2-core
CPU) and show beside a fast one (a GPU; here, the tiny random model this script generates by default,
``--layers 2 --embd 256 --heads 4 --ff 512 --vocab 32000``, whose step is well under a millisecond).
In one run, on one model, with ``n-parallel`` unset, it measures N guests started at one moment, each
its own Store through one :class:`wasinn_host.WasiNN`, in three ways a guest computes:

- ``once``: ``set_input`` the prompt, ``compute`` ``--tokens`` tokens (``ignore-eos``);
- ``prompt-first``: ``compute`` the prompt alone (``n-predict`` 1), then ``--tokens`` tokens more (the
  shape of a guest that answers a first token early, or of a chat server's two calls);
- ``stream``: ``compute_single`` + ``get_output_single`` per token, ``--tokens`` times, then
  ``fini_single`` (WasmEdge's streaming examples and every LlamaEdge app);

and llama.cpp alone (llama-cpp-python's low-level API) decoding the same N prompts as N sequences of
one context (one KV stream each, one ``llama_decode`` a step, greedy samplers), from the first
prompt decode to the last token.  Guests are WAT modules calling the ``wasi_ephemeral_nn`` imports
(the loop of a streaming guest runs inside the guest).  Tokens/s count generated tokens from the
common start to the last guest's return; each guest's Store and instance are made before the start.

It prints per N and way: host tokens/s, llama.cpp's, their ratio against its target (``once`` and
``prompt-first`` >= 0.9 at N >= 8; ``stream`` >= 0.8 at N = 8; one streaming guest >= 0.9 of one
guest computing), the worker's steps and passes per step, and the worker's time per step split into
its phases (:mod:`wasinn_host.core.scheduling.step_clock`): the host's own (admit, plan, sample) beside
llama.cpp's (launch, device).  Medians of ``--runs`` runs, interleaved, with the spread.

Usage: ``python scripts/benchmarks/bench_serving.py [--model M.gguf] [--n 1,8,32,64] [--tokens 128]
[--ways once,prompt-first,stream] [--runs 5] [--threads 2]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import wasmtime
from bench_concurrency import native_batched
from native_process import native

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.testing.gguf_models import write_random_model

ALIAS = "serving"
TINY = {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_ff": 512, "n_vocab": 32000}

GUEST_WAT = """
(module
  (import "wasi_ephemeral_nn" "load_by_name_with_config" (func $load (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "set_input" (func $set_input (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute" (func $compute (param i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute_single" (func $compute_single (param i32) (result i32)))
  (import "wasi_ephemeral_nn" "get_output_single" (func $get_output_single (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "fini_single" (func $fini_single (param i32) (result i32)))
  ;; 0: graph, 4: context, 8: bytes written, 16: tensor, 48: dims, 1024: name, 2048: load config,
  ;; 4096: metadata {"n-predict":1}, 6144: metadata {"n-predict":T}, 8192: output, 65536: prompt
  (memory (export "memory") 8)
  (func (export "open") (param $name_len i32) (param $config_len i32) (result i32)
    (local $rc i32)
    (local.set $rc (call $load (i32.const 1024) (local.get $name_len)
                               (i32.const 2048) (local.get $config_len) (i32.const 0)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (call $init (i32.load (i32.const 0)) (i32.const 4)))
  (func $set (param $index i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 48) (local.get $len))
    (i32.store (i32.const 16) (i32.const 48))
    (i32.store (i32.const 20) (i32.const 1))
    (i32.store (i32.const 24) (i32.const 3))
    (i32.store (i32.const 28) (local.get $ptr))
    (i32.store (i32.const 32) (local.get $len))
    (call $set_input (i32.load (i32.const 4)) (local.get $index) (i32.const 16)))
  (func (export "once") (param $prompt_len i32) (result i32)
    (local $rc i32)
    (local.set $rc (call $set (i32.const 0) (i32.const 65536) (local.get $prompt_len)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (call $compute (i32.load (i32.const 4))))
  (func (export "prompt_first") (param $prompt_len i32) (param $one_len i32) (param $all_len i32) (result i32)
    (local $rc i32)
    (local.set $rc (call $set (i32.const 0) (i32.const 65536) (local.get $prompt_len)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (local.set $rc (call $set (i32.const 1) (i32.const 4096) (local.get $one_len)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (local.set $rc (call $compute (i32.load (i32.const 4))))
    (if (local.get $rc) (then (return (local.get $rc))))
    (local.set $rc (call $set (i32.const 1) (i32.const 6144) (local.get $all_len)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (call $compute (i32.load (i32.const 4))))
  (func (export "stream") (param $prompt_len i32) (param $n i32) (result i32)
    (local $rc i32)
    (local.set $rc (call $set (i32.const 0) (i32.const 65536) (local.get $prompt_len)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $rc (call $compute_single (i32.load (i32.const 4))))
        (if (local.get $rc) (then (return (local.get $rc))))
        (local.set $rc (call $get_output_single (i32.load (i32.const 4)) (i32.const 0)
                                                (i32.const 8192) (i32.const 4096) (i32.const 8)))
        (if (local.get $rc) (then (return (local.get $rc))))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))
    (call $fini_single (i32.load (i32.const 4))))
)
"""

WAYS = ("once", "prompt-first", "stream")


@dataclass
class Guest:
    store: wasmtime.Store
    memory: wasmtime.Memory
    exports: dict[str, wasmtime.Func]


def make_guest(nn: WasiNN, module: wasmtime.Module, config: dict[str, object], tokens: int) -> Guest:
    """A guest instance with the model loaded and an execution context made."""
    linker = wasmtime.Linker(nn.engine)
    nn.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    instance = linker.instantiate(store, module)
    exports = instance.exports(store)
    memory = exports["memory"]
    assert isinstance(memory, wasmtime.Memory)
    funcs = {name: exports[name] for name in ("open", "once", "prompt_first", "stream")}
    name, cfg = ALIAS.encode(), json.dumps(config).encode()
    memory.write(store, name, 1024)
    memory.write(store, cfg, 2048)
    memory.write(store, b'{"n-predict":1}', 4096)
    memory.write(store, json.dumps({"n-predict": tokens}).encode(), 6144)
    rc = funcs["open"](store, len(name), len(cfg))  # type: ignore[operator]
    if rc != 0:
        raise SystemExit(f"guest: open returned {rc}")
    return Guest(store, memory, funcs)  # type: ignore[arg-type]


def run_guest(guest: Guest, way: str, prompt: bytes, tokens: int) -> int:
    guest.memory.write(guest.store, prompt, 65536)
    if way == "once":
        return int(guest.exports["once"](guest.store, len(prompt)))
    if way == "prompt-first":
        all_len = len(json.dumps({"n-predict": tokens}))
        return int(guest.exports["prompt_first"](guest.store, len(prompt), len(b'{"n-predict":1}'), all_len))
    return int(guest.exports["stream"](guest.store, len(prompt), tokens))


@dataclass
class HostRun:
    tokens_per_s: float
    steps: int
    passes: int
    phases_ms: dict[str, float]


def host_run(
    nn: WasiNN, module: wasmtime.Module, config: dict[str, object], prompts: list[str], way: str, tokens: int
) -> HostRun:
    """N guests (made beforehand) running ``way`` at one moment; tokens/s and the worker's steps."""
    guests = [make_guest(nn, module, config, tokens) for _ in prompts]
    worker = nn.registry.loaded()[0].worker
    barrier = threading.Barrier(len(prompts) + 1)
    codes: list[int] = [0] * len(prompts)

    def go(i: int) -> None:
        barrier.wait()
        codes[i] = run_guest(guests[i], way, prompts[i].encode(), tokens)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    clock = getattr(worker, "clock", None)  # None: a tree from before the step clock (for comparisons)
    steps0, passes0 = (clock.steps if clock else worker.decode_calls), getattr(worker, "decode_passes", 0)
    seconds0 = dict(clock.seconds) if clock else {}
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"{way}: guests returned {codes}")
    steps = (clock.steps if clock else worker.decode_calls) - steps0
    seconds = clock.seconds if clock else dict.fromkeys(("admit", "plan", "launch", "device", "sample"), 0.0)
    phases = {k: (v - seconds0.get(k, 0.0)) * 1000.0 / max(steps, 1) for k, v in seconds.items()}
    for guest in guests:
        nn.detach(guest.store)
    return HostRun(len(prompts) * tokens / wall, steps, getattr(worker, "decode_passes", 0) - passes0, phases)


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF path (default: the tiny random model, generated)")
    parser.add_argument("--n", default="1,8,32,64", help="guests at once, comma-separated (default 1,8,32,64)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per guest (default 128)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt letters per guest (default 32)")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"ways guests compute (default {','.join(WAYS)})")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each case; medians (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads for both (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random prompts (default 1)")
    args = parser.parse_args()
    ns = [int(n) for n in args.n.split(",")]
    ways = [w for w in args.ways.split(",") if w]
    if unknown := set(ways) - set(WAYS):
        parser.error(f"unknown ways: {', '.join(sorted(unknown))}")
    rng = random.Random(args.seed)

    def prompts(n: int) -> list[str]:
        return ["".join(rng.choice(string.ascii_letters) for _ in range(args.prompt_tokens)) for _ in range(n)]

    ctx_size = 256 * ((args.prompt_tokens + args.tokens + 16) // 256 + 1)
    config: dict[str, object] = {
        "temp": 0,
        "ignore-eos": True,
        "n-predict": args.tokens,
        "ctx-size": ctx_size,
        "threads": args.threads,
        "batch-size": 512,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else write_random_model(Path(tmp) / "tiny.gguf", **TINY)  # type: ignore[arg-type]
        nn = WasiNN(preload=[f"{ALIAS}:GGML:AUTO:{path}"], registry=ModelRegistry())
        module = wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(GUEST_WAT)))
        host_run(nn, module, config, prompts(1), "once", 4)  # load the model, warm up
        # the reference runs in a process of its own (native_process.py says why)
        native(native_batched, str(path), prompts(2), 4, args.threads, ctx_size, False)
        host: dict[tuple[int, str], list[HostRun]] = {}
        ref: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(args.runs):
            for n in ns:
                batch = prompts(n)
                for way in ways:
                    host.setdefault((n, way), []).append(host_run(nn, module, config, batch, way, args.tokens))
                ref[n].append(native(native_batched, str(path), batch, args.tokens, args.threads, ctx_size, False)[0])
        status = nn.status()["models"][0]
        nn.registry.close()

    label = path.name if args.model else "tiny random (2 layers, embd 256, vocab 32000; generated)"
    print(
        f"model: {label}; {args.threads} threads; {args.prompt_tokens}-letter prompts, {args.tokens} tokens a guest, "
        f"greedy; n-parallel unset (the model grew to {status['sequences']} sequences); medians of {args.runs}"
    )
    print(
        f"{'N':>3} {'way':<13} {'host tok/s':>10} {'llama.cpp':>10} {'ratio':>6} {'target':>7} {'spread':>11} "
        f"{'steps':>6} {'passes/step':>11}  host ms/step (admit+plan+sample) | llama.cpp ms/step"
    )
    for n in ns:
        native_median = statistics.median(ref[n])
        for way in ways:
            runs = host[(n, way)]
            ratios = [r.tokens_per_s / nat for r, nat in zip(runs, ref[n])]
            rate = statistics.median(r.tokens_per_s for r in runs)
            target = ">=0.9" if way != "stream" and n >= 8 else ">=0.8" if way == "stream" and n == 8 else ""
            mid = sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2]
            p = mid.phases_ms
            host_ms = p["admit"] + p["plan"] + p["sample"]
            print(
                f"{n:>3} {way:<13} {rate:>10.1f} {native_median:>10.1f} {statistics.median(ratios):>6.3f} "
                f"{target:>7} {spread(ratios):>11} {mid.steps:>6} {mid.passes / max(mid.steps, 1):>11.2f}  "
                f"{host_ms:.3f} ({p['admit']:.3f}+{p['plan']:.3f}+{p['sample']:.3f}) | "
                f"{p['launch'] + p['device']:.3f}"
            )
    if 1 in ns and "stream" in ways and "once" in ways:
        one = [s.tokens_per_s / o.tokens_per_s for s, o in zip(host[(1, "stream")], host[(1, "once")])]
        print(
            f"one streaming guest / one guest computing: {statistics.median(one):.3f} (target >= 0.9; "
            f"spread {spread(one)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
