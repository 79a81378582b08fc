"""Benchmark: concurrent chats through one instance of a server guest against N instances on one address.

A server guest built for WasmEdge answers one request at a time, so C concurrent clients of one
instance get the tokens/s of one sequence; ``wasinn run --instances N`` runs N instances that share
the guest's address (:mod:`wasinn_host.sockets.shared`), and their computes are batched on the one
model.  This script starts ``wasinn run [--instances N] guest_examples/chat_server.wasm`` as a user
does, sends ``--clients`` concurrent clients ``--chats`` chats each (``n_predict`` tokens, end of
generation ignored so every chat makes the same number), and prints the aggregate generated tokens/s
(the server's ``--status`` count over the clients' wall time) and the median chat latency, per N,
with the ratio against N = 1.  Arms alternate; medians of ``--runs`` runs with the spread.

Usage: ``python scripts/benchmarks/bench_instances.py --model M.gguf [--n 1,8] [--clients 8] [--chats 3]
[--tokens 64] [--runs 5]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER = ROOT / "guest_examples" / "chat_server.wasm"
WAIT = 600.0


def run_once(model: str, instances: int, clients: int, chats: int, tokens: int) -> tuple[float, float, float]:
    """One run: (aggregate generated tokens/s, median chat seconds, sequences per decode)."""
    config = json.dumps({"n-predict": tokens, "ignore-eos": True})
    command = [sys.executable, "-m", "wasinn_host", "run", "--status", "--instances", str(instances)]
    command += ["--env", f"WASINN_CONFIG={config}", "--nn-preload", f"default:GGML:AUTO:{model}"]
    command += [str(SERVER), "default", "127.0.0.1", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(instances)]
    port = int(lines[0].rsplit(":", 1)[1])
    latencies: list[float] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        for chat in range(chats):
            start = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=f"chat {index} {chat}: tell me a story".encode())
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            with lock:
                latencies.append(time.perf_counter() - start)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    for _ in range(instances):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        conn.request("POST", "/quit")
        conn.getresponse().read()
        conn.close()
    _, err = proc.communicate(timeout=WAIT)
    status = json.loads(err.strip().splitlines()[-1])
    generated = status["performance"]["generated_tokens"]
    assert generated == clients * chats * tokens, (generated, clients * chats * tokens)
    per_decode = status["models"][0]["sequences_per_decode"]
    return generated / wall, statistics.median(latencies), per_decode


def main() -> None:
    """Run the arms alternately and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--n", default="1,8")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    arms = [int(n) for n in args.n.split(",")]
    results: dict[int, list[tuple[float, float, float]]] = {n: [] for n in arms}
    for run in range(args.runs):
        for n in arms if run % 2 == 0 else reversed(arms):
            results[n].append(run_once(args.model, n, args.clients, args.chats, args.tokens))
            rate, chat, per_decode = results[n][-1]
            print(
                f"run {run} instances {n}: {rate:.1f} tok/s, chat {chat:.2f} s, {per_decode} sequences/decode",
                flush=True,
            )
    base = statistics.median(r[0] for r in results[arms[0]])
    print(f"\n{args.clients} clients x {args.chats} chats x {args.tokens} tokens, model {args.model}")
    for n in arms:
        rates = [r[0] for r in results[n]]
        chats = [r[1] for r in results[n]]
        rate = statistics.median(rates)
        print(
            f"instances {n:>2}: {rate:7.1f} tok/s (min {min(rates):.1f}, max {max(rates):.1f}), "
            f"chat median {statistics.median(chats):.2f} s, x{rate / base:.2f} of instances {arms[0]}"
        )


if __name__ == "__main__":
    main()
