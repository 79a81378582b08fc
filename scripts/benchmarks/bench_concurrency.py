"""Benchmark: concurrent guests sharing one model, against llama.cpp's own batched decode.

In one run, on the same GGUF model, thread count, prompt length and number of generated
tokens, it measures

1. **host throughput**: N guests (``guest_examples/complete.wasm``, greedy, ``ignore-eos``,
   ``n-predict`` T) run at the same moment from N Python threads through one
   :class:`wasinn_host.WasiNN` (each ``nn.run`` has its own Store; all share the one
   preloaded model, so the model's worker batches their sequences).  Aggregate tokens/s =
   N * T / wall time from the common start to the last guest's exit; it includes
   instantiating each guest and decoding its prompt.  The module is compiled once up front
   (as a serving host would cache it); each run still instantiates it.
2. **native reference**: llama-cpp-python's low-level API decoding the same N prompts as N
   sequences of one context (``n_seq_max`` = N, ``kv_unified`` false like the host unless
   ``--native-kv-unified``, ``n_ctx`` = N * ctx-size), one ``llama_decode`` per step with one
   token per sequence in increasing seq-id order, logits only for each sequence's last token,
   one greedy sampler per sequence; prompts are decoded together (chunked to ``n_batch``).
   Timed from the first prompt decode to the T-th sampled token of every sequence.  The
   reference runs in a process of its own (``native_process.py``: two OpenMP thread teams in one
   process slow both), as a user of llama-cpp-python runs it.
3. a table of N, host tokens/s, native tokens/s, their ratio (target at N = 8: >= 0.9) and the
   host's speed-up over N = 1 (medians of ``--runs`` interleaved runs; prompts are fresh random
   letters for every run and guest, of equal length, so nothing is shared but the BOS token).
4. **memory**: peak resident memory (``VmRSS``, sampled every 2 ms) during a run of the largest
   N, against weights (``llama_model_size``; the GGUF file size is shown too) plus the KV cache
   computed from the model's shape (2 * n_layer * n_ctx_total * n_embd_kv * 2 bytes, F16), where
   the cells are the host's own (its status).  Overhead is shown both for the whole process and
   net of the process's RSS before any model was loaded (interpreter, wasmtime, llama.cpp
   libraries).  Target: within weights + KV + 15 %.
5. **prefix reuse**: time to first token through the ABI (a small WAT guest that calls
   ``load_by_name_with_config`` / ``init_execution_context`` once, then ``set_input`` +
   ``compute`` with ``n-predict`` 1 per turn; the Python side times the exported ``turn``
   call, so the host path - guest memory, tokenization, worker queue, decode, sampling - is
   all inside).  Turn 1 is a fresh ~``--prefix-tokens`` prompt; turn 2 repeats it and adds
   ``--extra-tokens`` new tokens, as in a multi-turn chat.  Target: turn 2 <= 15 % of turn 1.
   The tokens the worker actually decoded in each turn are printed as a cross-check.

Usage: ``python scripts/benchmarks/bench_concurrency.py [--model smollm2|gemma3|M.gguf] [--tokens 64]
[--prompt-tokens 32] [--runs 3] [--threads 2] [--n 1,2,4,8]`` (without ``--model`` a random 12-layer F16
model is generated in a temp dir; ``smollm2`` and ``gemma3`` are the real models of
:mod:`wasinn_host.testing.real_models`, fetched once; their tokenizers merge letters, so prompts of
equal letters may differ by a few tokens and the table shows the range).  On a machine whose cores
are shared with another busy process, use
``--threads`` = the idle cores: llama.cpp's threads wait on each other every op, and one thread
sharing a core with another process can slow decoding many times over (both sides alike).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import string
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import wasmtime
from guests_together import run_together
from native_process import native
from peak_rss import PeakRss, rss_bytes

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.bench.reference import decode_together
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.llama import cpu_probe
from wasinn_host.llama.log import init_backend
from wasinn_host.testing.gguf_models import write_random_model
from wasinn_host.testing.real_models import model_file

ROOT = Path(__file__).resolve().parents[2]

GUEST = ROOT / "guest_examples" / "complete.wasm"
ALIAS = "bench"
MAX_N = 64
N_BATCH = 512
ALPHABET = string.ascii_letters


# -- helpers -------------------------------------------------------------------------


def random_prompts(rng: random.Random, count: int, length: int) -> list[str]:
    """``count`` distinct prompts of ``length`` random letters (one token per letter)."""
    return ["".join(rng.choice(ALPHABET) for _ in range(length)) for _ in range(count)]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def mib(n: float) -> str:
    return f"{n / 2**20:8.1f} MiB"


# -- host ----------------------------------------------------------------------------


@dataclass
class HostRun:
    tokens_per_s: float
    texts: list[bytes]
    decode_calls: int
    decoded_tokens: int


def host_config(n_tokens: int, ctx_size: int, threads: int, n_parallel: int) -> dict[str, object]:
    """The guest's WASINN_CONFIG: equal load-time keys everywhere, so one loaded model serves all.

    Only the keys a real guest sets (ctx-size, batch-size, threads, temp, n-predict); ``n-parallel``
    only when asked for (0: unset, the default a user gets)."""
    config: dict[str, object] = {
        "temp": 0,
        "ignore-eos": True,
        "n-predict": n_tokens,
        "ctx-size": ctx_size,
        "threads": threads,
        "batch-size": N_BATCH,
    }
    if n_parallel:
        config["n-parallel"] = n_parallel
    return config


def host_run(nn: WasiNN, module: wasmtime.Module, prompts: list[str], config: dict[str, object]) -> HostRun:
    """Run one guest per prompt, all at once; aggregate generated tokens/s and the worker's decodes."""
    before: list[tuple[ModelWorker, int, int]] = []

    def count_decodes() -> None:
        if loaded := nn.registry.loaded():
            worker = loaded[0].worker
            before.append((worker, worker.decode_calls, worker.decoded_tokens))

    run = run_together(nn, module, ALIAS, prompts, config, before_start=count_decodes)
    worker, calls0, tokens0 = before[0] if before else (nn.registry.loaded()[0].worker, 0, 0)
    n_tokens = config["n-predict"]
    assert isinstance(n_tokens, int)
    return HostRun(
        len(prompts) * n_tokens / run.wall_s, run.texts, worker.decode_calls - calls0, worker.decoded_tokens - tokens0
    )


