"""Sessions started together on the ``succ`` model, for the tests that compare guests batched with alone."""

from __future__ import annotations

import threading
from typing import Any

from wasinn_host import WasiNN

GREEDY_ROWS_BASE = {"ctx-size": 256, "n-predict": 24, "ignore-eos": True}


def complete_together(
    nn: WasiNN, jobs: list[tuple[str, dict[str, Any]]], base: dict[str, Any] | None = None
) -> list[str]:
    """Each (prompt, ``base`` + config) completed by its own session, all started at one moment."""
    texts = [""] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        prompt, config = jobs[i]
        with nn.session("succ", {**(GREEDY_ROWS_BASE if base is None else base), **config}) as session:
            barrier.wait()
            texts[i] = session.complete(prompt)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return texts
