"""The benchmarks' runner: one ``complete.wasm`` guest per prompt, all started at one moment through one
:class:`wasinn_host.WasiNN` (threads and a barrier), with each guest's text (stdout) and metadata (the last
stderr line, JSON)."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime

from wasinn_host import RunOptions, WasiNN


@dataclass
class Together:
    wall_s: float
    """From the common start to the last guest's exit."""
    texts: list[bytes]
    metas: list[dict[str, Any]]


def run_together(
    nn: WasiNN,
    module: wasmtime.Module,
    alias: str,
    prompts: list[str],
    config: dict[str, object],
    before_start: Callable[[], None] | None = None,
) -> Together:
    """Run ``complete.wasm ALIAS PROMPT`` for every prompt at once (``WASINN_CONFIG`` = ``config``);
    ``before_start`` runs once every guest thread waits at the barrier.  A failed guest ends the benchmark."""
    n = len(prompts)
    env = {"WASINN_CONFIG": json.dumps(config)}
    barrier = threading.Barrier(n + 1)
    codes: list[int | None] = [None] * n
    ends = [0.0] * n
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)

        def guest(i: int) -> None:
            options = RunOptions(env=env, stdout=str(workdir / f"out{i}.txt"), stderr=str(workdir / f"err{i}.txt"))
            barrier.wait()
            try:
                codes[i] = nn.run(module, [alias, prompts[i]], options)
            except BaseException as exc:  # reported below
                errors.append(exc)
            ends[i] = time.perf_counter()

        threads = [threading.Thread(target=guest, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        if before_start is not None:
            before_start()
        barrier.wait()
        started = time.perf_counter()
        for t in threads:
            t.join()
        if errors or any(code != 0 for code in codes):
            details = "; ".join((workdir / f"err{i}.txt").read_text().strip() for i in range(n) if codes[i] != 0)
            raise SystemExit(f"guest failed: {errors or ''} {details}")
        texts = [(workdir / f"out{i}.txt").read_bytes().removesuffix(b"\n") for i in range(n)]
        metas = [json.loads((workdir / f"err{i}.txt").read_text().strip().splitlines()[-1]) for i in range(n)]
    return Together(max(ends) - started, texts, metas)
