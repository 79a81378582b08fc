"""Benchmark: guests served over WASI-NN RPC against the same guests served in-process.

In one run, on the same GGUF model (default: the generated random 12-layer F16 model, 171 MB),
greedy sampling and thread count, it measures

* **in-process**: ``guest_examples/complete.wasm`` through :class:`wasinn_host.WasiNN`;
* **rpc**: the same guest through ``WasiNN(rpc="unix:...")`` (what ``wasinn run --nn-rpc-uri``
  does) against a ``wasinn serve`` child process with the defaults a user gets;
* **streaming**: ``guest_examples/chat.wasm`` (one ``compute_single`` + ``get_output_single``
  per token, two round trips over RPC) in-process and over RPC;
* the cost of one unary round trip (``GetOutputSingle`` of the metadata, a few hundred bytes);

and prints tokens/s and the ratios rpc/in-process (targets: whole compute >= 0.9, streaming
>= 0.85).  Runs are interleaved so drift affects both sides alike.  The native reference
(llama-cpp-python's own decode loop) is printed too, from the same run.

Usage: ``python scripts/benchmarks/bench_rpc.py [--model M.gguf] [--tokens 128] [--threads 2] [--runs 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from bench_host import PROMPT, native_tokens_per_s
from native_process import native

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.rpc.messages import SESSION_KEY, nn, nn_grpc
from wasinn_host.testing.gguf_models import write_random_model

ROOT = Path(__file__).resolve().parents[2]


def config(tokens: int, threads: int) -> str:
    return json.dumps({"n-predict": tokens, "temp": 0, "ignore-eos": True, "threads": threads, "ctx-size": 576})


def guest_tokens_per_s(nn_host: WasiNN, guest: str, tokens: int, threads: int, workdir: Path) -> float:
    """Tokens/s of one guest run (complete: one compute; chat: one compute_single per token)."""
    stdin = workdir / "stdin.txt"
    stdin.write_text(PROMPT + "\n")
    env = {"WASINN_CONFIG": config(tokens, threads)}
    if guest == "chat":
        env["n_predict"] = str(tokens)
    options = RunOptions(env=env, stdin=str(stdin), stdout=str(workdir / "out.txt"), stderr=str(workdir / "err.txt"))
    started = time.perf_counter()
    args = ["bench", PROMPT] if guest == "complete" else ["bench"]
    code = nn_host.run(ROOT / "guest_examples" / f"{guest}.wasm", args, options)
    elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"{guest} guest failed: {(workdir / 'err.txt').read_text()}")
    return tokens / elapsed


def round_trip_us(target: str, calls: int) -> float:
    """Microseconds per unary call (GetOutputSingle of the metadata JSON) on a computed context."""
    channel = grpc.insecure_channel(target)
    meta = ((SESSION_KEY, "bench-round-trip"),)
    graph = nn_grpc.GraphStub(channel).LoadByNameWithConfig(
        nn.LoadByNameWithConfigRequest(name="bench", config=config(4, 2)), metadata=meta
    )
    ctx = nn_grpc.GraphResourceStub(channel).InitExecutionContext(
        nn.InitExecutionContextRequest(resource_handle=graph.graph_handle), metadata=meta
    )
    stub = nn_grpc.GraphExecutionContextResourceStub(channel)
    tensor = nn.Tensor(dimensions=[3], ty=3, data=b"abc")
    stub.SetInput(nn.SetInputRequest(resource_handle=ctx.ctx_handle, index=0, tensor=tensor), metadata=meta)
    stub.Compute(nn.ComputeRequest(resource_handle=ctx.ctx_handle), metadata=meta)
    request = nn.GetOutputRequest(resource_handle=ctx.ctx_handle, index=1)
    for _ in range(50):
        stub.GetOutputSingle(request, metadata=meta)
    started = time.perf_counter()
    for _ in range(calls):
        stub.GetOutputSingle(request, metadata=meta)
    elapsed = time.perf_counter() - started
    channel.close()
    return elapsed / calls * 1e6


def start_server(model: Path, sock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "wasinn_host.cli", "serve", "--nn-rpc-uri", f"unix:{sock}"]
        + ["--nn-preload", f"bench:GGML:AUTO:{model}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "serving" not in line:
        raise SystemExit(f"wasinn serve did not start: {line}")
    return proc


def fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="GGUF model (default: a generated random 12-layer F16 model)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per run (default 128)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each; the median is reported (default 3)")
    parser.add_argument("--calls", type=int, default=2000, help="unary round trips timed (default 2000)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = args.model or write_random_model(workdir / "random.gguf")
        sock = workdir / "nn.sock"
        server = start_server(model, sock)
        try:
            local = WasiNN(preload=[f"bench:GGML:AUTO:{model}"], registry=ModelRegistry())
            remote = WasiNN(rpc=f"unix:{sock}")
            hosts = {"in-process": local, "rpc": remote}
            for host in hosts.values():  # load the models, warm up
                guest_tokens_per_s(host, "complete", 4, args.threads, workdir)
            results: dict[str, list[float]] = {}
            for _ in range(args.runs):
                results.setdefault("native", []).append(
                    native(native_tokens_per_s, model, args.tokens, args.threads, 576)
                )
                for guest in ("complete", "chat"):
                    for name, host in hosts.items():
                        value = guest_tokens_per_s(host, guest, args.tokens, args.threads, workdir)
                        results.setdefault(f"{guest} {name}", []).append(value)
            cost = round_trip_us(f"unix:{sock}", args.calls)
            remote.close()
            local.close()
        finally:
            server.terminate()
            server.wait(timeout=60)
    med = {key: statistics.median(values) for key, values in results.items()}
    print(
        f"model: {model.name if args.model else 'random 12-layer F16 (generated)'}; {args.tokens} tokens, greedy, "
        f"{args.threads} threads, median of {args.runs}; server: wasinn serve on a unix socket (defaults)"
    )
    for key, values in results.items():
        print(f"{key:28s}: {med[key]:8.1f} tokens/s  (runs: {fmt(values)})")
    whole = med["complete rpc"] / med["complete in-process"]
    stream = med["chat rpc"] / med["chat in-process"]
    print(f"ratio rpc/in-process, compute  : {whole:8.3f}  (target >= 0.9)")
    print(f"ratio rpc/in-process, streaming: {stream:8.3f}  (target >= 0.85)")
    print(f"ratio in-process/native        : {med['complete in-process'] / med['native']:8.3f}")
    print(f"unary round trip (unix socket) : {cost:8.1f} us per call")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
