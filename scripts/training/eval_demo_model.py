"""Held-out evaluation of the embedded demo model, per ChatML spelling (variant).

By default through llama.cpp directly (fast); with ``--through-guest`` every problem runs
``guest_examples/complete.wasm`` through the host, as a user's guest would.

Usage::

    python scripts/training/eval_demo_model.py [--model wasinn_host/models/demo-arith.gguf] [-n 1000]
        [--seed 7] [--variant NAME ...] [--through-guest]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from collections.abc import Sequence

from wasinn_host import RunOptions, WasiNN
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.demo_data import VARIANTS, eval_gguf, make_problems

ROOT = pathlib.Path(__file__).resolve().parents[2]


def guest_answers(model: pathlib.Path, problems: Sequence[tuple[str, str]]) -> list[str]:
    """Greedy answers (end token stripped) of ``complete.wasm`` run through the host for each prompt."""
    nn = WasiNN(preload=[f"default:GGML:AUTO:{model}"])
    module = nn.load_module(ROOT / "guest_examples" / "complete.wasm")
    answers = []
    with tempfile.TemporaryDirectory() as tmp:
        out, err = pathlib.Path(tmp) / "out", pathlib.Path(tmp) / "err"
        for prompt, _ in problems:
            options = RunOptions(env={"temp": "0", "n_predict": "8"}, stdout=str(out), stderr=str(err))
            if nn.run(module, ["default", prompt], options) != 0:
                raise SystemExit(f"the guest failed: {err.read_text()}")
            answers.append(out.read_text().removesuffix("\n").removesuffix("<|im_end|>"))
    nn.registry.close()
    return answers


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate each variant and print its accuracy; exit 1 if a variant is below ``--target``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=pathlib.Path, default=DEMO_MODEL_PATH)
    ap.add_argument("-n", type=int, default=1000, help="held-out problems per variant")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="only these (repeatable)")
    ap.add_argument("--through-guest", action="store_true", help="run complete.wasm through the host per problem")
    ap.add_argument("--target", type=float, default=0.97, help="accuracy every variant must reach")
    ap.add_argument("--show", type=int, default=3, help="print this many wrong answers per variant")
    args = ap.parse_args(argv)
    failed = False
    for name in args.variant or list(VARIANTS):
        problems = make_problems(args.n, args.seed, VARIANTS[name])
        started = time.perf_counter()
        if args.through_guest:
            answers = guest_answers(args.model, problems)
        else:
            answers = eval_gguf(args.model, problems, threads=args.threads).outputs
        correct = sum(a == expected for a, (_, expected) in zip(answers, problems))
        accuracy = correct / len(problems)
        failed |= accuracy < args.target
        print(f"{name:<28} {accuracy:7.2%} ({correct}/{len(problems)}) in {time.perf_counter() - started:.1f}s")
        wrong = [(p, e, a) for (p, e), a in zip(problems, answers) if a != e][: args.show]
        for prompt, expected, got in wrong:
            print(f"    WRONG: {prompt[-50:]!r} expected {expected!r} got {got!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
