"""Component host functions whose ``list<u8>`` values cross in one copy, not element by element.

wasmtime-py's ``LinkerInstance.add_func`` converts every argument and result through Python
objects; a ``list<u8>`` becomes a Python ``int`` per byte (1 MiB in and out: about 3 s).  Here
the callback is registered with the C API's ``wasmtime_component_linker_instance_add_func``
directly, and byte lists are read and written as whole arrays of ``wasmtime_component_val_t``:

* in: the list's values are one C array; the byte of element *i* sits at a fixed offset in its
  slot, so a strided NumPy view picks all of them out at once;
* out: ``wasmtime_component_vallist_new_uninit`` allocates the array and a strided NumPy view
  writes every slot's kind tag and byte at once.

Every other parameter and result goes through wasmtime-py's own conversions (resources,
variants, enums, strings).  Only the private ``wasmtime._ffi`` handle and the ``catch_exceptions``
helper of the pinned wasmtime-py release are used, as ``ephemeral/native_func.py`` does.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np
from wasmtime import StoreContext, WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import U8, FuncType, LinkerInstance, ListType, ValType
from wasmtime.component._enter import catch_exceptions

VAL_SIZE = ctypes.sizeof(ffi.wasmtime_component_val_t)
PAYLOAD_OFFSET = ffi.wasmtime_component_val_t.of.offset
KIND_U8 = int(ffi.WASMTIME_COMPONENT_U8.value)
KIND_LIST = int(ffi.WASMTIME_COMPONENT_LIST.value)

HostFunc = Callable[..., Any]
"""Called as ``func(store, *args)``; ``list<u8>`` arguments arrive as ``bytes`` (``list<list<u8>>``
as a list of ``bytes``), a ``list<u8>`` result may be ``bytes``, ``bytearray`` or ``memoryview``."""

_KEEP_ALIVE: list[object] = []  # callbacks must outlive every Linker and Store using them


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _no_finalizer(_data: int) -> None:
    return None


def _slots(address: int, count: int) -> np.ndarray:
    """``count`` C values at ``address`` as a (count, VAL_SIZE) byte matrix (a view, no copy)."""
    buffer = (ctypes.c_uint8 * (count * VAL_SIZE)).from_address(address)
    return np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8).reshape(count, VAL_SIZE)


def read_bytes(value: ffi.wasmtime_component_val_t) -> bytes:
    """The bytes of a ``list<u8>`` C value (left in place: wasmtime frees it after the call)."""
    items = value.of.list
    count = int(items.size)
    if count == 0:
        return b""
    address = ctypes.cast(items.data, ctypes.c_void_p).value or 0
    return _slots(address, count)[:, PAYLOAD_OFFSET].tobytes()


def write_bytes(data: bytes | bytearray | memoryview, out: ffi.wasmtime_component_val_t) -> None:
    """Make ``out`` a ``list<u8>`` C value holding ``data`` (wasmtime takes it over)."""
    items = ffi.wasmtime_component_vallist_t()
    count = len(data)
    ffi.wasmtime_component_vallist_new_uninit(ctypes.byref(items), count)
    if count:
        slots = _slots(ctypes.cast(items.data, ctypes.c_void_p).value or 0, count)
        slots[:, 0] = KIND_U8
        slots[:, PAYLOAD_OFFSET] = np.frombuffer(data, dtype=np.uint8)
    out.kind = KIND_LIST
    out.of.list = items


def _is_bytes(ty: ValType) -> bool:
    return isinstance(ty, ListType) and isinstance(ty.element, U8)


def _read(ty: ValType, value: ffi.wasmtime_component_val_t) -> Any:
    """A parameter as Python: byte lists (and lists of them) fast, anything else as wasmtime-py does."""
    if isinstance(ty, ListType):
        element = ty.element
        if isinstance(element, U8):
            return read_bytes(value)
        if _is_bytes(element):
            items = value.of.list
            return [read_bytes(items.data[i]) for i in range(int(items.size))]
    return ty.convert_from_c(value)


def add_fast_func(instance: LinkerInstance, name: str, func: HostFunc) -> None:
    """Define ``name`` on ``instance`` like ``LinkerInstance.add_func``, with byte lists in one copy."""

    def callback(_data: int, context: Any, ty_raw: Any, args: Any, nargs: int, results: Any, nresults: int) -> int:
        def run(store: StoreContext) -> None:
            with FuncType._from_ptr(ty_raw, owner=store) as fty:
                params = [_read(ty, args[i]) for (_name, ty), i in zip(fty.params, range(nargs))]
                result = func(store, *params)
                result_ty = fty.result
                if result_ty is None:
                    return
                if _is_bytes(result_ty) and isinstance(result, (bytes, bytearray, memoryview)):
                    write_bytes(result, results[0])
                else:
                    result_ty.convert_to_c(store, result, results)

        return int(catch_exceptions(context, run))

    native = ffi.wasmtime_component_func_callback_t(callback)
    _KEEP_ALIVE.append(native)
    encoded = name.encode()
    error = ffi.wasmtime_component_linker_instance_add_func(
        instance.ptr(), ctypes.create_string_buffer(encoded), len(encoded), native, None, _no_finalizer
    )
    if error:
        raise WasmtimeError._from_ptr(error)
