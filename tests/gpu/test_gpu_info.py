"""``wasinn info`` on a build with a GPU backend: the backend, the GPU device with its memory, offload on.

Run on the software GPU with ``scripts/gpu/vulkan_soft.sh``; skipped, with the reason, without a GPU backend.
"""

from __future__ import annotations

from wasinn_host.llama import devices

from .gpu_env import GPU_MARKS, info_json, wasinn

pytestmark = GPU_MARKS


def test_info_json_lists_the_gpu_device_with_its_memory_and_offload_true() -> None:
    info = info_json()
    assert info["gpu_offload"] is True
    assert "gpu_hint" not in info, "no install hint on a build that offloads"
    gpus = [d for d in info["devices"] if d["type"] in ("GPU", "IGPU")]
    assert gpus, info["devices"]
    for gpu in gpus:
        assert gpu["backend"] in info["backends"] and gpu["backend"] != "CPU"
        assert 0 < gpu["free_bytes"] <= gpu["total_bytes"]
        assert gpu["name"] and gpu["description"]
    assert [d["name"] for d in info["devices"]] == [d.name for d in devices.devices()]
    if "llvmpipe" in gpus[0]["description"]:  # Mesa's lavapipe: a fixed 2,048 MiB, reported as a GPU
        assert gpus[0]["backend"] == "Vulkan" and gpus[0]["free_bytes"] == gpus[0]["total_bytes"] == 2048 << 20


def test_info_text_says_offload_works_and_names_the_device() -> None:
    result = wasinn("info")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (offload,) = [line for line in lines if line.startswith("GPU offload")]
    assert "yes" in offload, offload
    gpu = next(d for d in devices.devices() if d.is_gpu)
    assert any(line.strip().startswith(f"{gpu.name} (") and "free of" in line for line in lines), result.stdout
    assert "CMAKE_ARGS" not in result.stdout
