"""Python callbacks handed to wasmtime's C API, kept alive exactly as long as wasmtime's function.

A host function defined through the C API (:mod:`.native_func` for core modules, :mod:`.fast_calls`
for components) is given a number and :data:`RELEASE` as its finalizer: :func:`keep` holds the
callback under that number until wasmtime runs the finalizer (when the last Linker and Store holding
the function are dropped), so a process that makes a Linker per run holds no callbacks of finished runs.
"""

from __future__ import annotations

import ctypes
import itertools

FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""A finalizer's C type: ``void (*)(void *data)``."""

KEPT: dict[int, object] = {}
"""The callbacks wasmtime may still call, by their number (each is released by its finalizer)."""
_NEXT = itertools.count(1)


def keep(callback: object) -> int:
    """Hold ``callback`` until :data:`RELEASE` runs with the number returned (give both to wasmtime)."""
    number = next(_NEXT)
    KEPT[number] = callback
    return number


def forget(number: int) -> None:
    """Drop the callback held under ``number`` (wasmtime refused the function: its finalizer ran, or never will)."""
    KEPT.pop(number, None)


def _release(number: int | None, live: dict[int, object] = KEPT) -> None:
    """The finalizer wasmtime runs for a host function: no Linker or Store holds it any more."""
    live.pop(number or 0, None)


RELEASE = FINALIZER(_release)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(RELEASE))
"""Never freed: wasmtime may call it while the interpreter shuts down (a Linker freed late)."""


@FINALIZER
def no_finalizer(_data: int) -> None:
    """A finalizer that does nothing (for callbacks their owner keeps alive itself)."""
    return None
