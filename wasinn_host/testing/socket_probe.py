"""A WAT guest that re-exports WasmEdge's socket imports, for socket ABI tests and the socket fuzzer.

Each export ``<name>`` calls the ``wasi_snapshot_preview1`` import of the same name with the
arguments it was given, so a test drives the real socket layer through a real wasm instance with
any pointer, length or descriptor and inspects the guest's memory around the call.  WasmEdge's
functions that come in two forms are imported in one of them per module: :data:`V1` (two-argument
``sock_accept``, 4-argument address getters, 7-argument ``sock_recv_from``) or :data:`V2`.
"""

from __future__ import annotations

import struct
from typing import Literal

import wasmtime

from wasinn_host.sockets import SocketLayer
from wasinn_host.sockets.passthrough import reexport_wat

WASI = "wasi_snapshot_preview1"
PAGE = 65536
COMMON: dict[str, int] = {
    "sock_open": 3,
    "sock_bind": 3,
    "sock_listen": 2,
    "sock_connect": 3,
    "sock_recv": 6,
    "sock_send": 5,
    "sock_send_to": 7,
    "sock_shutdown": 2,
    "sock_setsockopt": 5,
    "sock_getsockopt": 5,
    "sock_getaddrinfo": 8,
    "fd_read": 4,
    "fd_write": 4,
    "fd_close": 1,
    "fd_fdstat_get": 2,
    "fd_fdstat_set_flags": 2,
    "poll_oneoff": 4,
}
V1: dict[str, int] = {"sock_accept": 2, "sock_recv_from": 7, "sock_getlocaladdr": 4, "sock_getpeeraddr": 4}
V2: dict[str, int] = {"sock_accept": 3, "sock_recv_from": 8, "sock_getlocaladdr": 3, "sock_getpeeraddr": 3}
Variant = Literal["v1", "v2"]


def signatures(variant: Variant) -> dict[str, int]:
    """The probe's imports (``name -> i32 parameter count``) in ``variant``."""
    return {**COMMON, **(V1 if variant == "v1" else V2)}


def probe_wat(variant: Variant = "v2", memory_pages: int = 1) -> str:
    """The probe module's text: every socket import re-exported, plus ``clock_time_get``."""
    return reexport_wat(WASI, signatures(variant), memory_pages)


class SocketProbe:
    """One instance of the probe in its own Store, on ``layer`` (a :class:`SocketLayer`)."""

    def __init__(
        self,
        layer: SocketLayer,
        variant: Variant = "v2",
        memory_pages: int = 1,
        module: wasmtime.Module | None = None,
    ) -> None:
        engine = layer.engine
        self.layer = layer
        self.variant: Variant = variant
        module = module or wasmtime.Module(engine, probe_wat(variant, memory_pages))
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        layer.link(linker, module)
        self.store = wasmtime.Store(engine)
        self.store.set_wasi(wasmtime.WasiConfig())
        layer.attach(self.store)
        self.exports = linker.instantiate(self.store, module).exports(self.store)
        memory = self.exports["memory"]
        assert isinstance(memory, wasmtime.Memory)
        self.memory = memory

    def __call__(self, name: str, *args: int) -> int:
        """Call import ``name`` with raw ``u32`` arguments (as the guest would); return its errno."""
        func = self.exports[name]
        assert isinstance(func, wasmtime.Func)
        signed = [a - (1 << 32) if a >= (1 << 31) else a for a in args]
        result = func(self.store, *signed)
        assert isinstance(result, int)
        return result

    def close(self) -> None:
        """Close this guest's sockets now."""
        self.layer.detach(self.store)

    @property
    def size(self) -> int:
        """Bytes of guest memory."""
        return self.memory.data_len(self.store)

    def write(self, ptr: int, data: bytes) -> None:
        """Write ``data`` into guest memory at ``ptr``."""
        self.memory.write(self.store, data, ptr)

    def read(self, ptr: int, length: int) -> bytes:
        """Read ``length`` bytes of guest memory at ``ptr``."""
        return bytes(self.memory.read(self.store, ptr, ptr + length))

    def snapshot(self) -> bytes:
        """The whole guest memory."""
        return self.read(0, self.size)

    def u32(self, ptr: int) -> int:
        """A little-endian ``u32`` of guest memory."""
        return int(struct.unpack("<I", self.read(ptr, 4))[0])


def fd_sub(userdata: int, kind: int, fd: int) -> bytes:
    """A ``poll_oneoff`` subscription on descriptor ``fd`` (kind 1 read, 2 write)."""
    return struct.pack("<QB7xI28x", userdata, kind, fd)


def clock_sub(userdata: int, timeout_ns: int, absolute: bool = False, clock: int = 1, flags: int = 0) -> bytes:
    """A ``poll_oneoff`` clock subscription (monotonic by default)."""
    return struct.pack("<QB7xI4xQQH6x", userdata, 0, clock, timeout_ns, 0, flags | int(absolute))
