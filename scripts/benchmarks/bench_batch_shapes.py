"""Benchmark: what llama.cpp alone charges for the batch shapes of a step under mixed load.

One context of ``--seqs`` (8) sequences x ``--cells`` (4,096) cells each, one KV stream per sequence
(``kv_unified`` off, as the host makes it), llama-cpp-python's low-level API, the mixed-load
benchmark's model (random F16 llama, 12 layers).  The last sequence holds a ``--prefix`` (2,000)-token
prompt prefix, the others a 48-token stream history.  At that position each shape is decoded
``--repeat`` (3) times (its cells dropped again after each) and the minimum printed:

- ``S`` stream tokens (one for each of the other sequences), alone;
- ``P`` prompt tokens of the last sequence, alone;
- ``P + S`` in one ``llama_decode`` (llama.cpp splits it: with one stream per sequence, ``split_equal``
  takes the streams' tokens and the prompt's first in one ubatch, the prompt's other ``P - 1`` in a
  second);
- ``P + S`` as two ``llama_decode`` calls (streams, then prompt): what the host's split steps do.

For flash attention ``auto`` (on, on a CPU) and ``off``.  Usage: ``python
scripts/benchmarks/bench_batch_shapes.py [--prompts 16,63,64,65,128] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

from wasinn_host.llama.log import init_backend
from wasinn_host.testing.gguf_models import write_random_model


class Shapes:
    """One context and its batch, with the prefixes decoded."""

    def __init__(self, model: object, args: argparse.Namespace, flash: int) -> None:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = args.cells * args.seqs
        cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_seq_max = args.seqs
        cparams.n_threads = cparams.n_threads_batch = args.threads
        cparams.kv_unified = False
        cparams.flash_attn_type = flash
        self.ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not self.ctx:
            raise SystemExit("llama.cpp could not create the context")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.rng = random.Random(1)
        self.seqs = args.seqs
        self.lengths = [48] * (args.seqs - 1) + [args.prefix]
        for seq, length in enumerate(self.lengths):
            for start in range(0, length, 512):
                count = min(512, length - start)
                self.fill([(seq, start + i) for i in range(count)])
                self.decode()

    def fill(self, items: list[tuple[int, int]]) -> None:
        for i, (seq, pos) in enumerate(items):
            b = self.batch
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = self.rng.randrange(300, 500), pos, 1, True
            b.seq_id[i][0] = seq
        self.batch.n_tokens = len(items)

    def decode(self) -> None:
        rc = llama_cpp.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    def stream_items(self, n: int) -> list[tuple[int, int]]:
        return [(seq, self.lengths[seq]) for seq in range(n)]

    def prompt_items(self, n: int) -> list[tuple[int, int]]:
        last = self.seqs - 1
        return [(last, self.lengths[last] + i) for i in range(n)]

    def timed(self, calls: list[list[tuple[int, int]]], repeat: int) -> float:
        """Minimum ms over ``repeat`` of decoding ``calls`` one after another (cells dropped after)."""
        best = float("inf")
        for _ in range(repeat):
            began = time.perf_counter()
            for items in calls:
                self.fill(items)
                self.decode()
            best = min(best, time.perf_counter() - began)
            for seq, length in enumerate(self.lengths):
                llama_cpp.llama_memory_seq_rm(self.memory, seq, length, -1)
        return best * 1000.0

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="16,63,64,65,128", help="prompt chunk sizes (default 16,63,64,65,128)")
    parser.add_argument("--seqs", type=int, default=8, help="sequences (default 8: 7 streams and a prompt)")
    parser.add_argument("--cells", type=int, default=4096, help="cells per sequence (default 4096)")
    parser.add_argument("--prefix", type=int, default=2000, help="prompt tokens already decoded (default 2000)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="decodes per shape, minimum printed (default 3)")
    parser.add_argument("--model", help="a GGUF file (default: the mixed-load benchmark's random model)")
    args = parser.parse_args()
    init_backend()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or str(write_random_model(Path(tmp) / "random.gguf", context_length=4096))
        mparams = llama_cpp.llama_model_default_params()
        model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        streams = args.seqs - 1
        print(
            f"{args.seqs} sequences x {args.cells} cells, prompt at {args.prefix}, {streams} streams, "
            f"ms (min of {args.repeat})"
        )
        print(
            f"{'flash attn':<10} {'P':>4} {'S alone':>8} {'P alone':>8} {'P+S one':>8} {'P+S two':>8} {'one/apart':>9}"
        )
        for label, flash in (
            ("auto", llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO),
            ("off", llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED),
        ):
            shapes = Shapes(model, args, flash)
            s = shapes.stream_items(streams)
            alone_s = shapes.timed([s], args.repeat)
            for n in (int(x) for x in args.prompts.split(",")):
                p = shapes.prompt_items(n)
                alone_p = shapes.timed([p], args.repeat)
                one = shapes.timed([s + p], args.repeat)
                two = shapes.timed([s, p], args.repeat)
                print(
                    f"{label:<10} {n:>4} {alone_s:8.1f} {alone_p:8.1f} {one:8.1f} {two:8.1f} "
                    f"{one / (alone_s + alone_p):9.2f}",
                    flush=True,
                )
            shapes.close()
        llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
