"""What the GPU tests share: whether a GPU backend is present (and the reason they skip when not), the
models they run, and llama.cpp's own log lines about where the layers went."""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.registry import LoadedModel
from wasinn_host.llama import devices
from wasinn_host.llama.model import LlamaModel
from wasinn_host.observability.log_setup import LLAMA_LOGGER
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.gguf_models import write_random_model


def missing_gpu_reason() -> str | None:
    """None when llama.cpp can offload to a GPU device here; else why not, and how to get one."""
    if devices.can_offload():
        return None
    backends = devices.backends()
    if "Vulkan" in backends:
        return (
            "the Vulkan backend is built in but sees no GPU device: ggml-vulkan skips CPU-type devices "
            "(Mesa's lavapipe) unless GGML_VK_VISIBLE_DEVICES=0 is set (scripts/gpu/vulkan_soft.sh sets it)"
        )
    return (
        f"no GPU backend in this llama.cpp build (backends: {', '.join(backends)}): "
        "run scripts/gpu/vulkan_soft.sh (a software GPU) or install a GPU build (docs/guides/gpu.md)"
    )


_REASON = missing_gpu_reason()
needs_gpu = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
"""Every GPU test: skipped, with the reason above, on a build that cannot offload."""
GPU_MARKS = [pytest.mark.gpu, needs_gpu]

ON_DEVICE = {"n-gpu-layers": -1}
GREEDY = '{"temp": 0, "n-predict": 24}'


def write_exact_model(path: pathlib.Path) -> pathlib.Path:
    """A small random F16 model whose greedy argmax stands far above the rest (logits spread 50), so
    the device's F16 arithmetic (logits within 0.04 of the CPU's) picks the CPU's tokens."""
    return write_random_model(path, n_layer=4, n_embd=256, n_head=4, n_ff=512, context_length=512, logit_std=50.0)


def loaded(reg: ModelRegistry, name: str) -> LoadedModel:
    """The one loaded model called ``name``."""
    (model,) = [m for m in reg.loaded() if m.name == name]
    return model


def gpu_layers(reg: ModelRegistry, name: str) -> int:
    """The layer count the host passed to llama.cpp for ``name`` (-1 = all)."""
    weights = loaded(reg, name).weights
    assert isinstance(weights, LlamaModel)
    return weights.n_gpu_layers


def generate(reg: ModelRegistry, name: str, config: str | None, prompt: str, metadata: str = GREEDY) -> str:
    """Load ``name`` with ``config`` through a guest and return its greedy answer to ``prompt``."""
    guest = AbiGuest.create(WasiNN(registry=reg))
    rc, graph = guest.load_by_name(name, config)
    assert rc == 0
    rc, text = guest.generate(graph, prompt, metadata)
    assert rc == 0
    return text


OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def offloaded(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    """llama.cpp's ``offloaded K/N layers to GPU`` lines, as (K, N), in order."""
    return [(int(m[1]), int(m[2])) for r in caplog.records if (m := OFFLOADED.search(r.getMessage()))]


def device_buffers(caplog: pytest.LogCaptureFixture) -> dict[str, float]:
    """llama.cpp's ``<device> model buffer size = X MiB`` lines: MiB of weights per buffer type."""
    found = {}
    for r in caplog.records:
        m = re.search(r"(\S+) model buffer size =\s*([\d.]+) MiB", r.getMessage())
        if m:
            found[m[1]] = float(m[2])
    return found


@contextlib.contextmanager
def llama_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture the host's log (INFO) and llama.cpp's own (logger ``wasinn_host.llama``, silent by default)."""
    with caplog.at_level(logging.INFO, logger="wasinn_host"), caplog.at_level(logging.INFO, logger=LLAMA_LOGGER):
        yield


ROOT = pathlib.Path(__file__).resolve().parents[2]


def wasinn(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``wasinn ARGS`` in a new process (``env``: its whole environment, when given)."""
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", *args], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )


def info_json(env: dict[str, str] | None = None) -> dict[str, Any]:
    """``wasinn info --json`` of a new process."""
    result = wasinn("info", "--json", env=env)
    assert result.returncode == 0, result.stderr
    info: dict[str, Any] = json.loads(result.stdout)
    return info
