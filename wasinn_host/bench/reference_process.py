"""A benchmark's llama.cpp reference, run in a process of its own.

llama.cpp's CPU backend meets at an OpenMP barrier after every graph node, and GNU OpenMP gives each
thread that runs llama.cpp its own team of threads; while a process holds more OpenMP threads than it
has CPUs, a thread waits at a barrier only briefly before sleeping in the kernel.  A reference decoding
in a benchmark's main thread beside the host's model worker thread slowed both, though only one of
them ran at a time (2 cores, SmolLM2: 110-125 tokens/s alone, 63-79 with the other team in the
process), which no user of either sees.  So each side runs as its users run it: the reference alone in
one child process (spawned, so it shares nothing with the host) that stays up between calls, its
models loaded once, so the runs can alternate with the host's.

A function given to :func:`native` runs in the child: a module-level function of an importable module,
its arguments and result picklable.
"""

from __future__ import annotations

import atexit
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_pool: ProcessPoolExecutor | None = None


def native(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the reference's process (started at the first call)."""
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_pool.shutdown)
    return _pool.submit(fn, *args, **kwargs).result()


def shutdown() -> None:
    """End the reference's process (a later :func:`native` starts a new one)."""
    global _pool
    if _pool is not None:
        _pool.shutdown()
        _pool = None
