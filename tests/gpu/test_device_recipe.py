"""The recipe of a GPU node without network, rehearsed here: ``scripts/gpu/on_device.sh --dry-run`` installs
the wheels ``scripts/gpu/prepare_device.sh`` put in ``.gpu/device`` without an index into a fresh Python 3.12
environment, builds llama-cpp-python from the folder's sdist (for the CPU: no nvcc here; cached by the
sdist's hash), runs the GPU tests (skipped here, with the reason) and the CPU-build checks, and every
benchmark step in small sizes (``wasinn bench`` first, its JSON and chart beside the figures), and writes
the figures JSON and the log.

Needs ``.gpu/device`` (``scripts/gpu/prepare_device.sh``, a minute) and ``python3.12``; the first run
builds llama.cpp (about 7 minutes on 2 cores), later runs take about 3.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from .gpu_env import ROOT

DEVICE_DIR = ROOT / ".gpu" / "device"


def python312() -> bool:
    """Whether the dry run finds a Python 3.12 (as ``on_device.sh`` looks for one)."""
    pyenv = shutil.which("pyenv")
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip() if pyenv else ""
    candidates = (
        ["python3.12", *map(str, pathlib.Path(root).glob("versions/3.12*/bin/python3.12"))] if root else ["python3.12"]
    )
    return any(
        subprocess.run([c, "--version"], capture_output=True).returncode == 0 for c in candidates if shutil.which(c)
    )


pytestmark = [
    pytest.mark.skipif(
        not (DEVICE_DIR / "MANIFEST").exists(), reason="no .gpu/device: run scripts/gpu/prepare_device.sh first"
    ),
    pytest.mark.skipif(
        not python312(), reason="the dry run needs python3.12 (the node's Python), on the PATH or pyenv's"
    ),
]
STEPS = [
    "install_wheels",
    "install_project",
    "install_llama_cpp",
    "info",
    "gpu_tests",
    "bench",
    "bench_model",
    "bench_single_stream",
    "bench_concurrency",
    "bench_rpc",
    "bench_serving",
    "bench_mixed_load",
    "bench_does_not_fit",
]


def test_the_dry_run_installs_the_carried_wheels_without_an_index_and_runs_the_cpu_half(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OUT"] = str(tmp_path)
    result = subprocess.run(
        [str(ROOT / "scripts/gpu/on_device.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=5400,  # a first run builds llama.cpp: 7 minutes alone, far longer on shared cores
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bench.json",
        "bench.svg",
        "figures.json",
        "gpu-tests.xml",
        "info.json",
        "on_device.log",
    ]
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["dry_run"] is True
    steps = {s["step"]: s for s in figures["steps"]}
    assert set(STEPS) <= set(steps), sorted(steps)
    assert {name: steps[name]["rc"] for name in STEPS} == dict.fromkeys(STEPS, 0)

    site = ROOT / ".gpu" / "dry-run" / "site"
    for wheel in (DEVICE_DIR / "wheels").glob("*.whl"):
        name = wheel.name.split("-")[0].lower()
        assert any(p.name.lower().startswith(name) and p.name.endswith(".dist-info") for p in site.iterdir()), name
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["llama_cpp_python"] == "0.3.36" and info["gpu_offload"] is False
    assert figures["devices"] == info["devices"]

    suite = ET.parse(tmp_path / "gpu-tests.xml").getroot()
    cases = suite.findall(".//testcase")
    skipped = [c.find("skipped") for c in cases if c.find("skipped") is not None]
    failed = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
    assert not failed
    gpu_cases = [c for c in cases if ".gpu." in (c.get("classname") or "")]
    assert gpu_cases and all(c.find("skipped") is not None for c in gpu_cases), "no GPU here: every GPU test skips"
    assert all("no GPU backend in this llama.cpp build" in (s.get("message") or "") for s in skipped if s is not None)
    assert len(cases) - len(skipped) >= 10, "the CPU-build checks ran"

    bench = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["guests"], r["way"]) for r in bench["host"]] == [(n, w) for n in (1, 2) for w in ("compute", "stream")]
    assert bench["model"].endswith("fast-step.gguf") and bench["machine"]["gpu_offload"] is False
    assert ET.parse(tmp_path / "bench.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    fit = json.loads(steps["bench_does_not_fit"]["output"].strip().splitlines()[-1])
    assert fit["answered"] is True and fit["n_gpu_layers"] == 0, fit
    assert "ratio host/native" in steps["bench_single_stream"]["output"]
    assert "one streaming guest / one guest computing" in steps["bench_serving"]["output"]
    assert "rpc" in steps["bench_rpc"]["output"]
    log = (tmp_path / "on_device.log").read_text()
    assert "== gpu_tests: exit 0" in log