# -- native reference ----------------------------------------------------------------


@dataclass
class NativeModel:
    ptr: ctypes.c_void_p
    vocab: ctypes.c_void_p
    piece_buf: ctypes.Array = field(default_factory=lambda: ctypes.create_string_buffer(64))

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        assert n > 0, n
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self.piece_buf, 64, 0, True)
        return self.piece_buf.raw[:n]


def native_load(path: Path) -> NativeModel:
    init_backend()
    cpu_probe.prepare_for_file(path)  # the host's safe CPU layouts (AMX off where it crashes)
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    return NativeModel(model, llama_cpp.llama_model_get_vocab(model))


def native_run(
    model: NativeModel, prompts: list[list[int]], n_tokens: int, threads: int, ctx_size: int, kv_unified: bool
) -> tuple[float, list[bytes]]:
    """Decode ``len(prompts)`` sequences batched (``wasinn bench``'s reference loop,
    :func:`wasinn_host.bench.reference.decode_together`, greedy); aggregate generated tokens/s and each text."""
    texts = [bytearray() for _ in prompts]

    def took(seq: int, token: int) -> None:
        texts[seq] += model.piece(token)

    rate, _ = decode_together(model.ptr, prompts, n_tokens, threads, ctx_size, True, kv_unified, took)
    return rate, [bytes(t) for t in texts]


_MODELS: dict[str, NativeModel] = {}


