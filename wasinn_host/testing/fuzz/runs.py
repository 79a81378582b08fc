"""Running a fuzzer's state machine: its hypothesis settings, its seed, and the host log it checks."""

from __future__ import annotations

import logging
from typing import Sequence

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test


def fuzz_settings(
    examples: int,
    steps: int,
    *,
    derandomize: bool,
    shrink: bool = True,
    suppress: Sequence[HealthCheck] = tuple(HealthCheck),
) -> settings:
    """Hypothesis settings for a run of ``examples`` sequences of up to ``steps`` calls, the health checks
    in ``suppress`` off (the machines' calls are slow and their data large by design)."""
    phases = [p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)]
    return settings(
        phases=phases,
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=derandomize,
        database=None,
        print_blob=False,
        suppress_health_check=list(suppress),
    )


def run_machine(
    machine: type[RuleBasedStateMachine],
    examples: int,
    steps: int,
    *,
    seed: int | None,
    shrink: bool,
    log: logging.Handler,
    level: int,
    propagate: bool = True,
    suppress: Sequence[HealthCheck] = tuple(HealthCheck),
) -> None:
    """Run ``machine``: derandomized when ``seed`` is None, else from that seed, with the ``wasinn_host``
    log at ``level`` going to ``log`` (and on to the root logger only with ``propagate``).  Raises on a
    failure (hypothesis prints the shrunk call sequence)."""
    run_settings = fuzz_settings(examples, steps, derandomize=seed is None, shrink=shrink, suppress=suppress)
    test = get_state_machine_test(machine, settings=run_settings)
    if seed is not None:
        test = hypothesis.seed(seed)(test)
    host_log = logging.getLogger("wasinn_host")
    old_level, old_propagate = host_log.level, host_log.propagate
    host_log.setLevel(level)
    host_log.propagate = propagate
    host_log.addHandler(log)
    try:
        test()
    finally:
        host_log.removeHandler(log)
        host_log.setLevel(old_level)
        host_log.propagate = old_propagate
