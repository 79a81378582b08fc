"""Held-out evaluation of the embedded demo model through llama.cpp.

Usage::

    python scripts/training/eval_demo_model.py [--model wasinn_host/models/demo-arith.gguf] [-n 1000] [--seed 7]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.demo_data import eval_gguf, make_problems


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate and print the accuracy; exit 1 if llama.cpp tokenizes differently from the reference."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=pathlib.Path, default=DEMO_MODEL_PATH)
    ap.add_argument("-n", type=int, default=1000, help="number of held-out problems")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--show", type=int, default=5, help="print this many wrong answers")
    args = ap.parse_args(argv)

    problems = make_problems(args.n, args.seed)
    res = eval_gguf(args.model, problems, threads=args.threads)
    shown = 0
    for (prompt, expected), got in zip(problems, res.outputs):
        if got != expected and shown < args.show:
            shown += 1
            print(f"WRONG: {prompt[-60:]!r} expected {expected!r} got {got!r}")
    print(
        f"accuracy {res.accuracy:.4f} ({res.correct}/{res.total}) in {res.seconds:.1f}s; "
        f"tokenizer mismatches: {res.tokenizer_mismatches}"
    )
    return 0 if res.tokenizer_mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
