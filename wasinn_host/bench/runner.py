"""``wasinn bench``'s runs: the host's guests and llama.cpp alone, alternating, on one model.

For each run, for each number of guests, every way the guests answer (:mod:`.guests`, a ``wasinn run``
process each) and then llama.cpp alone on as many sequences (:mod:`.reference`, in its own process), so
drift on a shared machine touches both alike.  One warm-up of each side comes first (the guest compiled
and cached, the reference's model loaded); it is not counted.  Without a model file the fast-step model
(``wasinn model random --layers 2 --embd 256 --heads 4 --ff 512 --vocab 32000``, 36 MB) is written once
to the cache directory: its step takes about a millisecond on a CPU, so the host's own cost shows, as it
does beside a GPU.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ..launch.compile_cache import default_cache_dir
from .guests import BenchError, GuestRun, run_guests
from .reference import ReferenceRun, reference_run
from .reference_process import native, shutdown
from .report import Results

FAST_STEP_MODEL = {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_ff": 512, "n_vocab": 32000}
"""``wasinn model random``'s options for the default model."""
MAX_GUESTS = 256
"""llama.cpp's most sequences in one context (``LLAMA_MAX_SEQ``), so the reference's most too."""


def default_model() -> Path:
    """The fast-step model in the cache directory, written there the first time."""
    from ..testing.model_catalog import BUILTIN_MODELS

    path = default_cache_dir() / "bench" / "fast-step.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            written = BUILTIN_MODELS["random"].write(Path(tmp) / path.name, **FAST_STEP_MODEL)
            os.replace(written, path)
    return path


def machine() -> dict[str, Any]:
    """What the figures were measured on: the CPU, its cores, and whether llama.cpp can offload to a GPU."""
    import llama_cpp

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "system": platform.system(),
        "python": platform.python_version(),
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
    }


def reference_layers() -> int:
    """The reference's GPU layers: all of them on a build that can offload (as the host's ``AUTO`` target
    does with a model that fits), none otherwise."""
    import llama_cpp

    return 2**31 - 1 if llama_cpp.llama_supports_gpu_offload() else 0


def reference_threads(run: GuestRun) -> int:
    """The host's llama.cpp threads in ``run`` (0 in ``--status`` means all cores), for the reference."""
    from ..llama.model import default_threads

    threads = int(run.params.get("threads") or 0)
    return threads if threads > 0 else default_threads()


def run_bench(
    model: Path,
    guests: list[int],
    ways: list[str],
    tokens: int,
    letters: int,
    runs: int,
    progress: Callable[[str], None],
    timeout: float = 600.0,
    threads: int | None = None,
) -> Results:
    """Every run, alternating the host and the reference; ``progress`` is told what runs now; ``threads``:
    llama.cpp's threads on both sides (None: the host's default, all cores, for both)."""
    results = Results(
        model=str(model),
        model_bytes=model.stat().st_size,
        tokens=tokens,
        prompt_letters=letters,
        threads=0,
        guests=guests,
        ways=ways,
        machine=machine(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        threads_given=threads is not None,
    )
    ctx_size = -(-(letters + tokens + 16) // 256) * 256
    layers = reference_layers()
    try:
        progress("warming up: the guest compiled, the model loaded")
        warm = run_guests(model, 1, ways[0], min(tokens, 8), letters, timeout, threads)
        results.threads = reference_threads(warm)
        native(reference_run, str(model), 1, letters, min(tokens, 8), results.threads, ctx_size, layers, 0)
        for run in range(runs):
            for n in guests:
                for way in ways:
                    progress(f"run {run + 1}/{runs}: {n} guest{'s' if n > 1 else ''} {way}")
                    one = run_guests(model, n, way, tokens, letters, timeout, threads)
                    results.host.setdefault((n, way), []).append(one)
                progress(f"run {run + 1}/{runs}: llama.cpp alone, {n} sequence{'s' if n > 1 else ''}")
                ref: ReferenceRun = native(
                    reference_run, str(model), n, letters, tokens, results.threads, ctx_size, layers, run + 1
                )
                results.reference.setdefault(n, []).append(ref)
    except BrokenProcessPool:
        raise BenchError("llama.cpp alone: its process died on this model") from None
    finally:
        shutdown()
    return results
