"""Checked, fast access to a guest's linear memory.

Each host call takes the memory's base address once (``data_ptr`` may change when the
guest grows its memory, so it is never cached across calls), checks every guest
pointer and length against the current size, and copies with ``ctypes.string_at`` /
``memmove``: one copy, no intermediate ``bytearray``, and neither lets go of the GIL
(:mod:`..core.gil_calls`).  A bad pointer or length
raises :class:`WasiNNError` with an invalid-argument error and never touches memory.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import wasmtime

from ..core.errors import invalid
from ..core.gil_calls import memmove

_U32 = struct.Struct("<I")
U32_MASK = 0xFFFF_FFFF


class GuestMemory:
    """A view of one guest memory during one host call."""

    __slots__ = ("_base", "_size")

    def __init__(self, base: int, size: int) -> None:
        self._base = base
        self._size = size

    @classmethod
    def of(cls, memory: wasmtime.Memory, store: Any) -> "GuestMemory":
        """The current view of a wasmtime-py ``Memory``."""
        return cls(ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0, memory.data_len(store))

    @property
    def size(self) -> int:
        """Current size of the memory in bytes."""
        return self._size

    def check(self, ptr: int, length: int, what: str) -> int:
        """Return the host address of ``[ptr, ptr+length)`` or raise an invalid argument."""
        ptr &= U32_MASK
        length &= U32_MASK
        if ptr + length > self._size:
            raise invalid(f"{what}: guest range [{ptr}, {ptr + length}) is outside memory of {self._size} bytes")
        return self._base + ptr

    def read(self, ptr: int, length: int, what: str) -> bytes:
        """Copy ``length`` bytes out of guest memory."""
        address = self.check(ptr, length, what)
        return ctypes.string_at(address, length & U32_MASK)

    def write(self, ptr: int, data: bytes, what: str) -> None:
        """Copy ``data`` into guest memory at ``ptr``."""
        address = self.check(ptr, len(data), what)
        memmove(address, data, len(data))

    def read_u32s(self, ptr: int, count: int, what: str) -> tuple[int, ...]:
        """Read ``count`` consecutive little-endian ``u32`` values."""
        count &= U32_MASK
        if count > self._size // 4:
            raise invalid(f"{what}: {count} u32 values cannot fit in memory of {self._size} bytes")
        return struct.unpack(f"<{count}I", self.read(ptr, 4 * count, what))

    def write_u32(self, ptr: int, value: int, what: str) -> None:
        """Write one little-endian ``u32``."""
        self.write(ptr, _U32.pack(value & U32_MASK), what)
