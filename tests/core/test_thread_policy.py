"""Guests run with their thread in SCHED_BATCH, the model's worker (and llama.cpp's threads) in the policy
the thread had before; the caller's policy comes back after the run (Linux)."""

from __future__ import annotations

import os
import pathlib
import sys
import threading
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core import thread_policy
from wasinn_host.core.scheduling import scheduler
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import run_guest


def in_thread(body: Any) -> Any:
    """``body()``'s result, called in a new thread (so the test's own thread keeps its policy)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(body()))
    thread.start()
    thread.join()
    return out[0]


def _batch_allowed() -> bool:
    """Whether a thread here may move to SCHED_BATCH and back (a sandbox may refuse it: nothing is done)."""
    if not sys.platform.startswith("linux"):
        return False

    def body() -> bool:
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            return False
        return True

    return bool(in_thread(body))


pytestmark = pytest.mark.skipif(
    not _batch_allowed(), reason="scheduling policies are Linux's, and this sandbox refuses them: nothing is done"
)


def test_background_moves_the_thread_to_batch_and_back() -> None:
    def body() -> tuple[int, int | None, int, int | None]:
        before = os.sched_getscheduler(0)
        with thread_policy.background():
            inside, remembered = os.sched_getscheduler(0), thread_policy.foreground_policy()
        return before, remembered, inside, os.sched_getscheduler(0) if before == os.SCHED_OTHER else None

    before, remembered, inside, after = in_thread(body)
    assert before == os.SCHED_OTHER
    assert inside == os.SCHED_BATCH and remembered == os.SCHED_OTHER
    assert after == os.SCHED_OTHER


def test_a_thread_its_owner_put_in_batch_is_left_as_it_is() -> None:
    def body() -> tuple[int, int | None, int]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        with thread_policy.background():
            remembered = thread_policy.foreground_policy()
        return os.sched_getscheduler(0), remembered, thread_policy.use_policy(None)

    after, remembered, used = in_thread(body)
    assert after == os.SCHED_BATCH and remembered is None and used is False


def test_a_guest_runs_in_batch_and_the_worker_it_starts_does_not(
    preload_specs: list[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh registry: the model and its worker are made inside the guest's run (its ``load_by_name``),
    from a thread in SCHED_BATCH; the worker's thread runs in SCHED_OTHER, and the answer is the model's."""
    seen: list[int] = []
    workers: list[scheduler.ModelWorker] = []
    made = scheduler.ModelWorker.__init__

    def recording_init(self: scheduler.ModelWorker, *args: Any, **kwargs: Any) -> None:
        seen.append(os.sched_getscheduler(0))  # the thread that makes the worker: the guest's
        made(self, *args, **kwargs)
        workers.append(self)

    monkeypatch.setattr(scheduler.ModelWorker, "__init__", recording_init)
    registry = ModelRegistry(preload_specs)
    try:
        nn = WasiNN(registry=registry)

        def body() -> tuple[tuple[int, str, str], int]:
            result = run_guest(nn, tmp_path, "complete", ["succ", "hello"])
            return result, os.sched_getscheduler(0)

        (code, out, err), after = in_thread(body)
        assert code == 0, err
        assert out.strip() == successor_text("hello") + "</s>"
        assert seen == [os.SCHED_BATCH]
        assert after == os.SCHED_OTHER
        (worker,) = workers
        native_id = worker._thread.native_id
        assert native_id is not None and worker._thread.is_alive()
        assert os.sched_getscheduler(native_id) == os.SCHED_OTHER
    finally:
        registry.close()
