"""``split-mode``, ``main-gpu`` and ``tensor-split`` across two GPU devices (issue 33's keys): split mode
none keeps every layer on the ``main-gpu`` device, ``tensor-split`` sets each device's share, and the
answer is the CPU's either way. Two devices as in ``test_gpu_split.py`` (lavapipe twice on Vulkan).
"""

from __future__ import annotations

import pathlib

import pytest

from .gpu_env import GPU_MARKS, write_exact_model
from .test_gpu_split import GREEDY, buffers, cpu_answer, gpu_count, run_child

pytestmark = GPU_MARKS


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_exact_model(tmp_path_factory.mktemp("split-keys") / "rand.gguf")


@pytest.mark.parametrize("main_gpu", [0, 1])
def test_split_mode_none_puts_every_layer_on_the_main_gpu(model: pathlib.Path, main_gpu: int) -> None:
    if gpu_count() < main_gpu + 1:  # no device number main_gpu here: nothing to put the layers on
        pytest.skip(f"main-gpu {main_gpu} needs {main_gpu + 1} GPU devices; this machine has {gpu_count()}")
    out = run_child(model, {**GREEDY, "n-gpu-layers": -1, "split-mode": "none", "main-gpu": main_gpu})
    names = [g["name"] for g in out["gpus"]]
    used = [line for line in out["log"] if "using device" in line]
    assert len(used) == 1 and f"using device {names[main_gpu]} " in used[0], used
    sizes = buffers(out["log"])
    assert sizes.get(names[main_gpu], 0) > 0 and names[1 - main_gpu] not in sizes, sizes
    assert out["answer"] == cpu_answer(model)


def test_tensor_split_sets_each_devices_share(model: pathlib.Path) -> None:
    """4 layers and the output layer: ``3,1`` puts every layer on the first device (5.01 and 0.25 MiB on
    lavapipe), ``1,3`` two and two (2.50 and 2.75 MiB); llama.cpp rounds the shares to whole layers."""
    first = run_child(model, {**GREEDY, "n-gpu-layers": -1, "tensor-split": "3,1"})
    second = run_child(model, {**GREEDY, "n-gpu-layers": -1, "tensor-split": "1,3"})
    names = [g["name"] for g in first["gpus"]]
    to_first, to_second = buffers(first["log"]), buffers(second["log"])
    assert to_first[names[0]] > to_second[names[0]] and to_first[names[1]] < to_second[names[1]], (to_first, to_second)
    assert to_first[names[0]] > 4 * to_first[names[1]], to_first
    assert first["answer"] == second["answer"] == cpu_answer(model)
