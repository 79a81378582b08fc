"""A benchmark's native llama-cpp-python reference, run in a process of its own.

llama.cpp's CPU backend meets at an OpenMP barrier after every graph node, and GNU OpenMP gives each
thread that runs llama.cpp its own team of threads; while a process holds more OpenMP threads than it
has CPUs, a thread waits at a barrier only briefly before sleeping in the kernel.  A native reference
decoding in a benchmark's main thread beside the host's model worker thread slowed both, though only
one of them ran at a time (2 cores, SmolLM2: 110-125 tokens/s alone, 63-79 with the other team in the
process, one-token steps more than batches of drafts), which no user of either sees.  So each side runs
as its users run it: the host in the benchmark's process, the reference alone in one child process
(spawned, so it shares nothing with the host) that stays up between calls, its models loaded once, so
the runs still alternate.

A function given to :func:`native` runs in the child: a module-level function of an importable module
or of the benchmark script itself, its arguments and result picklable (plain values: a class defined
in the script is ``__mp_main__``'s in the child).
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
