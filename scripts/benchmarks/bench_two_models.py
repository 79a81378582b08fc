"""Benchmark: one model's speed once a second model of the same process has computed.

Each loaded model has its own worker thread, and with llama-cpp-python's OpenMP build each such thread
gets its own team of llama.cpp threads; once the process holds more OpenMP threads than CPUs, GNU OpenMP
sleeps at a barrier after 100 spins, and llama.cpp meets at a barrier after every graph node
(``wasinn_host/llama/openmp.py``).  In a fresh process per arm, ``guest_examples/complete.wasm`` generates
``--tokens`` greedy tokens on the first model (SmolLM2 by default) ``--runs`` times, then one guest
computes 4 tokens on the second model (a generated tiny random model), then the first model's runs again;
it prints the median tokens/s (after the first token) before and after, and their ratio.  Arms:

* **host defaults**: as a user gets them (the host sets libgomp's wait policy while loading llama.cpp);
* **libgomp defaults**: ``GOMP_SPINCOUNT=300000`` preset, which is libgomp's own default and makes the
  host leave both settings alone: what the host did before.

The arms alternate ``--rounds`` times.  Target: after / before >= 0.9 with the host's defaults.

Usage: ``python scripts/benchmarks/bench_two_models.py [--model smollm2|gemma3|M.gguf] [--tokens 128]
[--runs 3] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"
ARMS = {"host defaults": {}, "libgomp defaults": {"GOMP_SPINCOUNT": "300000"}}


def arm(model: str, tokens: int, runs: int) -> dict[str, list[float]]:
    """One arm, in this (fresh) process: tokens/s of the first model before and after the second computed."""
    from guests_together import run_together

    from wasinn_host import ModelRegistry, WasiNN
    from wasinn_host.testing.gguf_models import write_random_model
    from wasinn_host.testing.real_models import model_file

    with tempfile.TemporaryDirectory() as tmp:
        second = write_random_model(Path(tmp) / "tiny.gguf", n_layer=2, n_embd=256, n_head=4, n_ff=512, n_vocab=32000)
        nn = WasiNN(registry=ModelRegistry([f"a:GGML:AUTO:{model_file(model)}", f"b:GGML:AUTO:{second}"]))
        module = nn.load_module(ROOT / "guest_examples" / "complete.wasm")
        config: dict[str, object] = {"temp": 0, "n-predict": tokens, "ignore-eos": True, "cache-prompt": False}

        def speed() -> float:
            return float(run_together(nn, module, "a", [PROMPT], config).metas[0]["tokens_per_second"])

        speed()  # load, warm up
        before = [speed() for _ in range(runs)]
        run_together(nn, module, "b", ["hello"], dict(config, **{"n-predict": 4}))
        after = [speed() for _ in range(runs)]
        nn.registry.close()
    return {"before": before, "after": after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="the first model: smollm2, gemma3 or a GGUF path")
    parser.add_argument("--tokens", type=int, default=128, help="tokens a run generates (default 128)")
    parser.add_argument("--runs", type=int, default=3, help="runs before and after, per round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two arms (default 3)")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.model, args.tokens, args.runs)))
        return 0
    results: dict[str, dict[str, list[float]]] = {name: {"before": [], "after": []} for name in ARMS}
    for r in range(args.rounds):
        for name in list(ARMS) if r % 2 == 0 else list(ARMS)[::-1]:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            done = subprocess.run(
                [sys.executable, __file__, "--arm", name, "--model", args.model]
                + ["--tokens", str(args.tokens), "--runs", str(args.runs)],
                env={**env, **ARMS[name]},
                capture_output=True,
                text=True,
                check=True,
            )
            one = json.loads(done.stdout.strip().splitlines()[-1])
            for key in ("before", "after"):
                results[name][key] += one[key]
    print(
        f"first model {args.model}, second a tiny random model; {args.tokens} tokens, "
        f"medians of {args.rounds} x {args.runs}"
    )
    for name, res in results.items():
        before, after = statistics.median(res["before"]), statistics.median(res["after"])
        print(
            f"  {name:<17} alone {before:7.1f} tok/s (runs {min(res['before']):.0f}-{max(res['before']):.0f}); "
            f"after the second model computed {after:7.1f} ({min(res['after']):.0f}-{max(res['after']):.0f}); "
            f"after/before {after / before:.3f}" + ("  (target >= 0.9)" if name == "host defaults" else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
