#!/usr/bin/env python3
"""Write the project's deterministic GGUF test models (see ``wasinn_host.testmodels``).

Examples::

    python scripts/tools/make_models.py successor models/successor.gguf
    python scripts/tools/make_models.py successor models/noisy.gguf --logit-gap 1.0
    python scripts/tools/make_models.py random models/random.gguf --layers 4
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from wasinn_host.testing.gguf_models import write_random_model, write_successor_model


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="{successor,random}")

    succ = kinds.add_parser(
        "successor",
        help="hand-built bigram model whose greedy output is known ('a' -> 'bc...z' EOS, '7' -> '8901...')",
        description="Hand-built bigram model: each character predicts its successor "
        "(a..y and A..Y the next letter, z and Z end of sequence, 0..8 the next digit, 9 -> 0, "
        "BOS -> 'a', everything else end of sequence).",
    )
    succ.add_argument("out", type=pathlib.Path, help="path of the GGUF file to write")
    succ.add_argument(
        "--logit-gap",
        type=float,
        default=20.0,
        help="logit of the successor above all others (default 20: deterministic; ~1: random sampling)",
    )
    succ.add_argument("--context-length", type=int, default=512, help="llama.context_length (default 512)")
    succ.add_argument("--layers", type=int, default=1, help="number of (inert) layers (default 1)")
    succ.add_argument("--f16", action="store_true", help="store matrices as F16 instead of F32")

    rand = kinds.add_parser(
        "random",
        help="seeded random-weight llama for benchmarks (default 12 layers, 171 MB F16)",
        description="Seeded random-weight llama for benchmarks; the same options always give the same file.",
    )
    rand.add_argument("out", type=pathlib.Path, help="path of the GGUF file to write")
    rand.add_argument("--layers", type=int, default=12, help="number of layers (default 12)")
    rand.add_argument("--embd", type=int, default=768, help="embedding width (default 768)")
    rand.add_argument("--heads", type=int, default=12, help="attention heads (default 12)")
    rand.add_argument("--ff", type=int, default=2048, help="feed-forward width (default 2048)")
    rand.add_argument("--vocab", type=int, default=512, help="vocabulary size, at least 354 (default 512)")
    rand.add_argument("--context-length", type=int, default=2048, help="llama.context_length (default 2048)")
    rand.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    rand.add_argument("--f32", action="store_true", help="store matrices as F32 instead of F16")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    if args.kind == "successor":
        path = write_successor_model(
            args.out,
            context_length=args.context_length,
            logit_gap=args.logit_gap,
            n_layer=args.layers,
            f16=args.f16,
        )
    else:
        path = write_random_model(
            args.out,
            n_layer=args.layers,
            n_embd=args.embd,
            n_head=args.heads,
            n_ff=args.ff,
            n_vocab=args.vocab,
            context_length=args.context_length,
            seed=args.seed,
            f16=not args.f32,
        )
    size_mb = path.stat().st_size / 1e6
    print(f"wrote {path} ({size_mb:.1f} MB) in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
