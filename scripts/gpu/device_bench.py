#!/usr/bin/env python3
"""The GPU recipe's own measurements: a benchmark model of a chosen size, and a model that does not fit.

``model PATH --size S`` writes a seeded random F16 llama model (``small``: the 171 MB benchmark model of
the design notes; ``1b``: about 1.1 B parameters, 2.2 GB, for a real GPU).

``fit PATH`` loads PATH through the host with the AUTO target and a KV cache larger than the GPUs'
free memory (``ctx-size`` x ``n-parallel`` cells costing ``--over`` times that memory), so the host fits
as many layers as the memory holds; then one guest generates ``--tokens`` tokens greedily. It prints one
JSON object: the free memory, the layers chosen and llama.cpp's offload line, tokens/s, and whether the
answer came (no out-of-memory crash). With no GPU (the dry run) the choice is 0 layers and the run says so.
The host's own limit on KV caches (``max_kv_bytes``: half the machine's memory unless set) is raised to
the cache asked for where that is more (the H100 machine: 1.25 x 80 GB of GPU memory against 64 GiB), as
``wasinn run --max-kv-bytes`` would; the part of the cache whose layers stay on the CPU takes host memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
import time

from wasinn_host import Limits, ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams
from wasinn_host.llama import devices
from wasinn_host.llama.model import LlamaModel, model_sizes
from wasinn_host.llama.offload import margin_for
from wasinn_host.observability.log_setup import LLAMA_LOGGER
from wasinn_host.testing.gguf_models import write_random_model

SIZES = {
    "small": {},
    "1b": {"n_layer": 22, "n_embd": 2048, "n_head": 16, "n_ff": 5632, "n_vocab": 32000},
}


class Lines(logging.Handler):
    """Keeps every message logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def fit(path: pathlib.Path, tokens: int, over: float, n_parallel: int) -> dict[str, object]:
    lines = Lines()
    logging.getLogger("wasinn_host").addHandler(lines)  # llama.cpp's logger propagates to it
    for name in ("wasinn_host", LLAMA_LOGGER):
        logging.getLogger(name).setLevel(logging.INFO)
    free = devices.gpu_free_bytes()
    per_cell = model_sizes(path, ModelParams(ctx_size=1, n_parallel=1)).kv_bytes_per_layer
    n_layer = model_sizes(path, ModelParams()).n_layer
    wanted = int(max(free, 1 << 30) * over)  # without a GPU: a 1 GiB cache, to exercise the same path
    ctx_size = max(256, min(1 << 20, wanted // (per_cell * n_layer * n_parallel)))
    kv_bytes = per_cell * n_layer * ctx_size * n_parallel
    limits = Limits(max_kv_bytes=max(Limits().kv_budget(), kv_bytes))  # the default refuses more than half the RAM
    config = {"ctx-size": ctx_size, "n-parallel": n_parallel, "temp": 0, "n-predict": tokens, "ignore-eos": True}
    reg = ModelRegistry([f"big:GGML:AUTO:{path}"])
    started = time.perf_counter()
    answer, error = "", ""
    try:
        with WasiNN(registry=reg, limits=limits).session("big", config) as session:
            loaded = time.perf_counter()
            answer = session.complete("The quick brown fox")
            meta = session.metadata
        (model,) = reg.loaded()
        assert isinstance(model.weights, LlamaModel)
        layers = model.weights.n_gpu_layers
    except Exception as exc:  # noqa: BLE001 - the figure is whether it failed, and how
        error, layers, meta, loaded = f"{type(exc).__name__}: {exc}", None, {}, time.perf_counter()
    finally:
        reg.close()
    return {
        "gpu_free_mib": free >> 20,
        "margin_mib": margin_for(free) >> 20 if free else 0,
        "kv_cache_mib": kv_bytes >> 20,
        "max_kv_mib": limits.max_kv_bytes >> 20,
        "ctx_size": ctx_size,
        "n_parallel": n_parallel,
        "n_layer": n_layer,
        "n_gpu_layers": layers,
        "choice": [line for line in lines.lines if "layers fit" in line or "cannot offload" in line],
        "llama_offloaded": [line.strip() for line in lines.lines if "offloaded" in line],
        "load_s": round(loaded - started, 2),
        "tokens_per_second": meta.get("tokens_per_second"),
        "answered": bool(answer) and not error,
        "error": error,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model_p = sub.add_parser("model", help="write a random F16 benchmark model")
    model_p.add_argument("path", type=pathlib.Path)
    model_p.add_argument("--size", choices=sorted(SIZES), default="small")
    fit_p = sub.add_parser("fit", help="a KV cache larger than the GPUs' free memory")
    fit_p.add_argument("path", type=pathlib.Path)
    fit_p.add_argument("--tokens", type=int, default=32)
    fit_p.add_argument("--over", type=float, default=1.25, help="KV cache / free memory (default 1.25)")
    fit_p.add_argument("--n-parallel", type=int, default=64)
    args = parser.parse_args()
    if args.command == "model":
        started = time.perf_counter()
        write_random_model(args.path, **SIZES[args.size])  # type: ignore[arg-type]
        print(
            json.dumps({"model": str(args.path), "bytes": args.path.stat().st_size, "s": time.perf_counter() - started})
        )
        return 0
    result = fit(args.path, args.tokens, args.over, args.n_parallel)
    print(json.dumps(result))
    return 0 if result["answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
