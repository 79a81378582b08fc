"""The worker's step clock: each phase of a step is counted where it happens (fake runtime, no llama.cpp)."""

from __future__ import annotations

import pathlib
import time

import pytest

from wasinn_host.core.scheduling.scheduler import ContextState
from wasinn_host.core.scheduling.step_clock import PHASES, StepClock

from .test_engine import make_worker, request

pytestmark = pytest.mark.fast


def test_laps_add_up_to_the_time_between_marks() -> None:
    clock = StepClock()
    clock.start()
    time.sleep(0.01)
    clock.lap("plan")
    clock.lap("launch")
    clock.steps = 2
    report = clock.report()
    assert report["plan_s"] >= 0.01 and report["launch_s"] < 0.01
    assert report["plan_ms_per_step"] == pytest.approx(report["plan_s"] * 500, rel=1e-3)
    assert report["host_ms_per_step"] >= report["plan_ms_per_step"]
    assert set(f"{p}_s" for p in PHASES) <= set(report)


def test_a_decode_delay_shows_in_launch_and_each_decoding_step_is_counted(fake_model: pathlib.Path) -> None:
    """A fake decode that takes 5 ms is llama.cpp's time (launch), not the host's; every step that
    decoded is a step of the clock."""
    worker = make_worker(fake_model, delay=0.005)
    result = worker.submit(request("a", limit=10), ContextState())
    assert len(result.generated) == 10
    report = worker.clock.report()
    assert report["steps"] == worker.decode_calls == 10
    assert report["launch_s"] >= 0.005 * 10
    assert report["llama_ms_per_step"] >= 5.0
    assert report["sample_s"] > 0 and report["plan_s"] > 0 and report["admit_s"] > 0
    assert report["host_ms_per_step"] == pytest.approx(
        (report["admit_s"] + report["plan_s"] + report["sample_s"]) * 100, abs=1e-3
    )
    worker.close()
