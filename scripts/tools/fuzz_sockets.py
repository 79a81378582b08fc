#!/usr/bin/env python3
"""Fuzz WasmEdge's socket imports for longer than the CI test does.

Runs the hypothesis state machine of ``wasinn_host/testing/fuzz/sockets.py`` (the same one
``tests/sockets/test_socket_fuzz.py`` runs) over one or more seeds and prints the calls made, the errno
histogram per import, the calls that logged a line, waited for the peers or were cancelled, and the
elapsed time.  Everything stays on loopback.

    python scripts/tools/fuzz_sockets.py --examples 500 --steps 60 --seeds 1 2 3
    python scripts/tools/fuzz_sockets.py --examples 25 --steps 30            # derandomized, like CI

On a failure hypothesis prints the shrunk call sequence and the script exits with status 1 (after
the other seeds).  A call that does not return within ``--hard-timeout`` seconds dumps every
thread's stack and exits with status 70.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

from wasinn_host.testing.fuzz.sockets import make_env, run_socket_fuzz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=200, help="hypothesis examples per seed (one fresh guest each)")
    parser.add_argument("--steps", type=int, default=50, help="rule steps per example")
    parser.add_argument(
        "--seeds", type=int, nargs="*", default=None, help="random seeds (default: one derandomized run, as in CI)"
    )
    parser.add_argument(
        "--cancel-after", type=float, default=0.4, help="seconds a blocked call waits before its guest is cancelled"
    )
    parser.add_argument(
        "--hard-timeout", type=float, default=60.0, help="seconds one call may take before stacks are dumped"
    )
    parser.add_argument("--no-shrink", action="store_true", help="report a failure as found, without shrinking it")
    args = parser.parse_args(argv)

    seeds: list[int | None] = list(args.seeds) if args.seeds else [None]
    env = make_env(cancel_after=args.cancel_after, hard_after=args.hard_timeout)
    failures = 0
    started = time.perf_counter()
    try:
        for seed in seeds:
            print(
                f"fuzzing sockets: {args.examples} examples x {args.steps} steps, seed "
                f"{'derandomized' if seed is None else seed}",
                flush=True,
            )
            try:
                run_socket_fuzz(env, args.examples, args.steps, seed=seed, shrink=not args.no_shrink)
            except Exception:
                failures += 1
                traceback.print_exc()
    finally:
        env.close()
    elapsed = time.perf_counter() - started
    print(env.stats.report())
    print(
        f"seeds: {len(seeds)}, failures: {failures}, elapsed: {elapsed:.1f} s "
        f"({env.stats.calls / max(elapsed, 1e-9):.0f} calls/s)"
    )
    print("FAILED" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