def _native_model(path: str) -> NativeModel:
    """The reference process's copy of the model at ``path`` (loaded at its first use)."""
    if path not in _MODELS:
        _MODELS[path] = native_load(Path(path))
    return _MODELS[path]


def native_batched(
    path: str, prompts: list[str], n_tokens: int, threads: int, ctx_size: int, kv_unified: bool
) -> tuple[float, list[bytes]]:
    """:func:`native_run` of ``prompts`` on the model at ``path``: run it with
    :func:`native_process.native`, in the reference's own process."""
    model = _native_model(path)
    return native_run(model, [model.tokenize(p) for p in prompts], n_tokens, threads, ctx_size, kv_unified)


def native_turns(path: str, first: str, second: str, threads: int, ctx_size: int) -> tuple[float, float]:
    """:func:`native_continuation` on the model at ``path`` (in the reference's process, as above)."""
    return native_continuation(_native_model(path), first, second, threads, ctx_size)


# -- prefix reuse (time to first token through the ABI) ------------------------------

TURN_GUEST_WAT = """
(module
  (import "wasi_ephemeral_nn" "load_by_name_with_config"
    (func $load (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "set_input" (func $set_input (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute" (func $compute (param i32) (result i32)))
  ;; 0: graph, 4: context, 16: tensor struct, 48: dims, 1024: name, 2048: config, 65536: prompt
  (memory (export "memory") 8)
  (func (export "open") (param $name_len i32) (param $config_len i32) (result i32)
    (local $rc i32)
    (local.set $rc (call $load (i32.const 1024) (local.get $name_len)
                               (i32.const 2048) (local.get $config_len) (i32.const 0)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (call $init (i32.load (i32.const 0)) (i32.const 4)))
  (func (export "turn") (param $len i32) (result i32)
    (local $rc i32)
    (i32.store (i32.const 48) (local.get $len))
    (i32.store (i32.const 16) (i32.const 48))
    (i32.store (i32.const 20) (i32.const 1))
    (i32.store (i32.const 24) (i32.const 3))
    (i32.store (i32.const 28) (i32.const 65536))
    (i32.store (i32.const 32) (local.get $len))
    (local.set $rc (call $set_input (i32.load (i32.const 4)) (i32.const 0) (i32.const 16)))
    (if (local.get $rc) (then (return (local.get $rc))))
    (call $compute (i32.load (i32.const 4)))))
"""


def native_continuation(
    model: NativeModel, first: str, second: str, threads: int, ctx_size: int
) -> tuple[float, float]:
    """llama.cpp alone: ms to decode ``first`` and sample a token, then to decode what ``second`` adds
    (its cells kept) and sample again."""
    tokens1, tokens2 = model.tokenize(first), model.tokenize(second)
    assert tokens2[: len(tokens1)] == tokens1 or len(tokens2) > len(tokens1)
    keep = next((i for i, (a, b) in enumerate(zip(tokens1, tokens2)) if a != b), len(tokens1))
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = ctx_size
    cparams.n_batch = cparams.n_ubatch = N_BATCH
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model.ptr, cparams)
    batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
    sampler = llama_cpp.llama_sampler_init_greedy()

    def decode(tokens: list[int], start: int) -> float:
        began = time.perf_counter()
        for chunk in range(start, len(tokens), N_BATCH):
            part = tokens[chunk : chunk + N_BATCH]
            for i, token in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, chunk + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = chunk + i == len(tokens) - 1
            batch.n_tokens = len(part)
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise SystemExit("native llama_decode failed")
        llama_cpp.llama_sampler_sample(sampler, ctx, -1)
        return (time.perf_counter() - began) * 1000.0

    try:
        t1 = decode(tokens1, 0)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, min(keep, len(tokens1) - 1), -1)
        t2 = decode(tokens2, min(keep, len(tokens1) - 1))
    finally:
        llama_cpp.llama_sampler_free(sampler)
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return t1, t2


@dataclass
class TurnTimes:
    first_ms: float
    second_ms: float
    first_decoded: int
    second_decoded: int


