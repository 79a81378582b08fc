"""Two GPU devices: llama.cpp spreads the offloaded layers over both, and the answer is the CPU's.

On the software GPU the second device is lavapipe listed twice (``GGML_VK_VISIBLE_DEVICES=0,0``, set for a
child process); on a CUDA machine both devices must be real, else the tests skip and say so.
These tests need no key: llama.cpp's default layer split. ``split-mode``, ``main-gpu`` (which only matters
under split mode none or row) and ``tensor-split`` are tested in ``test_gpu_split_keys.py``.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.llama import devices

from .gpu_env import GPU_MARKS, ROOT, info_json, write_exact_model

pytestmark = GPU_MARKS
PROMPT = "the quick brown fox"
GREEDY = {"temp": 0, "n-predict": 24}


def two_device_env() -> dict[str, str]:
    env = dict(os.environ)
    if "Vulkan" in devices.backends():
        env["GGML_VK_VISIBLE_DEVICES"] = "0,0"
    return env


@functools.cache
def gpu_count() -> int:
    """The GPU devices a child process sees under :func:`two_device_env` (``wasinn info --json``)."""
    return sum(d["type"] in ("GPU", "IGPU") for d in info_json(two_device_env())["devices"])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_exact_model(tmp_path_factory.mktemp("split") / "rand.gguf")


def run_child(model: pathlib.Path, config: dict[str, Any]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests/gpu/two_devices.py"), str(model), json.dumps(config), PROMPT],
        capture_output=True,
        text=True,
        env=two_device_env(),
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    if len(out["gpus"]) < 2:
        pytest.skip(f"needs two GPU devices; this machine has {len(out['gpus'])}: {out['gpus']}")
    return out


def buffers(log: list[str]) -> dict[str, float]:
    found = {}
    for line in log:
        m = re.search(r"(\S+) model buffer size =\s*([\d.]+) MiB", line)
        if m:
            found[m[1]] = float(m[2])
    return found


def cpu_answer(model: pathlib.Path) -> str:
    reg = ModelRegistry([f"m:GGML:CPU:{model}"])
    try:
        with WasiNN(registry=reg).session("m", GREEDY) as session:
            return session.complete(PROMPT)
    finally:
        reg.close()


def test_info_lists_both_devices_and_the_fit_counts_their_memory_together() -> None:
    info = info_json(two_device_env())
    gpus = [d for d in info["devices"] if d["type"] in ("GPU", "IGPU")]
    if len(gpus) < 2:
        pytest.skip(f"needs two GPU devices; this machine has {len(gpus)}")
    assert info["gpu_offload"] is True
    assert len({d["name"] for d in gpus}) == len(gpus), "each device under its own name (Vulkan0, Vulkan1)"


def test_all_layers_spread_over_both_devices_and_answer_as_the_cpu(model: pathlib.Path) -> None:
    out = run_child(model, {**GREEDY, "n-gpu-layers": -1})
    names = [g["name"] for g in out["gpus"]]
    assert out["gpu_free_bytes"] == sum(g["free_bytes"] for g in out["gpus"])
    used = [line for line in out["log"] if "using device" in line]
    assert all(any(f"using device {n} " in line for line in used) for n in names), used
    sizes = buffers(out["log"])
    assert all(sizes.get(n, 0) > 0 for n in names), f"weights on every device: {sizes}"
    assert any("offloaded 5/5 layers to GPU" in line for line in out["log"])
    assert out["answer"] == cpu_answer(model)


def test_partial_offload_over_two_devices_answers_as_the_cpu(model: pathlib.Path) -> None:
    out = run_child(model, {**GREEDY, "n-gpu-layers": 2})
    assert any("offloaded 2/5 layers to GPU" in line for line in out["log"])
    assert out["answer"] == cpu_answer(model)
