"""Room for more sequences without a stall: a bigger inference context made while the worker steps on.

When more contexts compute at once than a model's inference context has sequences (``n-parallel``
unset), the registry offers a :class:`Growth`: a maker of a context with room for them, and whether to
make it beside the running one.  If so, a :class:`ContextMaker` makes it on a thread of its own
(llama.cpp allocates and clears the new KV cache and reserves its compute graphs: about 150-250 ms for
64 sequences of 2,048 cells of the fast-step model on a 2-core machine) while the running guests go on
decoding; the worker then moves each sequence's cells over (a few milliseconds a sequence) and takes
the waiting jobs.  If not, the old context is freed first and the new one made in its place, the
guests waiting meanwhile, as before.

Beside needs the KV budget to hold both caches, and a core the decode leaves free (:func:`spare_core`):
llama.cpp's threads wait for each other at every operation, so a thread making a context on one of
their cores slows both.  Measured on a 2-core machine (the fast-step model, 8 sequences decoding): with
one llama.cpp thread the 64-sequence context took 280-360 ms beside the decode (150-220 ms alone) while
steps went on at 10-12 ms (3 ms alone); with two threads on the two cores it took 430-690 ms and the
steps 26-430 ms, longer for everyone than a stall.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..runtime import Context


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def spare_core(context: Context) -> bool:
    """Whether decoding on ``context`` leaves a core for making another: its model runs on a GPU, or its
    llama.cpp threads are fewer than the cores."""
    return context.offloaded or context.threads < available_cores()


@dataclass(frozen=True)
class Growth:
    """A bigger inference context to move to."""

    make: Callable[[], Context]
    """Makes it (llama.cpp allocates its KV cache then)."""
    beside: bool
    """Made while the worker steps on: the KV budget has room for it beside the running context, and
    a core to make it on (:func:`spare_core`)."""


class ContextMaker:
    """Makes a context on a thread of its own; :attr:`done` once it has (or failed: :attr:`error`)."""

    def __init__(self, make: Callable[[], Context], name: str) -> None:
        self.context: Context | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(make,), name=f"wasinn-grow-{name}", daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Context]) -> None:
        try:
            self.context = make()
        except BaseException as exc:  # reported by the worker when it looks
            self.error = exc

    @property
    def done(self) -> bool:
        """Whether the context is made (or failed)."""
        return not self._thread.is_alive()

    def close(self) -> None:
        """Wait for the thread and free a context nobody took."""
        self._thread.join()
        if self.context is not None:
            self.context.close()
            self.context = None