def prefix_reuse(nn: WasiNN, config: dict[str, object], first: str, second: str) -> TurnTimes:
    """One execution context, two ``n-predict: 1`` computes: ``first``, then ``second`` (which extends it)."""
    linker = wasmtime.Linker(nn.engine)
    nn.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    try:
        instance = linker.instantiate(store, wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(TURN_GUEST_WAT))))
        exports = instance.exports(store)
        memory, open_, turn = exports["memory"], exports["open"], exports["turn"]
        assert isinstance(memory, wasmtime.Memory) and isinstance(open_, wasmtime.Func)
        assert isinstance(turn, wasmtime.Func)
        name, cfg = ALIAS.encode(), json.dumps(config).encode()
        memory.write(store, name, 1024)
        memory.write(store, cfg, 2048)
        rc = open_(store, len(name), len(cfg))
        if rc != 0:
            raise SystemExit(f"prefix-reuse guest: open returned {rc}")
        worker = nn.registry.loaded()[0].worker
        times, decoded = [], []
        for text in (first, second):
            data = text.encode()
            memory.write(store, data, 65536)
            before = worker.decoded_tokens
            started = time.perf_counter()
            rc = turn(store, len(data))
            times.append((time.perf_counter() - started) * 1000.0)
            if rc != 0:
                raise SystemExit(f"prefix-reuse guest: turn returned {rc}")
            decoded.append(worker.decoded_tokens - before)
    finally:
        nn.detach(store)
    return TurnTimes(times[0], times[1], decoded[0], decoded[1])


# -- main ----------------------------------------------------------------------------


