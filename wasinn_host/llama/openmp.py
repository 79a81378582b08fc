"""How llama.cpp's OpenMP threads wait, set before llama.cpp is loaded.

llama.cpp's CPU backend, as llama-cpp-python builds it, runs each forward pass as one OpenMP parallel
region of the calling thread and meets at an OpenMP barrier after every graph node: hundreds of
barriers a token.  GNU OpenMP (libgomp) gives every thread that starts a parallel region its own team
of threads, and while the process holds more of its threads than it has CPUs it waits at a barrier for
only 100 spins before sleeping in the kernel.  The host calls llama.cpp from one worker thread per
model, so a second model used in the process (a RAG server's embedding model beside its chat model,
TTS's vocoder beside OuteTTS, a native reference in a benchmark) puts every barrier of every model to
sleep: measured on a 2-core machine, SmolLM2 decoded 110-115 tokens/s alone and 74-78 once a second
model had computed, though that model was idle.

:func:`configure` sets ``OMP_WAIT_POLICY=active`` with ``GOMP_SPINCOUNT=300000``: libgomp's own
default spin (300,000 spins, a few milliseconds, before an idle thread sleeps, so an idle host uses no
CPU) and 1,000 spins at a barrier when oversubscribed, which keeps the second model's cost small
(94-111 tokens/s in the measurement above).  libgomp reads them once, when it is loaded; they are
removed from the environment again right after llama.cpp is loaded (and after its backend is initialised,
for builds that load the CPU backend only then), so other OpenMP runtimes loaded
later (Intel's, where ``active`` means spinning for ever) and child processes do not see them.  A user
who set either variable, or a process where libgomp was loaded before, is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

SETTINGS = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "300000"}


def libgomp_loaded() -> bool:
    """Whether a libgomp is already mapped into this process (its settings are then fixed)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


@contextmanager
def configure() -> Iterator[None]:
    """Within the block (which loads llama.cpp), libgomp's wait settings of :data:`SETTINGS`, unless
    the user set one of them or libgomp is already loaded; the environment is restored after it."""
    if any(name in os.environ for name in SETTINGS) or libgomp_loaded():
        yield
        return
    os.environ.update(SETTINGS)
    try:
        yield
    finally:
        for name in SETTINGS:
            os.environ.pop(name, None)
