"""Component host functions whose ``list<u8>`` values cross in one copy, not element by element.

wasmtime-py's ``LinkerInstance.add_func`` converts every argument and result through Python
objects; a ``list<u8>`` becomes a Python ``int`` per byte (1 MiB in and out: about 3 s).  Here
the callback is registered with the C API's ``wasmtime_component_linker_instance_add_func``
directly, and byte lists are read and written as whole arrays of ``wasmtime_component_val_t``:

* in: the list's values are one C array; the byte of element *i* sits at a fixed offset in its
  slot, so a strided NumPy view picks all of them out at once;
* out: the array is allocated with the C library's ``malloc`` where wasmtime's own allocator is
  that ``malloc`` (checked once, :func:`rust_allocates_with_malloc`; wasmtime frees the array after
  the call), else with ``wasmtime_component_vallist_new_uninit`` (which initialises every slot
  first: 5-6 ms per MiB more), and a strided NumPy view writes every slot's kind tag and byte at once.

What is left is wasmtime's: it lifts a guest's list into one 48-byte ``Val`` per byte, converts
each to a 32-byte C value and back, and lowers results element by element (about 45 ms per MiB in
and out here, see the README).  Those 80 MB of short-lived buffers are fresh pages from the kernel
on every call unless the C library keeps freed memory: :func:`keep_list_heap` asks glibc to.

Each callback is released by wasmtime's finalizer of its function (:mod:`.callbacks`), so Linkers
made and dropped again hold no callbacks.  Every other
parameter and result goes through wasmtime-py's own conversions (resources, variants, enums,
strings).  Only the private ``wasmtime._ffi`` handle and the ``catch_exceptions`` helper of the
pinned wasmtime-py release are used, as :mod:`.native_func` does.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from typing import Any, Callable

import numpy as np
from wasmtime import StoreContext, WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import U8, FuncType, LinkerInstance, ListType, ValType
from wasmtime.component._enter import catch_exceptions

from . import callbacks

VAL_SIZE = ctypes.sizeof(ffi.wasmtime_component_val_t)
PAYLOAD_OFFSET = ffi.wasmtime_component_val_t.of.offset
KIND_U8 = int(ffi.WASMTIME_COMPONENT_U8.value)
KIND_LIST = int(ffi.WASMTIME_COMPONENT_LIST.value)

M_TOP_PAD = -2
M_ARENA_MAX = -8
DEFAULT_HEAP_PAD = 128 << 20
"""What :func:`keep_list_heap` keeps: a 1 MiB list in and out needs about 80 MiB of buffers."""

HostFunc = Callable[..., Any]
"""Called as ``func(store, *args)``; ``list<u8>`` arguments arrive as ``bytes`` (``list<list<u8>>``
as a list of ``bytes``), a ``list<u8>`` result may be ``bytes``, ``bytearray`` or ``memoryview``."""


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
    malloc = _malloc() if count else None
    if malloc is not None:
        address = malloc(count * VAL_SIZE)
        if not address:
            raise MemoryError(f"malloc of a {count}-element list<u8> failed")
        items.size = count
        items.data = ctypes.cast(address, ctypes.POINTER(ffi.wasmtime_component_val_t))
    else:
        ffi.wasmtime_component_vallist_new_uninit(ctypes.byref(items), count)
    if count:
        slots = _slots(ctypes.cast(items.data, ctypes.c_void_p).value or 0, count)
        slots[:, 0] = KIND_U8
        slots[:, PAYLOAD_OFFSET] = np.frombuffer(data, dtype=np.uint8)
    out.kind = KIND_LIST
    out.of.list = items


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc 2.33 or later (``mallinfo2``, ``mallopt``), else None."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        libc.mallinfo2.argtypes = []
    except (OSError, AttributeError):
        return None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.mallopt.restype = ctypes.c_int
    libc.free.restype = None
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def _heap_in_use(libc: ctypes.CDLL) -> int:
    info = libc.mallinfo2()
    return int(info.uordblks) + int(info.hblkhd)


@functools.cache
def rust_allocates_with_malloc() -> bool:
    """Whether wasmtime's Rust allocator is this process's glibc ``malloc`` (so it may free our arrays).

    Measured, not assumed: a 1 MiB list from ``wasmtime_component_vallist_new_uninit`` must show up
    in glibc's own count of bytes in use, and leave it when deleted.
    """
    libc = _glibc()
    if libc is None:
        return False
    count = 1 << 15
    size = count * VAL_SIZE
    items = ffi.wasmtime_component_vallist_t()
    before = _heap_in_use(libc)
    ffi.wasmtime_component_vallist_new_uninit(ctypes.byref(items), count)
    grown = _heap_in_use(libc) - before
    ffi.wasmtime_component_vallist_delete(ctypes.byref(items))
    freed = _heap_in_use(libc) - before
    return size <= grown <= size + (64 << 10) and abs(freed) < (64 << 10)


def _malloc() -> Callable[[int], int | None] | None:
    """The C library's ``malloc`` when wasmtime frees with it, else None."""
    libc = _glibc()
    return libc.malloc if libc is not None and rust_allocates_with_malloc() else None


def keep_list_heap(pad: int = DEFAULT_HEAP_PAD) -> bool:
    """Have glibc keep ``pad`` bytes of freed heap instead of returning them to the kernel.

    Process-wide, so an embedder's choice, best made at start-up before other threads exist:
    glibc's ``M_TOP_PAD`` (freed memory at the top of the heap stays mapped, up to ``pad`` bytes),
    ``M_ARENA_MAX`` 1 (threads allocate from that same heap; guests run in threads), and the heap
    grown by ``pad`` at once (its pages are not touched), so that the first large list fits in it
    instead of getting pages of its own.  Without it, each 1 MiB ``list<u8>`` crossing maps about
    80 MB of fresh pages (20,000 page faults, about 35 ms per direction here).  The cost: up to
    ``pad`` bytes of resident memory stay with the process after a large call.  Returns False (and
    changes nothing) where the C library is not glibc.
    """
    libc = _glibc()
    if libc is None:
        return False
    if not (libc.mallopt(M_TOP_PAD, pad) and libc.mallopt(M_ARENA_MAX, 1)):
        return False
    block = 64 << 10  # under glibc's smallest mmap threshold: these come from the heap
    blocks = [libc.malloc(block) for _ in range(pad // block)]
    for address in blocks:
        libc.free(address)
    return True


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
    data = callbacks.keep(native)
    encoded = name.encode()
    error = ffi.wasmtime_component_linker_instance_add_func(
        instance.ptr(), ctypes.create_string_buffer(encoded), len(encoded), native, data, callbacks.RELEASE
    )
    if error:  # wasmtime ran the finalizer already, or never will
        callbacks.forget(data)
        raise WasmtimeError._from_ptr(error)
