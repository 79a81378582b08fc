"""The CPU probe's decision (wasinn_host/llama/cpu_probe.py): which extra CPU layouts a process turns off, from
probe children that live or die (real child processes, some killed by a real SIGILL or SIGSEGV), the verdict
kept per llama.cpp build and CPU, and WASINN_AMX forcing it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from wasinn_host.core.errors import WasiNNError
from wasinn_host.llama import cpu_probe
from wasinn_host.llama.cpu_probe import Verdict, child_outcome, decide, machine_key

pytestmark = pytest.mark.fast

LAYOUTS = ["AMX", "CPU_REPACK"]


class Children:
    """A probe runner whose children are real processes: each dies of ``signal_name`` unless it runs without
    one of ``cures`` (a machine where that layout crashes); records what it was asked to run without."""

    def __init__(self, signal_name: str = "SIGILL", cures: tuple[str, ...] = ("AMX",), healthy: bool = False) -> None:
        self.signal_name, self.cures, self.healthy = signal_name, cures, healthy
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, without: tuple[str, ...]) -> str:
        self.calls.append(without)
        script = (
            "import os, signal, sys\n"
            f"if {self.healthy} or set(sys.argv[1:]) & {set(self.cures)!r}: sys.exit(0)\n"
            f"os.kill(os.getpid(), signal.{self.signal_name})\n"
        )
        proc = subprocess.run([sys.executable, "-c", script, *without], capture_output=True, text=True, check=False)
        return child_outcome(proc.returncode, proc.stdout + proc.stderr)


@pytest.mark.parametrize("signal_name", ["SIGILL", "SIGSEGV"])
def test_a_child_that_dies_leads_to_the_load_without_that_layout(tmp_path: pathlib.Path, signal_name: str) -> None:
    runner = Children(signal_name)
    verdict = decide("auto", LAYOUTS, tmp_path / "v.json", runner)
    assert runner.calls == [(), ("AMX",)]
    assert verdict.disabled == ("AMX",)
    assert verdict.trials[0].outcome == f"died of {signal_name}"
    assert verdict.trials[1].ok
    assert signal_name in verdict.reason and "AMX" in verdict.reason
    assert verdict.source == "probe"
    assert json.loads((tmp_path / "v.json").read_text())["disabled"] == ["AMX"]


def test_a_healthy_probe_changes_nothing(tmp_path: pathlib.Path) -> None:
    runner = Children(healthy=True)
    verdict = decide("auto", LAYOUTS, tmp_path / "v.json", runner)
    assert runner.calls == [()]
    assert verdict.disabled == ()
    assert [t.without for t in verdict.trials] == [()]


def test_a_layout_other_than_amx_that_crashes_is_the_one_turned_off(tmp_path: pathlib.Path) -> None:
    runner = Children("SIGSEGV", cures=("CPU_REPACK",))
    verdict = decide("auto", LAYOUTS, tmp_path / "v.json", runner)
    assert runner.calls == [(), ("AMX",), ("CPU_REPACK",)]
    assert verdict.disabled == ("CPU_REPACK",)


def test_when_nothing_helps_every_layout_is_off(tmp_path: pathlib.Path) -> None:
    runner = Children(cures=())
    verdict = decide("auto", LAYOUTS, tmp_path / "v.json", runner)
    assert verdict.disabled == tuple(LAYOUTS)
    assert "every extra layout is off" in verdict.reason


def test_the_verdict_is_reused_and_redone_for_another_build(tmp_path: pathlib.Path) -> None:
    libs = tmp_path / "lib"
    libs.mkdir()
    (libs / "libggml-cpu.so").write_bytes(b"build one")
    key_one = machine_key(libs)
    first = Children()
    decide("auto", LAYOUTS, tmp_path / f"{key_one}.json", first)
    again = Children()
    verdict = decide("auto", LAYOUTS, tmp_path / f"{machine_key(libs)}.json", again)
    assert again.calls == [] and verdict.source == "cache" and verdict.disabled == ("AMX",)

    (libs / "libggml-cpu.so").write_bytes(b"another build of llama.cpp")  # pip installed another build
    key_two = machine_key(libs)
    assert key_two != key_one
    rebuilt = Children(healthy=True)  # a build whose AMX layout works
    verdict = decide("auto", LAYOUTS, tmp_path / f"{key_two}.json", rebuilt)
    assert rebuilt.calls == [()] and verdict.disabled == ()


def test_an_unreadable_or_foreign_verdict_probes_again(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "v.json"
    path.write_text("{not json")
    runner = Children()
    assert decide("auto", LAYOUTS, path, runner).source == "probe"
    path.write_text(json.dumps({"disabled": ["KLEIDIAI"], "reason": "x", "trials": []}))  # not a layout here
    assert decide("auto", LAYOUTS, path, Children()).source == "probe"


def test_wasinn_amx_forces_either_way_without_a_probe(tmp_path: pathlib.Path) -> None:
    runner = Children()
    off = decide("off", LAYOUTS, tmp_path / "v.json", runner)
    on = decide("on", LAYOUTS, tmp_path / "v.json", runner)
    assert runner.calls == []
    assert (off.disabled, off.source) == (("AMX",), "forced")
    assert (on.disabled, on.source) == ((), "forced")
    assert decide("off", ["CPU_REPACK"], None, runner).disabled == ()


def test_a_build_without_extra_layouts_needs_no_probe() -> None:
    runner = Children()
    assert decide("auto", [], None, runner) == Verdict((), "this llama.cpp build has no extra CPU layouts", "none")
    assert runner.calls == []


def test_policy_reads_wasinn_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WASINN_AMX", raising=False)
    assert cpu_probe.policy() == "auto"
    monkeypatch.setenv("WASINN_AMX", " OFF ")
    assert cpu_probe.policy() == "off"
    monkeypatch.setenv("WASINN_AMX", "maybe")
    with pytest.raises(WasiNNError, match="WASINN_AMX='maybe': expected one of auto, on, off"):
        cpu_probe.policy()


def test_outcomes_name_the_signal_or_the_last_line() -> None:
    assert child_outcome(0, "ok (cosine 1.0)") == "ok"
    assert child_outcome(-4, "") == "died of SIGILL"
    assert child_outcome(3, "loading\nlogits differ (cosine 0.412)\n") == "failed (logits differ (cosine 0.412))"
    assert child_outcome(1, "") == "failed (exit status 1)"


def test_quantized_weights_and_f16_beside_amx_need_the_probe() -> None:
    assert not cpu_probe.needs_probe(frozenset({0}))  # F32 only: no extra layout holds it
    assert cpu_probe.needs_probe(frozenset({0, 1}), ["AMX", "CPU_REPACK"])  # F16 (the demo and random models)
    assert not cpu_probe.needs_probe(frozenset({0, 1}), ["CPU_REPACK"])  # ... which only AMX's layout holds
    assert cpu_probe.needs_probe(frozenset({0, 3}))  # Q4_1 (SmolLM2)
    assert cpu_probe.needs_probe(frozenset({0, 12, 14}))  # Q4_K, Q6_K (Gemma 3 Q4_K_M)


def test_a_read_only_cache_keeps_the_verdict_for_the_process(tmp_path: pathlib.Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    verdict = decide("auto", LAYOUTS, blocked / "cpu-probe" / "v.json", Children())
    assert verdict.disabled == ("AMX",) and verdict.file == ""
    assert os.listdir(tmp_path) == ["file"]
