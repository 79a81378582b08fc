#!/usr/bin/env python3
"""Fuzz the ``wasi_ephemeral_nn`` imports for longer than the CI test does.

Runs the hypothesis state machine of ``wasinn_host/testing/fuzz/abi.py`` (the same one ``tests/ephemeral/test_fuzz.py``
runs) and prints the calls made, the errno histogram per import and the elapsed time.

    python scripts/tools/fuzz_abi.py --examples 400 --steps 60 --seed 1
    python scripts/tools/fuzz_abi.py --examples 50 --steps 40            # derandomized, like CI

On a failure hypothesis prints the shrunk call sequence and the script exits with status 1.
``--wide-models`` draws the model bytes for ``load`` freely (truncations and corruptions anywhere)
instead of from a fixed catalogue; the host checks every new GGUF-looking blob in a child process
(about 0.5 s each), so such runs make fewer calls per second.  A call that hangs makes the per-call
watchdog dump every thread's stack and exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import tempfile
import time
import traceback
from typing import Any

from wasinn_host.testing.fuzz.abi import run_fuzz
from wasinn_host.testing.fuzz.abi_env import make_env


class _TextOnly:
    """stdout for hypothesis' reports, with the byte stream (what stream-stdout writes) discarded."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self.buffer = open(os.devnull, "wb")

    def write(self, text: str) -> int:
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=200, help="hypothesis examples (one fresh Store each)")
    parser.add_argument("--steps", type=int, default=50, help="rule steps per example")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, as in CI)")
    parser.add_argument(
        "--models",
        type=pathlib.Path,
        default=None,
        help="directory for the generated test models (default: a temporary one)",
    )
    parser.add_argument(
        "--wide-models",
        action="store_true",
        help="random truncations/corruptions of the model for load (slower: each is checked in a child)",
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=120.0,
        help="seconds one call may take before the watchdog dumps stacks and exits",
    )
    parser.add_argument(
        "--show-stdout",
        action="store_true",
        help="let stream-stdout output through (default: sent to /dev/null while fuzzing)",
    )
    parser.add_argument("--no-shrink", action="store_true", help="report a failure as found, without shrinking it")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        model_dir = args.models or pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wasinn-fuzz-")))
        env = make_env(model_dir, wide_models=args.wide_models, call_timeout=args.call_timeout)
        print(
            f"fuzzing: {args.examples} examples x {args.steps} steps, seed "
            f"{'derandomized' if args.seed is None else args.seed}",
            flush=True,
        )
        started = time.perf_counter()
        failed = False
        try:
            if not args.show_stdout:  # stream-stdout: true writes generated text to sys.stdout.buffer
                stack.enter_context(contextlib.redirect_stdout(_TextOnly(sys.stdout)))
            run_fuzz(env, args.examples, args.steps, seed=args.seed, shrink=not args.no_shrink)
        except Exception:
            failed = True
            traceback.print_exc()
        elapsed = time.perf_counter() - started
        print(env.stats.report())
        print(f"elapsed: {elapsed:.1f} s ({env.stats.calls / max(elapsed, 1e-9):.0f} calls/s)")
        print("FAILED" if failed else "OK")
        env.registry.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