def model_shape(path: Path) -> tuple[int, int, int]:
    """(llama_model_size, n_layer, n_embd_kv) of a GGUF model."""
    model = native_load(path)
    try:
        n_embd = llama_cpp.llama_model_n_embd(model.ptr)
        n_head = llama_cpp.llama_model_n_head(model.ptr)
        n_head_kv = llama_cpp.llama_model_n_head_kv(model.ptr)
        n_layer = llama_cpp.llama_model_n_layer(model.ptr)
        return llama_cpp.llama_model_size(model.ptr), n_layer, n_embd // n_head * n_head_kv
    finally:
        llama_cpp.llama_model_free(model.ptr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        help="smollm2, gemma3 (real models, fetched once) or a GGUF path "
        "(default: a generated random 12-layer F16 model)",
    )
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per guest (default 64)")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=32,
        help="prompt length in letters (~tokens; one more for BOS) per guest (default 32)",
    )
    parser.add_argument(
        "--n",
        default="1,2,4,8",
        help=f"concurrent guests to measure, comma-separated, each <= {MAX_N} (default 1,2,4,8)",
    )
    parser.add_argument(
        "--host-n-parallel",
        type=int,
        default=0,
        metavar="N",
        help="set n-parallel N in the guests' config (default: unset, as real guests do)",
    )
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each N; the median is reported (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads for both (default 2)")
    parser.add_argument(
        "--native-kv-unified",
        action="store_true",
        help="native reference with one shared KV pool (default: one stream per sequence, as the host)",
    )
    parser.add_argument(
        "--prefix-tokens",
        type=int,
        default=500,
        help="turn-1 prompt length for the prefix-reuse measurement (default 500)",
    )
    parser.add_argument("--extra-tokens", type=int, default=12, help="tokens turn 2 adds (default 12)")
    parser.add_argument("--ttft-runs", type=int, default=3, help="prefix-reuse pairs timed; median (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random prompts (default 1)")
    args = parser.parse_args()
    ns = sorted({int(x) for x in args.n.split(",") if x.strip()})
    if not ns or ns[0] < 1 or ns[-1] > MAX_N:
        parser.error(f"--n values must be 1..{MAX_N}")
    rng = random.Random(args.seed)
    baseline_rss = rss_bytes()
    ctx_size = round_up(
        max(args.prompt_tokens + 1 + args.tokens + 8, args.prefix_tokens + args.extra_tokens + 1 + 8), 256
    )
    config = host_config(args.tokens, ctx_size, args.threads, args.host_n_parallel)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        started_all = time.perf_counter()
        model_path = model_file(args.model) if args.model else write_random_model(workdir / "random.gguf")
        file_size = model_path.stat().st_size
        weights, n_layer, n_embd_kv = model_shape(model_path)
        before_load_rss = rss_bytes()

        nn = WasiNN(preload=[f"{ALIAS}:GGML:AUTO:{model_path}"], registry=ModelRegistry())
        compile_started = time.perf_counter()
        module = nn.load_module(GUEST)
        compile_ms = (time.perf_counter() - compile_started) * 1000.0
        host_run(nn, module, random_prompts(rng, 1, args.prompt_tokens), dict(config, **{"n-predict": 4}))
        llama = nn.registry.loaded()[0].weights
        lengths = {len(llama.tokenize(p.encode())) for p in random_prompts(rng, 8, args.prompt_tokens)}
        if len(lengths) != 1 and not args.model:
            raise SystemExit(f"prompts tokenize to different lengths: {lengths}")
        prompt_len = f"{min(lengths)}" if len(lengths) == 1 else f"{min(lengths)}-{max(lengths)}"

        # memory: peak RSS while the largest N guests run (before the native model is loaded)
        with PeakRss() as peak:
            host_run(nn, module, random_prompts(rng, ns[-1], args.prompt_tokens), config)
        (model_status,) = nn.status()["models"]  # after the largest N: the sequences it grew to
        kv_bytes = model_status["kv_cache_bytes"]
        kv_sequences = model_status["sequences"]
        high_water = model_status["sequences_high_water"]

        reference = str(model_path)
        native(
            native_batched,
            reference,
            random_prompts(rng, 2, args.prompt_tokens),
            4,
            args.threads,
            ctx_size,
            args.native_kv_unified,
        )  # warm up (the reference runs in a process of its own: native_process.py says why)
        host: dict[int, list[HostRun]] = {n: [] for n in ns}
        native_rates: dict[int, list[float]] = {n: [] for n in ns}
        same = {n: 0 for n in ns}
        for _ in range(args.runs):  # interleaved, so drift affects both alike
            for n in ns:
                prompts = random_prompts(rng, n, args.prompt_tokens)
                one = host_run(nn, module, prompts, config)
                rate, texts = native(
                    native_batched,
                    reference,
                    prompts,
                    args.tokens,
                    args.threads,
                    ctx_size,
                    args.native_kv_unified,
                )
                host[n].append(one)
                native_rates[n].append(rate)
                same[n] += sum(a == b for a, b in zip(one.texts, texts))
        # prefix reuse: fresh random prompts, so turn 1 reuses nothing but BOS
        turns: list[TurnTimes] = []
        native_turn_ms: list[tuple[float, float]] = []
        ttft_config = dict(config, **{"n-predict": 1})
        for _ in range(args.ttft_runs):
            first = random_prompts(rng, 1, args.prefix_tokens)[0]
            second = first + random_prompts(rng, 1, args.extra_tokens)[0]
            turns.append(prefix_reuse(nn, ttft_config, first, second))
            native_turn_ms.append(native(native_turns, reference, first, second, args.threads, ctx_size))
        nn.registry.close()
        total_s = time.perf_counter() - started_all

    # -- report
    label = model_path.name if args.model else "random 12-layer F16 (generated)"
    print(
        f"model: {label}, {mib(file_size).strip()} file; {args.threads} threads; prompts {prompt_len} tokens "
        f"(with BOS), {args.tokens} generated tokens per guest, greedy; ctx-size {ctx_size} per sequence; "
        f"median of {args.runs} runs; guest compiled once ({compile_ms:.0f} ms)"
    )
    n_parallel = f"n-parallel {args.host_n_parallel}" if args.host_n_parallel else "n-parallel unset"
    print(
        f"host: complete.wasm x N through one WasiNN, {n_parallel} (at most {high_water} sequences decoded "
        f"together); native: n_seq_max N, "
        f"kv_unified {'true' if args.native_kv_unified else 'false'}, one llama_decode per step"
    )
    print()
    print(
        f"{'N':>3}  {'host tok/s':>10}  {'native tok/s':>12}  {'host/native':>11}  {'host xN=1':>9}  "
        f"{'decodes/run':>11}  {'same text':>9}"
    )
    base = statistics.median(r.tokens_per_s for r in host[ns[0]]) if ns[0] == 1 else None
    for n in ns:
        h = statistics.median(r.tokens_per_s for r in host[n])
        nat = statistics.median(native_rates[n])
        speedup = f"{h / base:9.2f}" if base else f"{'-':>9}"
        calls = statistics.median(r.decode_calls for r in host[n])
        print(
            f"{n:>3}  {h:10.1f}  {nat:12.1f}  {h / nat:11.3f}  {speedup}  {calls:11.0f}  "
            f"{same[n]:>4}/{n * args.runs:<4}"
        )
    host_runs = "; ".join(f"N={n}: " + ", ".join(f"{r.tokens_per_s:.0f}" for r in host[n]) for n in ns)
    print("     runs (host): " + host_runs)
    print("     runs (native): " + "; ".join(f"N={n}: " + ", ".join(f"{x:.0f}" for x in native_rates[n]) for n in ns))
    print(f"target: host/native >= 0.9 at N={ns[-1]}")
    print()
    expected = weights + kv_bytes
    process = peak.peak
    net = peak.peak - before_load_rss
    print(f"memory with {ns[-1]} guests running (peak VmRSS, sampled every 2 ms):")
    print(f"  weights (llama_model_size)        {mib(weights)}   (GGUF file {mib(file_size).strip()})")
    kv_label = f"KV cache 2*{n_layer}*{kv_sequences * ctx_size}*{n_embd_kv}*2 B"
    print(f"  {kv_label:<34}{mib(kv_bytes)}   ({kv_sequences} sequences x {ctx_size} tokens, F16)")
    print(f"  weights + KV                      {mib(expected)}")
    print(f"  process RSS before model load     {mib(before_load_rss)}   (at start: {mib(baseline_rss).strip()})")
    print(
        f"  peak RSS                          {mib(process)}   overhead vs weights+KV: "
        f"{(process / expected - 1) * 100:+.1f} %"
    )
    print(
        f"  peak RSS - RSS before model load  {mib(net)}   overhead vs weights+KV: "
        f"{(net / expected - 1) * 100:+.1f} %"
        f"  (target <= +15 %)"
    )
    print()
    t1 = statistics.median(t.first_ms for t in turns)
    t2 = statistics.median(t.second_ms for t in turns)
    print(
        f"prefix reuse, one execution context through the ABI (set_input + compute, n-predict 1), "
        f"median of {args.ttft_runs}:"
    )
    print(
        f"  turn 1: {args.prefix_tokens}-letter prompt        {t1:8.1f} ms to first token  "
        f"(decoded: {', '.join(str(t.first_decoded) for t in turns)} tokens)"
    )
    print(
        f"  turn 2: same + {args.extra_tokens} letters          {t2:8.1f} ms to first token  "
        f"(decoded: {', '.join(str(t.second_decoded) for t in turns)} tokens)"
    )
    print(f"  turn 2 / turn 1: {t2 / t1 * 100:.1f} %  (target <= 15 %)")
    n1 = statistics.median(t for t, _ in native_turn_ms)
    n2 = statistics.median(t for _, t in native_turn_ms)
    print(
        f"  llama.cpp alone (llama_decode + greedy sample): turn 1 {n1:.1f} ms, turn 2 {n2:.2f} ms "
        f"({n2 / n1 * 100:.1f} %); the host's own cost of one compute: {t2 - n2:.2f} ms "
        f"(turn 2 through the ABI less llama.cpp's)"
    )
    print(f"\ntotal time {total_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
