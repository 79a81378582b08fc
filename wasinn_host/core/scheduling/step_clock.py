"""Where a model worker's time goes, step by step: the host's own phases beside llama.cpp's.

A step of :class:`~wasinn_host.core.scheduling.scheduler.ModelWorker` is, in order,

- ``admit``: taking submitted requests, releasing closed contexts, starting waiting jobs in slots
  (prefix trims and copies, samplers); the requests submitted during a step are taken while the device
  computes it (between ``launch`` and ``device``), so on a GPU that part overlaps the decode;
- ``plan``: choosing the step's tokens (:mod:`.batch_plan`) and filling the batch;
- ``guests``: where llama.cpp's threads take every core, waiting for the streaming guests just handed
  their tokens to come back for the next (:class:`~.stream_feed.GuestsBack`), so that they do not run
  beside the decode; the guests' own time, counted in neither the host's part nor llama.cpp's;
- ``launch``: ``llama_decode`` itself (on a CPU the whole forward pass; on a GPU the graph's launch,
  the device computing on);
- ``device``: waiting for the device to finish (``llama_synchronize``; nothing on a CPU);
- ``sample``: reading logits, sampling, stop rules, and handing each token to its guest (a job's
  end, a stream's feed, a ``stream-stdout`` queue).

:class:`StepClock` adds each phase's seconds as the worker passes from one to the next (one
``perf_counter`` call a phase); ``--status`` and the metrics show the totals and the means per step,
and ``host_ms_per_step`` (admit + plan + sample) beside ``llama_ms_per_step`` (launch + device).
"""

from __future__ import annotations

import time

PHASES = ("admit", "plan", "guests", "launch", "device", "sample")
HOST_PHASES = ("admit", "plan", "sample")
LLAMA_PHASES = ("launch", "device")


class StepClock:
    """Seconds spent in each phase of the worker's steps, and the steps counted."""

    __slots__ = ("seconds", "steps", "_mark")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        """Steps that decoded something."""
        self._mark = time.perf_counter()

    def start(self) -> None:
        """A new lap begins now (time before it, waiting for work, counts in no phase)."""
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the last mark was spent in ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] += now - self._mark
        self._mark = now

    def add(self, phase: str, seconds: float) -> None:
        """``seconds`` spent in ``phase`` outside a lap (between two steps)."""
        self.seconds[phase] += seconds

    def report(self) -> dict[str, float]:
        """Totals in seconds and means per step in milliseconds, JSON-ready."""
        steps = max(self.steps, 1)
        out: dict[str, float] = {f"{phase}_s": round(s, 6) for phase, s in self.seconds.items()}
        out.update({f"{phase}_ms_per_step": round(s * 1000.0 / steps, 4) for phase, s in self.seconds.items()})
        out["host_ms_per_step"] = round(sum(self.seconds[p] for p in HOST_PHASES) * 1000.0 / steps, 4)
        out["llama_ms_per_step"] = round(sum(self.seconds[p] for p in LLAMA_PHASES) * 1000.0 / steps, 4)
        out["steps"] = self.steps
        return out
