"""llama.cpp's extra CPU weight layouts ("extra buffer types"): which this build has, and turning one off.

When llama.cpp loads a model for the CPU it moves the weights of each matrix multiplication into the first
of the CPU device's *extra buffer types* that takes them: ``AMX`` (Intel's tile instructions, on builds for a
CPU that has them), ``CPU_REPACK`` (weights interleaved for the AVX2 / AVX-512 / NEON kernels), ``KLEIDIAI``
on Arm; the rest stays in plain CPU memory.  ``llama_model_params.use_extra_bufts = False`` turns all of them
off; nothing in llama.cpp's API turns off one alone.

The CPU backend hands llama.cpp that list as a null-terminated array it keeps for the life of the process
(``ggml_backend_dev_get_extra_bufts``), and every model load walks it.  :func:`disable` rewrites the array in
place without the named types (the others keep their order), so the models loaded afterwards skip them;
weights already loaded keep their layout, and :func:`enable_all` puts the list back as it was.  The
functions are reached through ggml's registry, as :mod:`.devices` does, on the same loaded libraries.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .bindings import ggml_library

CPU_DEVICE_TYPE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
_void_p = ctypes.c_void_p
_BuftArray = ctypes.POINTER(_void_p)
_GetExtraBufts = ctypes.CFUNCTYPE(_BuftArray, _void_p)

_lock = threading.Lock()
_original: list[int] | None = None
"""The array's entries as the CPU backend made them, taken before the first change."""


def _bind() -> tuple[Any, Any]:
    ggml, base = ggml_library("libggml.so"), ggml_library("libggml-base.so")
    for lib, fn, res, args in (
        (ggml, "ggml_backend_dev_by_type", _void_p, [ctypes.c_int]),
        (base, "ggml_backend_dev_backend_reg", _void_p, [_void_p]),
        (base, "ggml_backend_reg_get_proc_address", _void_p, [_void_p, ctypes.c_char_p]),
        (base, "ggml_backend_buft_name", ctypes.c_char_p, [_void_p]),
    ):
        func = getattr(lib, fn)
        func.restype, func.argtypes = res, args
    return ggml, base


_ggml, _base = _bind()


def _array() -> Any:
    """The CPU device's null-terminated array of extra buffer types (``None`` where the build has none)."""
    dev = _ggml.ggml_backend_dev_by_type(CPU_DEVICE_TYPE)
    if not dev:
        return None
    reg = _base.ggml_backend_dev_backend_reg(dev)
    address = _base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
    if not address:
        return None
    array = _GetExtraBufts(address)(dev)
    return array if array else None


def _entries(array: Any) -> list[int]:
    entries: list[int] = []
    while array[len(entries)]:
        entries.append(int(array[len(entries)]))
    return entries


def _name(buft: int) -> str:
    return (_base.ggml_backend_buft_name(buft) or b"?").decode("utf-8", "replace")


def available() -> list[str]:
    """Every extra buffer type the CPU backend of this build has, in the order llama.cpp tries them."""
    with _lock:
        array = _array()
        entries = _original if _original is not None else (_entries(array) if array is not None else [])
        return [_name(b) for b in entries]


def active() -> list[str]:
    """The extra buffer types the next model load will use."""
    with _lock:
        array = _array()
        return [_name(b) for b in _entries(array)] if array is not None else []


def disable(names: list[str] | tuple[str, ...]) -> list[str]:
    """Make the list the next model loads walk the original one without the named buffer types (exactly these
    off, the others on again); returns the names now active."""
    global _original
    with _lock:
        array = _array()
        if array is None:
            return []
        if _original is None:
            _original = _entries(array)
        keep = [b for b in _original if _name(b) not in names]
        for i, buft in enumerate(keep):  # the kept list is never longer: it fits the array as it was made
            array[i] = buft
        array[len(keep)] = None
        return [_name(b) for b in keep]


def enable_all() -> None:
    """Put the list back as the CPU backend made it."""
    with _lock:
        array = _array()
        if array is None or _original is None:
            return
        for i, buft in enumerate(_original):
            array[i] = buft
        array[len(_original)] = None
