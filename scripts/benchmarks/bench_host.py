"""Benchmark: one model driven through a wasm guest and directly with llama-cpp-python.

In one run, on the same GGUF model, prompt, greedy sampling, thread count and number of
generated tokens, it measures

* **native**: llama-cpp-python's low-level API in a plain decode loop (the reference), in a process of
  its own (``native_process.py``: two OpenMP thread teams in one process slow both);
* **host**: ``guest_examples/complete.wasm`` run through :class:`wasinn_host.WasiNN`
  (model already loaded; each run includes instantiating the guest);

and prints tokens/s of each and their ratio (target >= 0.97).  It also measures the
per-call cost of a cheap import, a 64-byte ``get_output`` called in a loop from wasm
(target <= 10 us), and the **cost of a grammar**: greedy generation under a JSON schema
against unconstrained generation of the same model, as generated tokens/s after the prompt
(target >= 0.8), through the host (a Python session) and natively with llama.cpp's
grammar-first chain (what every token cost before); and the same at the default temperature through the host,
where llama.cpp's ``common_sampler`` order (the chain draws, the grammar checks that one token) applies.

Usage: ``python scripts/benchmarks/bench_host.py [--model smollm2|gemma3|M.gguf] [--tokens 256] [--threads 2]
[--runs 3]`` (without ``--model`` a random 12-layer F16 model is generated in a temp dir; ``smollm2``
and ``gemma3`` are the real models of :mod:`wasinn_host.testing.real_models`, fetched once).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

import llama_cpp
import wasmtime
from native_process import native

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.core.config.keys import EMPTY_CONFIG
from wasinn_host.ephemeral.execution import ExecutionContext
from wasinn_host.llama import cpu_probe
from wasinn_host.llama.json_schema import schema_to_grammar
from wasinn_host.testing.gguf_models import write_random_model, write_successor_model
from wasinn_host.testing.real_models import model_file

ROOT = Path(__file__).resolve().parents[2]

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def native_tokens_per_s(
    model_path: Path, n_tokens: int, threads: int, n_ctx: int, grammar: str = "", prompt: str = PROMPT
) -> float:
    """Greedy generation of ``n_tokens`` after ``prompt`` with a raw llama_decode loop (with ``grammar``:
    a grammar-first chain, stopping at end of generation, timed after the prompt)."""
    llama_cpp.llama_backend_init()
    cpu_probe.prepare_for_file(model_path)  # the host's safe CPU layouts (AMX off where it crashes)
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
    vocab = llama_cpp.llama_model_get_vocab(model)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_threads, cparams.n_threads_batch = n_ctx, 512, threads, threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if grammar:
        llama_cpp.llama_sampler_chain_add(
            sampler, llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        )
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
    text = prompt.encode()
    buf = (llama_cpp.llama_token * (len(text) + 8))()
    n_prompt = llama_cpp.llama_tokenize(vocab, text, len(text), buf, len(buf), True, True)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    piece = ctypes.create_string_buffer(64)
    memory = llama_cpp.llama_get_memory(ctx)

    def decode(tokens: list[int], start: int) -> None:
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        assert llama_cpp.llama_decode(ctx, batch) == 0

    started = time.perf_counter()
    llama_cpp.llama_memory_clear(memory, True)
    decode(list(buf[:n_prompt]), 0)
    if grammar:
        started = time.perf_counter()
    pos = n_prompt
    out = bytearray()
    generated = 0
    for _ in range(n_tokens):
        tok = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
        n = llama_cpp.llama_token_to_piece(vocab, tok, piece, 64, 0, True)
        out += piece.raw[:n]
        generated += 1
        if grammar and llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        decode([tok], pos)
        pos += 1
    elapsed = time.perf_counter() - started
    llama_cpp.llama_sampler_free(sampler)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return generated / elapsed


def host_tokens_per_s(nn: WasiNN, n_tokens: int, threads: int, n_ctx: int, workdir: Path) -> float:
    config = {
        "n-predict": n_tokens,
        "temp": 0,
        "ignore-eos": True,
        "threads": threads,
        "ctx-size": n_ctx,
        "n-parallel": 1,
        "batch-size": 512,
    }
    options = RunOptions(
        env={"WASINN_CONFIG": json.dumps(config)}, stdout=str(workdir / "out.txt"), stderr=str(workdir / "err.txt")
    )
    started = time.perf_counter()
    code = nn.run(ROOT / "guest_examples" / "complete.wasm", ["bench", PROMPT], options)
    elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"guest failed: {(workdir / 'err.txt').read_text()}")
    return n_tokens / elapsed


GET_OUTPUT_LOOP_WAT = """
(module
  (import "wasi_ephemeral_nn" "get_output" (func $get_output (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "loop") (param $ctx i32) (param $index i32) (param $n i32) (result i32)
    (local $rc i32)
    (block $done (loop $again
      (local.set $rc (call $get_output (local.get $ctx) (local.get $index) (i32.const 1024) (i32.const 1024)
                                       (i32.const 16)))
      (br_if $done (i32.ne (local.get $rc) (i32.const 0)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $again (i32.gt_s (local.get $n) (i32.const 0)))))
    (local.get $rc)))
"""


def get_output_cost_us(nn: WasiNN, calls: int, index: int = 0) -> float:
    """Microseconds per get_output called from a wasm loop: index 0 is 64 bytes of text, index 1 the
    metadata JSON of a context that has computed."""
    assert nn.local is not None
    graph = nn.local.load_by_name("succ", EMPTY_CONFIG)
    inner = graph.open_context()
    inner.set_prompt(b"a")
    inner.generate()
    inner.output = bytearray(b"x" * 64)
    linker = wasmtime.Linker(nn.engine)
    nn.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    state = nn.imports.attach(store)
    state.contexts[0] = ExecutionContext(graph, inner)
    instance = linker.instantiate(store, wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(GET_OUTPUT_LOOP_WAT))))
    loop = instance.exports(store)["loop"]
    assert isinstance(loop, wasmtime.Func)
    loop(store, 0, index, 1000)
    started = time.perf_counter()
    rc = loop(store, 0, index, calls)
    elapsed = time.perf_counter() - started
    assert rc == 0
    nn.detach(store)
    graph.close()
    return elapsed / calls * 1e6


SAMPLED_SEED = 7
"""The seed of the grammar figures at the default temperature (0.8, top-k 40, top-p 0.95, min-p 0.05)."""
GRAMMAR_PROMPT = "A JSON list of ten famous scientists, with their field, birth year and three discoveries:\n"
GRAMMAR_SCHEMA = {
    "type": "array",
    "minItems": 10,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "field": {"type": "string"},
            "born": {"type": "integer"},
            "discoveries": {"type": "array", "items": {"type": "string"}, "minItems": 3},
        },
        "required": ["name", "field", "born", "discoveries"],
    },
}


def session_tokens_per_s(nn: WasiNN, config: Mapping[str, object]) -> tuple[float, int]:
    """Generated tokens/s after the prompt (the output metadata's figure) and the tokens generated."""
    with nn.session("bench", config) as session:
        session.complete(GRAMMAR_PROMPT)
        meta = session.metadata
    return float(meta["tokens_per_second"]), int(meta["output_tokens"])


def grammar_cost(nn: WasiNN, model: Path, n_tokens: int, threads: int, n_ctx: int, runs: int) -> list[str]:
    """Lines reporting JSON-schema generation against unconstrained generation: through the host greedy and
    at the default temperature (seed 7), and natively with a greedy grammar-first chain."""
    base = {"threads": threads, "ctx-size": n_ctx, "n-parallel": 1, "batch-size": 512, "n-predict": n_tokens}
    schema = {"json-schema": json.dumps(GRAMMAR_SCHEMA)}
    free_greedy = {**base, "temp": 0, "ignore-eos": True}
    free_sampled = {**base, "seed": SAMPLED_SEED, "ignore-eos": True}
    gbnf = schema_to_grammar(json.dumps(GRAMMAR_SCHEMA))
    rates: dict[str, list[float]] = {key: [] for key in ("free", "greedy", "free_t", "sampled", "nf", "nc")}
    counts = {"greedy": 0, "sampled": 0}
    for _ in range(runs):  # interleaved, so drift affects all alike
        rates["free"].append(session_tokens_per_s(nn, free_greedy)[0])
        rate, counts["greedy"] = session_tokens_per_s(nn, {**free_greedy, "ignore-eos": False, **schema})
        rates["greedy"].append(rate)
        rates["free_t"].append(session_tokens_per_s(nn, free_sampled)[0])
        rate, counts["sampled"] = session_tokens_per_s(nn, {**free_sampled, "ignore-eos": False, **schema})
        rates["sampled"].append(rate)
        rates["nf"].append(native(native_tokens_per_s, model, n_tokens, threads, n_ctx, prompt=GRAMMAR_PROMPT))
        rates["nc"].append(native(native_tokens_per_s, model, n_tokens, threads, n_ctx, gbnf, GRAMMAR_PROMPT))
    m = {key: statistics.median(values) for key, values in rates.items()}
    return [
        "json-schema generation vs unconstrained, tokens/s after the prompt (target >= 0.8):",
        f"  {'host, greedy':<34}: {m['greedy']:8.1f} vs {m['free']:8.1f}  ratio {m['greedy'] / m['free']:6.3f}"
        f"  ({counts['greedy']} vs {n_tokens} tokens)",
        f"  {f'host, temp 0.8 (seed {SAMPLED_SEED})':<34}: {m['sampled']:8.1f} vs {m['free_t']:8.1f}"
        f"  ratio {m['sampled'] / m['free_t']:6.3f}  ({counts['sampled']} vs {n_tokens} tokens;"
        f" runs {', '.join(f'{x:.1f}' for x in rates['sampled'])})",
        f"  {'native greedy, grammar-first chain':<34}: {m['nc']:8.1f} vs {m['nf']:8.1f}"
        f"  ratio {m['nc'] / m['nf']:6.3f}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        help="smollm2, gemma3 (real models, fetched once) or a GGUF path "
        "(default: a generated random 12-layer F16 model)",
    )
    parser.add_argument("--tokens", type=int, default=256, help="tokens generated per run (default 256)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads for both (default 2)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each; the median is reported (default 3)")
    parser.add_argument("--calls", type=int, default=200_000, help="get_output calls timed (default 200000)")
    parser.add_argument("--no-grammar", action="store_true", help="skip the grammar cost measurement")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = model_file(args.model) if args.model else write_random_model(workdir / "random.gguf")
        successor = write_successor_model(workdir / "successor.gguf")
        n_ctx = 512 + 64
        nn = WasiNN(preload=[f"bench:GGML:AUTO:{model}", f"succ:GGML:AUTO:{successor}"], registry=ModelRegistry())
        host_tokens_per_s(nn, 8, args.threads, n_ctx, workdir)  # load the model, warm up
        native(native_tokens_per_s, model, 8, args.threads, n_ctx)
        reference, host = [], []
        for _ in range(args.runs):  # interleaved, so drift affects both alike
            reference.append(native(native_tokens_per_s, model, args.tokens, args.threads, n_ctx))
            host.append(host_tokens_per_s(nn, args.tokens, args.threads, n_ctx, workdir))
        cost = get_output_cost_us(nn, args.calls)
        metadata_cost = get_output_cost_us(nn, args.calls, index=1)
        grammar = [] if args.no_grammar else grammar_cost(nn, model, args.tokens, args.threads, n_ctx, args.runs)
        nn.registry.close()
    n, h = statistics.median(reference), statistics.median(host)
    print(
        f"model: {model.name if args.model else 'random 12-layer F16 (generated)'}; "
        f"{args.tokens} tokens, greedy, {args.threads} threads, median of {args.runs}"
    )
    print(
        f"native llama-cpp-python decode loop : {n:8.1f} tokens/s  (runs: {', '.join(f'{x:.1f}' for x in reference)})"
    )
    print(f"guest through wasinn-host          : {h:8.1f} tokens/s  (runs: {', '.join(f'{x:.1f}' for x in host)})")
    print(f"ratio host/native                  : {h / n:8.3f}  (target >= 0.97)")
    print(f"get_output (64 bytes) per call     : {cost:8.2f} us  (target <= 10)")
    print(f"get_output (metadata) per call     : {metadata_cost:8.2f} us  (target <= 10)")
    for line in grammar:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
