"""Start-up of ``wasinn run`` and the warm start of ``--nn-prompt-cache``, as a user meets them.

1. **Start-up**: the wall time of ``wasinn run guest_examples/complete.wasm`` on the successor test model
   (one short completion), median of ``--runs`` runs, each a new process; and the time to import
   ``wasinn_host.cli`` alone (``python -X importtime``'s cumulative figure, median).
2. **Warm start**: a guest whose prompt starts with a ``--system-tokens`` system prompt (2,000 by
   default), run twice per trial with a fresh cache directory: the first run decodes it and saves it,
   the second restores it.  Time to first token is the ``prompt_ms`` the guest prints (the host's time
   from the compute call to the first token's logits, prefix restore included); the ratio is
   second / first, median of ``--runs`` trials.  The greedy outputs of both runs must be identical.
   The warm-start model is a seeded random llama (6 layers, d=512, F16) built here, whose prompt
   processing costs what a small real model's does; ``--model`` takes another GGUF.

Run it on an idle machine: ``python scripts/benchmarks/bench_startup.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from wasinn_host.testing.gguf_models import write_random_model, write_successor_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUEST = "guest_examples/complete.wasm"
SYSTEM = "You are a helpful assistant. Keep every answer short, exact and polite. "


def wasinn_run(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """One ``wasinn run`` in a new process: its wall time and result."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "run", *args],
        capture_output=True,
        text=True,
        errors="replace",
        cwd=ROOT,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"wasinn run failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    return elapsed, result


def import_ms() -> float:
    """Cumulative microseconds of ``import wasinn_host.cli`` as ``-X importtime`` reports them, in ms."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import wasinn_host.cli"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    line = next(line for line in result.stderr.splitlines() if line.rstrip().endswith("| wasinn_host.cli"))
    return int(line.split("|")[1]) / 1000.0


def startup(models: pathlib.Path, runs: int) -> None:
    successor = write_successor_model(models / "successor.gguf")
    args = ("--nn-preload", f"default:GGML:AUTO:{successor}", "--env", "n_predict=3", GUEST, "default", "abc")
    wasinn_run(*args)  # warm the page cache and the compile cache
    walls = [wasinn_run(*args)[0] for _ in range(runs)]
    imports = [import_ms() for _ in range(runs)]
    print(f"start-up: wasinn run {GUEST} (successor model): median {statistics.median(walls):.3f} s wall ", end="")
    print(f"(min {min(walls):.3f}, max {max(walls):.3f}; {runs} runs)")
    print(f"start-up: import wasinn_host.cli: median {statistics.median(imports):.0f} ms")


def system_prompt(tokens: int) -> str:
    """About ``tokens`` tokens of text in the test models' character vocabulary (one token a character)."""
    return (SYSTEM * (tokens // len(SYSTEM) + 1))[: tokens - 1]


def metadata(result: subprocess.CompletedProcess[str]) -> dict[str, float]:
    """The output metadata the guest prints last on stderr (``prompt_ms``, ``reused_tokens``...)."""
    return dict(json.loads(result.stderr.strip().splitlines()[-1]))


def warm_start(model: pathlib.Path, runs: int, system_tokens: int) -> None:
    prompt = system_prompt(system_tokens) + " Question: what is 2+3?"
    ctx = str(max(2048, system_tokens + 512))
    ratios, colds, warms = [], [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            args = ("--nn-prompt-cache", cache, "--nn-preload", f"default:GGML:AUTO:{model}")
            env = ("--env", "temp=0", "--env", "n_predict=16", "--env", f"ctx_size={ctx}")
            _, cold = wasinn_run(*args, *env, GUEST, "default", prompt)
            _, warm = wasinn_run(*args, *env, GUEST, "default", prompt)
        if cold.stdout != warm.stdout:
            raise SystemExit(f"warm start changed the output: {cold.stdout!r} != {warm.stdout!r}")
        cold_meta, warm_meta = metadata(cold), metadata(warm)
        if warm_meta["reused_tokens"] == 0:
            raise SystemExit("the second run restored nothing from the prompt cache")
        colds.append(cold_meta["prompt_ms"])
        warms.append(warm_meta["prompt_ms"])
        ratios.append(warm_meta["prompt_ms"] / cold_meta["prompt_ms"])
    print(
        f"warm start: {model.name}, prompt of {int(cold_meta['input_tokens'])} tokens, "
        f"{int(warm_meta['reused_tokens'])} restored; greedy output identical"
    )
    print(
        f"warm start: time to first token {statistics.median(colds):.0f} ms cold, {statistics.median(warms):.0f} ms "
        f"warm: ratio {statistics.median(ratios):.3f} (median of {runs}; target <= 0.15)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs (and warm-start trials) per figure (default 5)")
    parser.add_argument("--system-tokens", type=int, default=2000, help="tokens of the system prompt (default 2000)")
    parser.add_argument(
        "--model", type=pathlib.Path, help="GGUF for the warm start (default: a random model built here)"
    )
    parser.add_argument("--skip-startup", action="store_true", help="only the warm start")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        models = pathlib.Path(folder)
        if not ns.skip_startup:
            startup(models, ns.runs)
        model = ns.model or write_random_model(
            models / "random.gguf",
            n_layer=6,
            n_embd=512,
            n_head=8,
            n_ff=1408,
            context_length=max(2048, ns.system_tokens + 512),
            logit_std=8.0,
        )
        warm_start(model, ns.runs, ns.system_tokens)


if __name__ == "__main__":
    main()
