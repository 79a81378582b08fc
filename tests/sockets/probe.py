"""The socket probe: a WAT module re-exporting WasmEdge's socket imports, instantiated through the
embedding API so a test calls each import with the arguments it chooses (tests/sockets/test_socket_probe.py)."""

from __future__ import annotations

import os
import pathlib
import selectors
import socket
import struct
import time

import wasmtime

from wasinn_host import ListenerGroup, WasiNN
from wasinn_host.sockets.passthrough import reexport_wat

WASI = "wasi_snapshot_preview1"
PROBE_IMPORTS = {
    "sock_open": 3,
    "sock_bind": 3,
    "sock_listen": 2,
    "sock_accept": 3,  # V2 / preview 1 (the C guest covers V1)
    "sock_connect": 3,
    "sock_recv": 6,
    "sock_send": 5,
    "sock_shutdown": 2,
    "sock_getlocaladdr": 3,  # V2
    "sock_getpeeraddr": 4,  # V1
    "sock_setsockopt": 5,
    "sock_getsockopt": 5,
    "sock_recv_from": 7,  # V1
    "sock_send_to": 7,
    "sock_getaddrinfo": 8,
    "fd_write": 4,
    "fd_close": 1,
    "fd_fdstat_get": 2,
    "fd_fdstat_set_flags": 2,
    "poll_oneoff": 4,
}
FAULT, ACCES, AGAIN, BADF, INVAL, NOSYS, NOTSUP = 21, 2, 6, 8, 28, 52, 58
FD, ADDR, ADDR_BYTES, STORAGE, IOV, DATA, OUT = 0, 16, 32, 64, 256, 512, 1024


def probe_wat() -> str:
    """The probe module: each of PROBE_IMPORTS re-exported (the socket layer's own re-export builder)."""
    return reexport_wat(WASI, PROBE_IMPORTS, 1)


class Probe:
    """The probe instantiated through the embedding API (own Linker, ``nn.sockets.link``)."""

    def __init__(self, nn: WasiNN, stdout: pathlib.Path, listeners: ListenerGroup | None = None) -> None:
        self.nn = nn
        module = wasmtime.Module(nn.engine, probe_wat())
        linker = wasmtime.Linker(nn.engine)
        linker.define_wasi()
        nn.add_to_linker(linker)
        nn.sockets.link(linker, module)
        self.store = wasmtime.Store(nn.engine)
        wasi = wasmtime.WasiConfig()
        wasi.stdout_file = str(stdout)
        self.store.set_wasi(wasi)
        nn.attach(self.store, listeners=listeners)
        self.exports = linker.instantiate(self.store, module).exports(self.store)
        memory = self.exports["memory"]
        assert isinstance(memory, wasmtime.Memory)
        self.memory = memory

    def __call__(self, name: str, *args: int) -> int:
        func = self.exports[name]
        assert isinstance(func, wasmtime.Func)
        result = func(self.store, *args)
        assert isinstance(result, int)
        return result

    def write(self, ptr: int, data: bytes) -> None:
        self.memory.write(self.store, data, ptr)

    def read(self, ptr: int, length: int) -> bytes:
        return bytes(self.memory.read(self.store, ptr, ptr + length))

    def u32(self, ptr: int) -> int:
        return int(struct.unpack("<I", self.read(ptr, 4))[0])

    def socket(self, kind: int = 2) -> int:
        assert self("sock_open", 1, kind, FD) == 0
        return self.u32(FD)

    def address(self, ip: str) -> int:
        """The V1 address struct at ADDR naming ``ip``."""
        self.write(ADDR_BYTES, socket.inet_aton(ip))
        self.write(ADDR, struct.pack("<II", ADDR_BYTES, 4))
        return ADDR

    def iovec(self, data: bytes, ptr: int = DATA) -> int:
        self.write(ptr, data)
        self.write(IOV, struct.pack("<II", ptr, len(data)))
        return IOV

    def listener(self) -> tuple[int, int]:
        fd = self.socket()
        assert self("sock_bind", fd, self.address("127.0.0.1"), 0) == 0
        assert self("sock_listen", fd, 5) == 0
        self.write(ADDR, struct.pack("<II", STORAGE, 128))
        assert self("sock_getlocaladdr", fd, ADDR, OUT) == 0  # V2: a 128-byte storage
        storage = self.read(STORAGE, 6)
        assert storage == struct.pack("<H", 1) + socket.inet_aton("127.0.0.1")
        return fd, self.u32(OUT)

    def poll(self, subs: list[bytes]) -> list[tuple[int, int, int, int, int]]:
        """poll_oneoff over packed subscriptions: (userdata, error, type, nbytes, flags) per event."""
        self.write(OUT, b"".join(subs))
        events_ptr, count_ptr = OUT + 48 * len(subs), OUT + 48 * len(subs) + 32 * len(subs)
        assert self("poll_oneoff", OUT, events_ptr, len(subs), count_ptr) == 0
        raw = self.read(events_ptr, 32 * self.u32(count_ptr))
        return [struct.unpack_from("<QHBxxxxxQH6x", raw, i) for i in range(0, len(raw), 32)]


def fd_sub(userdata: int, kind: int, fd: int) -> bytes:
    return struct.pack("<QB7xI28x", userdata, kind, fd)


def clock_sub(userdata: int, timeout_ns: int, absolute: bool = False) -> bytes:
    return struct.pack("<QB7xI4xQQH6x", userdata, 0, 1, timeout_ns, 0, int(absolute))


def id_of(store: wasmtime.Store) -> int:
    from wasinn_host.guest.store_tables import store_key

    return store_key(store)


def probe_port(probe: Probe, fd: int) -> int:
    probe.write(ADDR, struct.pack("<II", STORAGE, 128))
    assert probe("sock_getlocaladdr", fd, ADDR, OUT + 500) == 0
    return probe.u32(OUT + 500)


def getaddrinfo(probe: Probe, node: bytes, service: bytes) -> tuple[int, list[bytes]]:
    """sock_getaddrinfo for a STREAM socket into two pre-linked records; (errno, each record's sockaddr data)."""
    probe.write(2000, node)
    probe.write(2032, service)
    probe.write(2048, struct.pack("<HBBBxxxIIIII", 0, 0, 2, 0, 0, 0, 0, 0, 0))  # hints: SOCK_STREAM
    probe.write(2100, struct.pack("<I", 2200))
    probe.write(2200, struct.pack("<HBBBxxxIIIII", 0, 0, 0, 0, 0, 2400, 0, 0, 2300))
    probe.write(2300, struct.pack("<HBBBxxxIIIII", 0, 0, 0, 0, 0, 2600, 0, 0, 0))
    probe.write(2400, struct.pack("<BxxxII", 0, 26, 2500))
    probe.write(2600, struct.pack("<BxxxII", 0, 26, 2700))
    code = probe("sock_getaddrinfo", 2000, len(node), 2032, len(service), 2048, 2100, 2, 2800)
    if code:
        return code, []
    records = []
    for record, sockaddr in ((2200, 2400), (2300, 2600))[: probe.u32(2800)]:
        head = probe.read(record, 12)
        data = probe.read(probe.u32(sockaddr + 8), 14)
        records.append(head[2:5] + head[8:9] + probe.read(sockaddr, 1) + data)
    return 0, records


def read_line(stream: object, timeout: float) -> bytes:
    """One line from a child process's pipe, or what came before ``timeout`` seconds or the end."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
    line = b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n") and selector.select(max(0.0, deadline - time.monotonic())):
        chunk = os.read(stream.fileno(), 1)  # type: ignore[attr-defined]
        if not chunk:
            break
        line += chunk
    return line
