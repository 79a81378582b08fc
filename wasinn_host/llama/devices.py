"""The ggml backends and devices compiled into the linked llama.cpp, read through ggml's registry.

llama-cpp-python does not bind ggml's backend registry, so its functions are called through
ctypes on the same ``libggml`` / ``libggml-base`` libraries llama-cpp-python loaded (one
process-wide registry).  Used by ``wasinn info`` and by layer fitting (free GPU memory).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from .bindings import ggml_library, llama_cpp

# enum ggml_backend_dev_type
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
GPU_TYPES = frozenset({"GPU", "IGPU"})


@dataclass(frozen=True)
class Device:
    """One ggml device (a CPU, a GPU ...) and its memory as the backend reports it."""

    name: str
    description: str
    type: str
    backend: str
    free_bytes: int
    total_bytes: int

    @property
    def is_gpu(self) -> bool:
        """A discrete or integrated GPU (where layers are offloaded)."""
        return self.type in GPU_TYPES


def _bind() -> tuple[Any, Any]:
    ggml, base = ggml_library("libggml.so"), ggml_library("libggml-base.so")
    void_p, size_t = ctypes.c_void_p, ctypes.c_size_t
    for lib, fn, res, args in (
        (ggml, "ggml_backend_reg_count", size_t, []),
        (ggml, "ggml_backend_reg_get", void_p, [size_t]),
        (ggml, "ggml_backend_dev_count", size_t, []),
        (ggml, "ggml_backend_dev_get", void_p, [size_t]),
        (base, "ggml_backend_reg_name", ctypes.c_char_p, [void_p]),
        (base, "ggml_backend_dev_name", ctypes.c_char_p, [void_p]),
        (base, "ggml_backend_dev_description", ctypes.c_char_p, [void_p]),
        (base, "ggml_backend_dev_type", ctypes.c_int, [void_p]),
        (base, "ggml_backend_dev_backend_reg", void_p, [void_p]),
        (base, "ggml_backend_dev_memory", None, [void_p, ctypes.POINTER(size_t), ctypes.POINTER(size_t)]),
        (base, "ggml_version", ctypes.c_char_p, []),
        (base, "ggml_type_size", size_t, [ctypes.c_int]),
        (base, "ggml_blck_size", ctypes.c_int64, [ctypes.c_int]),
    ):
        func = getattr(lib, fn)
        func.restype, func.argtypes = res, args
    return ggml, base


_ggml, _base = _bind()


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def backends() -> list[str]:
    """Names of the backends compiled in (``CPU``, ``CUDA``, ``Metal``, ``Vulkan`` ...)."""
    count = _ggml.ggml_backend_reg_count()
    return [_text(_base.ggml_backend_reg_name(_ggml.ggml_backend_reg_get(i))) for i in range(count)]


def devices() -> list[Device]:
    """Every device of every backend, with its free and total memory now."""
    out = []
    for i in range(_ggml.ggml_backend_dev_count()):
        dev = _ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = _base.ggml_backend_dev_type(dev)
        out.append(
            Device(
                name=_text(_base.ggml_backend_dev_name(dev)),
                description=_text(_base.ggml_backend_dev_description(dev)),
                type=DEVICE_TYPES.get(kind, f"type {kind}"),
                backend=_text(_base.ggml_backend_reg_name(_base.ggml_backend_dev_backend_reg(dev))),
                free_bytes=free.value,
                total_bytes=total.value,
            )
        )
    return out


def gpu_free_bytes() -> int:
    """Free memory of every GPU together (llama.cpp spreads offloaded layers over all of them)."""
    return sum(d.free_bytes for d in devices() if d.is_gpu)


def ggml_version() -> str:
    """The version string of ggml (``0.25.3``)."""
    return _text(_base.ggml_version())


def type_size(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml tensor type."""
    return int(_base.ggml_blck_size(ggml_type)), int(_base.ggml_type_size(ggml_type))


def can_offload() -> bool:
    """Whether this build can put layers on a GPU (llama.cpp found a GPU device or RPC)."""
    return bool(llama_cpp.llama_supports_gpu_offload())
