"""A vision model's projector on a real GPU backend: with the text model's layers offloaded, libmtmd runs
the CLIP encoder on the device too, and the image still decides the answer as on the CPU (the project's
tiny F32 vision model, greedy).

Run on the software GPU with ``scripts/gpu/vulkan_soft.sh``; skipped, with the reason, without a GPU backend.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.preload import Preload, Target
from wasinn_host.llama import devices
from wasinn_host.testing.vision_models import img_tag, solid_png, write_vision_model

from .gpu_env import GPU_MARKS, gpu_layers, llama_log, offloaded

pytestmark = GPU_MARKS
GREEDY = {"temp": 0, "n-predict": 8}
RED, BLUE = solid_png(255, 0, 0), solid_png(0, 0, 255)


@pytest.fixture(scope="module")
def nn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WasiNN]:
    """``gpu``: the vision model with every layer offloaded; ``cpu``: the same files on the CPU."""
    text, projector = write_vision_model(tmp_path_factory.mktemp("vision"))
    registry = ModelRegistry(
        [
            Preload("gpu", text, target=Target.GPU, mmproj=projector),
            Preload("cpu", text, target=Target.CPU, mmproj=projector),
        ]
    )
    yield WasiNN(registry=registry)
    registry.close()


def answer(nn: WasiNN, name: str, image: bytes) -> str:
    with nn.session(name, GREEDY) as session:
        return session.complete(f"ab {img_tag(image)} cd")


def clip_backends(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The backends libmtmd's CLIP encoder said it uses (``CLIP using <backend> backend``)."""
    return [m[1] for r in caplog.records if (m := re.search(r"CLIP using (\S+) backend", r.getMessage()))]


def test_the_projector_runs_on_the_device_beside_the_offloaded_layers(
    nn: WasiNN, caplog: pytest.LogCaptureFixture
) -> None:
    with llama_log(caplog):
        red = answer(nn, "gpu", RED)
    assert offloaded(caplog) == [(3, 3)]
    gpu_names = {d.name for d in devices.devices() if d.is_gpu}
    assert clip_backends(caplog) and set(clip_backends(caplog)) <= gpu_names, clip_backends(caplog)
    assert gpu_layers(nn.registry, "gpu") == -1
    assert answer(nn, "gpu", BLUE) != red, "the pixels reach the model on the device"
    assert answer(nn, "gpu", RED) == red


def test_the_answer_on_the_device_is_the_cpus(nn: WasiNN, caplog: pytest.LogCaptureFixture) -> None:
    with llama_log(caplog):
        on_cpu = answer(nn, "cpu", RED), answer(nn, "cpu", BLUE)
    assert clip_backends(caplog) == ["CPU"], "the CPU target keeps the projector on the CPU"
    assert (answer(nn, "gpu", RED), answer(nn, "gpu", BLUE)) == on_cpu
