"""Host functions defined through wasmtime's *unchecked* C API, for cheap calls.

wasmtime-py's ``Linker.define_func`` converts every parameter and result through
``Val`` objects and wraps the caller in a ``Caller``; with five ``i32`` parameters that
costs about 15 us a call on these machines.  The ``wasi_ephemeral_nn`` imports take
only ``i32`` values and return one, so this module registers a ctypes callback with
``wasmtime_linker_define_func_unchecked``: the callback reads the raw argument array
in one copy, calls a Python function ``(caller_ptr, context_address, *args) -> int``
and writes the result back in place.

Each callback lives as long as wasmtime's function does, not longer (:mod:`.callbacks`), so an
embedding process that makes a Linker per run holds no callbacks of finished runs.

Only the private ``wasmtime._ffi`` handle of the pinned wasmtime-py release is used;
new function objects are made from the shared library so wasmtime-py's own
prototypes are left untouched.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Callable

import wasmtime
from wasmtime import _ffi as ffi

from ..core.gil_calls import holding_gil
from . import callbacks
from .callbacks import FINALIZER

_dll = ffi.dll

CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
VAL_RAW_SIZE = ctypes.sizeof(ffi.wasmtime_val_raw_t)


def _function(name: str, restype: Any, *argtypes: Any) -> Any:
    func = _dll[name]  # a new function object: wasmtime-py's prototype stays as it is
    func.restype = restype
    func.argtypes = list(argtypes)
    return func


_define_unchecked = _function(
    "wasmtime_linker_define_func_unchecked",
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_size_t,
    ctypes.c_char_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    CALLBACK,
    ctypes.c_void_p,
    FINALIZER,
)
# called on every host call: accessors that return at once keep the GIL (:mod:`..core.gil_calls`)
caller_context = holding_gil(_function("wasmtime_caller_context", ctypes.c_void_p, ctypes.c_void_p))
memory_data = holding_gil(_function("wasmtime_memory_data", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p))
memory_size = holding_gil(_function("wasmtime_memory_data_size", ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p))
_export_get = _function(
    "wasmtime_caller_export_get", ctypes.c_bool, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
)


class MemoryRef:
    """A caller's ``memory`` export as a raw ``wasmtime_memory_t`` (valid for its Store)."""

    __slots__ = ("_item", "ref")

    def __init__(self, item: ffi.wasmtime_extern_t) -> None:
        self._item = item
        self.ref = ctypes.cast(ctypes.byref(item.of.memory), ctypes.c_void_p)

    def base_and_size(self, context: int) -> tuple[int, int]:
        """The memory's current host address and byte length."""
        return memory_data(context, self.ref) or 0, memory_size(context, self.ref)


def caller_memory(caller: int) -> MemoryRef | None:
    """The calling instance's ``memory`` export, or None if it has none."""
    item = ffi.wasmtime_extern_t()
    if not _export_get(caller, b"memory", 6, ctypes.byref(item)):
        return None
    if item.kind != ffi.WASMTIME_EXTERN_MEMORY.value:  # type: ignore[comparison-overlap]  # a ctypes field reads as int
        return None
    return MemoryRef(item)


def trap_pointer(message: str) -> int:
    """A new ``wasm_trap_t`` for wasmtime to raise in the guest."""
    trap = wasmtime.Trap(message)._consume()
    return ctypes.cast(trap, ctypes.c_void_p).value or 0


Handler = Callable[..., int]
"""Called as ``handler(caller_ptr, context_address, *i32_args)``; returns the i32 result or
raises :class:`GuestTrap`."""


class GuestTrap(Exception):
    """Raised by a handler to trap the guest (message shown in the trap)."""


def define_i32_func(linker: wasmtime.Linker, module: str, name: str, arity: int, handler: Handler) -> None:
    """Define ``module.name`` as ``(i32 * arity) -> i32`` calling ``handler``."""
    unpack = struct.Struct("<" + f"I{VAL_RAW_SIZE - 4}x" * arity).unpack
    width = VAL_RAW_SIZE * max(arity, 1)
    string_at = ctypes.string_at
    result_at = ctypes.c_int32.from_address

    def callback(_env: int, caller: int, args: int, _n: int) -> int:
        try:
            params = unpack(string_at(args, width)) if arity else ()
            result_at(args).value = handler(caller, caller_context(caller), *params)
            return 0
        except GuestTrap as trap:
            return trap_pointer(str(trap))
        except BaseException as exc:  # never let an exception cross into C
            return trap_pointer(f"wasi_ephemeral_nn.{name}: host error: {type(exc).__name__}: {exc}")

    native = CALLBACK(callback)
    i32 = wasmtime.ValType.i32()
    functype = wasmtime.FuncType([i32] * arity, [i32])  # copied by wasmtime
    module_b, name_b = module.encode(), name.encode()
    env = callbacks.keep(native)
    error = _define_unchecked(
        linker.ptr(),
        module_b,
        len(module_b),
        name_b,
        len(name_b),
        ctypes.cast(functype.ptr(), ctypes.c_void_p),
        native,
        env,
        callbacks.RELEASE,
    )
    if error:  # wasmtime ran the finalizer already (it drops what it was given)
        callbacks.forget(env)
        raise wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, ctypes.POINTER(ffi.wasmtime_error_t)))
