"""Checked access to the guest's memory during one socket call.

Every pointer and length a guest passes is checked against the memory's current size before
it is used; a bad one is a :class:`~wasinn_host.sockets.table.SockError` with WASI's
``FAULT`` and a log line naming the call and the range.  Data moves with one copy: ``recv``
and ``send`` work on memoryviews of the guest's own bytes.
"""

from __future__ import annotations

import ctypes
import struct

from ..core.gil_calls import memmove
from .constants import IOV_MAX, IOVEC_SIZE, WasiErrno
from .table import SockError

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
U32_MASK = 0xFFFF_FFFF


class GuestView:
    """The guest memory (base address and size) as it is during one host call."""

    __slots__ = ("_base", "_size", "_call")

    def __init__(self, base: int, size: int, call: str) -> None:
        self._base = base
        self._size = size
        self._call = call

    def address(self, ptr: int, length: int, what: str) -> int:
        """The host address of the guest range ``[ptr, ptr + length)``, or FAULT.

        Neither is masked to 32 bits: a guest's ``u32`` arguments arrive unsigned, and a length or
        pointer the host computed from them (``count * 48``, ``record + 24``) is checked as it is, so
        a product past 4 GiB is FAULT (as in WasmEdge, which checks such spans in 64 bits), never a
        short range that wrapped."""
        if ptr < 0 or length < 0 or ptr + length > self._size:
            raise SockError(
                WasiErrno.FAULT,
                f"{self._call}: {what} [{ptr}, {ptr + length}) is outside the guest memory of {self._size} bytes",
            )
        return self._base + ptr

    def read(self, ptr: int, length: int, what: str) -> bytes:
        """Copy ``length`` bytes out of the guest."""
        return ctypes.string_at(self.address(ptr, length, what), length)

    def write(self, ptr: int, data: bytes, what: str) -> None:
        """Copy ``data`` into the guest at ``ptr``."""
        memmove(self.address(ptr, len(data), what), data, len(data))

    def u32(self, ptr: int, what: str) -> int:
        """Read a little-endian ``u32``."""
        return int(_U32.unpack(self.read(ptr, 4, what))[0])

    def put_u16(self, ptr: int, value: int, what: str) -> None:
        """Write a little-endian ``u16``."""
        self.write(ptr, _U16.pack(value & 0xFFFF), what)

    def put_u32(self, ptr: int, value: int, what: str) -> None:
        """Write a little-endian ``u32``."""
        self.write(ptr, _U32.pack(value & U32_MASK), what)

    def put_u64(self, ptr: int, value: int, what: str) -> None:
        """Write a little-endian ``u64``."""
        self.write(ptr, _U64.pack(value & 0xFFFF_FFFF_FFFF_FFFF), what)

    def view(self, ptr: int, length: int, what: str) -> memoryview:
        """A writable memoryview of the guest range (valid until the guest runs again)."""
        address = self.address(ptr, length, what)
        return memoryview((ctypes.c_char * length).from_address(address)).cast("B")

    def iovecs(self, ptr: int, count: int, what: str) -> list[memoryview]:
        """The buffers of an iovec array (``{u32 buf, u32 len}`` each), all checked."""
        count &= U32_MASK
        if count > IOV_MAX:
            raise SockError(WasiErrno.INVAL, f"{self._call}: {count} {what} buffers (at most {IOV_MAX})")
        raw = self.read(ptr, IOVEC_SIZE * count, f"{what} iovec array")
        pairs = struct.unpack(f"<{2 * count}I", raw)
        return [self.view(pairs[2 * i], pairs[2 * i + 1], f"{what} buffer {i}") for i in range(count)]
