"""A step's batch decoded in parts of at most ``decode-logits-rows`` sampled rows (the memory that
follows the work).

llama.cpp keeps one row of the vocabulary's logits for every token whose logits a ``llama_decode``
asks for, twice: in the graph's result (the compute buffer) and in the context's output buffer.  With
Gemma 3's 262,144-token vocabulary a row is 1 MiB, so 32 guests sampling in one step leave 64 MiB
resident (the pages stay once touched).  The worker decodes the jobs of a step in parts of at most
that many rows, and samples each part before it decodes the next: the parts write the same first rows
of both buffers, so only ``rows`` of each are ever touched.  A part is a run of consecutive jobs of
the batch (each job's tokens are together, in sequence-id order): a job is never split (its draft rows
are verified together), and one with more rows than the cap is a part of its own.  Each part costs a
pass over the weights, so the cap trades throughput for memory: it is off unless a model is loaded
with it (see docs/benchmarks-history.md).

A step the plan splits (:func:`.batch_plan.plan_step`: the generating jobs, then the prompt chunks, as
two ``llama_decode`` calls) also breaks its runs where the prompt chunks begin.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config.params import DEFAULT_LOGITS_ROWS as DEFAULT_LOGITS_ROWS  # the key's default: config/params.py


def parts(rows: Sequence[int], cap: int, split_at: int = 0) -> list[range]:
    """The jobs of a batch (``rows[i]``: logits rows job ``i`` asks for) as consecutive runs whose rows
    add up to at most ``cap``; a job with more than ``cap`` rows alone; a job with none joins the run
    before it.  ``cap`` 0 (or below): one run of every job.  No jobs: no runs.  A ``split_at`` within
    the jobs also starts a run at that job."""
    runs: list[range] = []
    start, total = 0, 0
    for i, n in enumerate(rows):
        if (cap > 0 and total > 0 and total + n > cap) or (i == split_at and i > start):
            runs.append(range(start, i))
            start, total = i, 0
        total += n
    if rows:
        runs.append(range(start, len(rows)))
    return runs
