"""A hypothesis state machine that fuzzes WasmEdge's socket imports through a real wasm instance.

Used by ``tests/sockets/test_socket_fuzz.py`` (a short, derandomized CI run) and ``scripts/tools/fuzz_sockets.py``
(long runs, any seed), the way :mod:`wasinn_host.testing.fuzz.abi` fuzzes ``wasi_ephemeral_nn``.

Each example instantiates the socket probe (:mod:`.socket_probe`, V1 or V2 forms) in a fresh Store
and makes hostile random calls of every socket import and the descriptor functions sockets share:
pointers inside memory, at its edges, past it and absurd; lengths and counts off by one, past
``IOV_MAX`` and near 2**32; live, closed, wasmtime's and made-up descriptors; every option with
timeouts from 0 to i64::MAX, linger and int values; ``poll_oneoff`` subscriptions mixing sockets,
wasmtime's descriptors, clocks of 0 to u64::MAX ns (relative and absolute), bad clocks, flags and
tags, with counts up to 2**32 - 1; ``sock_getaddrinfo`` names that are numbers, ``localhost``, no
host names at all (a 64-character label, ``ff fe``, 300 characters, a NUL) or random bytes, into
pre-linked records with wild pointers.  Everything stays on loopback: binds are the policy's
loopback, connections and datagrams go to the fuzzer's own sockets (:mod:`.socket_peers`), the
guest's listeners or a closed port, and names resolve only numerically (``localhost`` from the
hosts file).

Checked after every call:

* it returned an errno of WASI's set (with WasmEdge's getaddrinfo codes), never a trap: the only traps
  allowed are wasmtime's own, for a descriptor that is not a socket (its functions trap on pointers
  out of bounds, as WASI's witx documents say they may);
* guest memory changed only inside the ranges the call names for output (:mod:`.socket_ranges`),
  so the host neither wrote where it should not nor, since a write past the memory's end would crash
  the process, outside memory;
* the call logged at most one line at WARNING or above, none at ERROR (an exception no socket
  function meant to raise: a host bug), and no line holds a newline;
* a new descriptor is numbered from 65536 and never handed out twice in a Store;
* the process neither crashed nor hung: a call that blocks is nudged by the peers, then cancelled
  (the example ends there), and one that still does not return dumps every stack and exits.

After each example the Store's sockets are closed, and the host's table holds none of them.  What is
drawn lives in :mod:`.socket_values`, the run's shared parts in :mod:`.socket_env`.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import time
from typing import Any, ClassVar

import numpy as np
import wasmtime
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from wasinn_host.guest.store_tables import store_key
from wasinn_host.sockets.constants import WasiErrno
from wasinn_host.sockets.linking import PASS_THROUGH
from wasinn_host.sockets.table import SOCKET_FD_BASE, SocketState
from wasinn_host.testing.fuzz.runs import run_machine
from wasinn_host.testing.fuzz.socket_env import SocketFuzzEnv, SocketFuzzStats, make_env
from wasinn_host.testing.fuzz.socket_ranges import writable_ranges
from wasinn_host.testing.fuzz.socket_values import (
    ADDRESSES,
    BAD_FDS,
    CLOCK_IDS,
    DAY_NS,
    I32S,
    I64,
    LINGERS,
    MEM,
    NODES,
    SERVICES,
    SHORT_NS,
    TIMEVALS,
    U32,
    U64,
    length_for,
    ptr_for,
    short_clock,
    u32s,
    weighted,
)
from wasinn_host.testing.socket_probe import SocketProbe, Variant, signatures

VALID_ERRNOS = frozenset(int(code) for code in WasiErrno) | frozenset(range(0, 77))
"""WASI preview 1's errno (0..76, wasmtime's own functions may give any) and WasmEdge's getaddrinfo codes."""


# -- the machine ------------------------------------------------------------------------------------


class SocketFuzzMachine(RuleBasedStateMachine):
    """Random hostile sequences of socket calls on one fresh guest."""

    ENV: ClassVar[SocketFuzzEnv]

    def __init__(self) -> None:
        super().__init__()
        self.env = self.ENV
        self.probe: SocketProbe | None = None
        self.state: SocketState | None = None
        self.variant: Variant = "v2"
        self.shadow = bytearray(MEM)
        self.issued: set[int] = set()
        self.cancelled = False
        self.wild = True
        self.cursor = 0

    # -- set-up and memory --------------------------------------------------------------------

    @initialize(variant=st.sampled_from(["v1", "v2"]), data=st.data())
    def start(self, variant: Variant, data: st.DataObject) -> None:
        """A fresh guest in V1 or V2 form, holding some of: a listener, a connection to the peers, a
        bound datagram socket (so the random calls that follow reach past "no such socket")."""
        self.variant = variant
        self.probe = SocketProbe(self.env.layer, variant, module=self.env.modules[variant])
        assert self.probe.size == MEM
        self.state = self.env.layer.stores.lookup(store_key(self.probe.store))
        assert self.state is not None
        self.shadow = bytearray(self.memory())
        self.env.stats.examples += 1
        listener_port, udp_port, _ = self.env.peers.ports
        for kind, port, then in (
            (2, 0, "listen"),
            (2, listener_port, "connect"),
            (1, 0, "bind"),
            (1, udp_port, "connect"),
        ):
            if not data.draw(st.booleans(), label=f"{then} {kind}"):
                continue
            if self.call("sock_open", 1, kind, 0) != 0:
                continue
            fd = struct.unpack("<I", self.memory()[:4])[0]
            self.issued.add(fd)
            self.put(16, struct.pack("<II", 24, 4) + socket.inet_aton("127.0.0.1"))
            verb = "sock_connect" if then == "connect" else "sock_bind"
            if self.call(verb, fd, 16, port) == 0 and then == "listen":
                self.call("sock_listen", fd, 8)

    def _base(self) -> int:
        assert self.probe is not None
        return ctypes.addressof(self.probe.memory.data_ptr(self.probe.store).contents)

    def memory(self) -> bytes:
        """The whole guest memory now."""
        return ctypes.string_at(self._base(), MEM)

    def put(self, ptr: int, data: bytes) -> None:
        """Write what fits of ``data`` at ``ptr`` (nothing if ``ptr`` is outside memory)."""
        if ptr < MEM and data:
            n = min(len(data), MEM - ptr)
            ctypes.memmove(self._base() + ptr, data, n)
            self.shadow[ptr : ptr + n] = data[:n]

    def draw_wild(self, data: st.DataObject) -> None:
        """Two calls in three name only valid memory (so sequences get deep); the rest go wild."""
        self.wild = data.draw(weighted((2, st.just(False)), (1, st.just(True))), label="wild")
        self.cursor = 8 * data.draw(st.integers(0, (MEM // 2) // 8), label="layout")

    def ptr(self, data: st.DataObject, n: int, label: str) -> int:
        """A pointer for ``n`` bytes: in a valid call, the next 8-aligned place of this call's layout (the
        structures of one call do not overlap); in a wild one, anywhere, at the edges or past them."""
        if self.wild:
            return int(data.draw(ptr_for(n, True), label=label))
        if self.cursor + n > MEM:
            self.cursor = 0
        ptr, self.cursor = self.cursor, self.cursor + ((n + 7) & ~7) + 8
        return ptr

    def length(self, data: st.DataObject, n: int, label: str) -> int:
        """A length or count near ``n``."""
        return int(data.draw(length_for(n, self.wild), label=label))

    def fd(self, data: st.DataObject, label: str = "fd") -> int:
        """A live socket mostly; else a closed one, one of wasmtime's, or a made-up number."""
        assert self.state is not None
        choices: list[tuple[int, st.SearchStrategy[Any]]] = [(1, st.sampled_from(BAD_FDS))]
        if self.state.entries:
            choices.append((10, st.sampled_from(sorted(self.state.entries))))
        if self.issued:
            choices.append((1, st.sampled_from(sorted(self.issued))))
        if self.wild:
            choices.append((1, u32s))
        return int(data.draw(weighted(*choices), label=label))

    # -- the checked call ---------------------------------------------------------------------

    def call(self, name: str, *args: int, delegated: bool | None = None) -> int | None:
        """Call import ``name`` through the guest and check what it did; None: wasmtime trapped, which
        only a call the socket layer hands to wasmtime may (``delegated``: by default, one of the
        functions wasmtime also has, on a descriptor that is not a socket)."""
        probe, state, env = self.probe, self.state, self.env
        assert probe is not None and state is not None and not self.cancelled
        if delegated is None:
            delegated = name in PASS_THROUGH and bool(args) and args[0] not in state.entries
        env.logs.take()
        before = bytes(self.shadow)
        rc: int | None = None
        started = time.perf_counter()
        with env.watch.call(state) as watch:
            try:
                rc = probe(name, *args)
            except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
                first = str(exc).strip().splitlines()
                if not delegated or "host error" in str(exc):
                    raise AssertionError(f"{name}{args} trapped the guest: {' | '.join(first)[:500]}") from None
                env.stats.wasmtime_traps += 1
        seconds = time.perf_counter() - started
        after = self.memory()
        self._check_memory(name, args, before, after)
        self.shadow[:] = after
        self._check_log(name, args)
        if watch.nudged:
            env.stats.nudged += 1
        if watch.cancelled:
            self.cancelled = True
            env.stats.cancels += 1
        if rc is None:
            return None
        assert rc in VALID_ERRNOS, f"{name}{args} returned {rc}, not a WASI errno"
        env.stats.record(name, rc, seconds)
        return rc

    def _check_memory(self, name: str, args: tuple[int, ...], before: bytes, after: bytes) -> None:
        changed = np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8)
        if not changed.any():
            return
        allowed = np.zeros(MEM, bool)
        for mem in (before, after):
            for start, length in writable_ranges(name, self.variant, args, mem):
                if start < MEM and length > 0:
                    allowed[start : min(MEM, start + length)] = True
        stray = np.flatnonzero(changed & ~allowed)
        assert not stray.size, (
            f"{name}{args} changed guest bytes it names no output for: {stray[:8].tolist()} "
            f"({stray.size} in all; allowed {writable_ranges(name, self.variant, args, before)})"
        )

    def _check_log(self, name: str, args: tuple[int, ...]) -> None:
        records = self.env.logs.take()
        lines = [r.getMessage() for r in records]
        self.env.stats.warnings += bool(records)
        assert len(records) <= 1, f"{name}{args} logged {len(records)} lines: {lines}"
        assert not any(r.levelno >= logging.ERROR for r in records), f"{name}{args} logged a host error: {lines}"
        assert not any("\n" in line for line in lines), f"{name}{args} logged a line with a newline: {lines}"

    def new_fd(self, rc: int | None, fd_ptr: int) -> None:
        """After ``sock_open``/``sock_accept``: a success wrote a fresh descriptor from 65536 up."""
        if rc != 0:
            return
        assert self.state is not None
        fd = struct.unpack("<I", self.memory()[fd_ptr : fd_ptr + 4])[0]
        assert fd >= SOCKET_FD_BASE and fd not in self.issued, f"descriptor {fd} is not a fresh socket number"
        assert fd in self.state.entries
        self.issued.add(fd)

    # -- guest structures ---------------------------------------------------------------------

    def address(self, data: st.DataObject) -> int:
        """A ``{buf, buf_len}`` naming an address (4 or 16 raw bytes, or the 128-byte storage)."""
        raw = data.draw(weighted((9, st.sampled_from(ADDRESSES)), (1, st.binary(max_size=20))), label="address")
        form = data.draw(st.sampled_from(["raw", "raw", "storage"]), label="form")
        if form == "storage":
            family = 1 if len(raw) == 4 else 2 if len(raw) == 16 else data.draw(st.integers(0, 0xFFFF))
            raw = (struct.pack("<H", family) + raw).ljust(128, b"\0")
        buf = self.ptr(data, len(raw), "address buf")
        self.put(buf, raw)
        struct_ptr = self.ptr(data, 8, "address struct")
        self.put(struct_ptr, struct.pack("<II", buf, self.length(data, len(raw), "address len")))
        return struct_ptr

    def out_address(self, data: st.DataObject) -> int:
        """A ``{buf, buf_len}`` for the host to write an address into."""
        length = data.draw(st.sampled_from([4, 16, 128, 128, 0, 17, 200]), label="room")
        buf = self.ptr(data, length, "out buf")
        struct_ptr = self.ptr(data, 8, "out struct")
        self.put(struct_ptr, struct.pack("<II", buf, self.length(data, length, "out len")))
        return struct_ptr

    def port(self, data: st.DataObject, binding: bool) -> int:
        """A port: 0 (binding), the peers' ports, a guest listener's, or out of range."""
        assert self.state is not None
        known = list(self.env.peers.ports)
        for entry in list(self.state.entries.values()):
            try:
                if entry.sock.getsockname()[1]:
                    known.append(entry.sock.getsockname()[1])
            except OSError:
                pass
        choices: list[tuple[int, st.SearchStrategy[Any]]] = [(8 if binding else 1, st.just(0))]
        choices.append((2 if binding else 9, st.sampled_from(known)))
        choices.append((1, st.sampled_from([65536, 0x7FFF_FFFF, U32])))
        return int(data.draw(weighted(*choices), label="port"))

    def iovecs(self, data: st.DataObject, sending: bool) -> tuple[int, int]:
        """An iovec array of 0 to 4 buffers (filled with bytes when ``sending``); (ptr, count)."""
        count = data.draw(weighted((6, st.just(1)), (2, st.integers(0, 4))), label="buffers")
        pairs: list[int] = []
        for i in range(count):
            size = data.draw(st.sampled_from([0, 1, 5, 64, 1500, 4096, 65536]), label=f"size {i}")
            buf = self.ptr(data, size, f"buf {i}")
            if sending:
                self.put(buf, data.draw(st.binary(min_size=min(size, 16), max_size=min(size, 16)), label="bytes"))
            pairs += [buf, self.length(data, size, f"len {i}")]
        array = self.ptr(data, 8 * count, "iovec array")
        self.put(array, struct.pack(f"<{len(pairs)}I", *pairs))
        return array, self.length(data, count, "iovec count")

    def subscription(self, data: st.DataObject, index: int) -> tuple[bytes, bool]:
        """One packed subscription, and whether it names a live socket."""
        assert self.state is not None
        userdata = data.draw(st.integers(0, U64), label="userdata")
        kind = data.draw(
            weighted((4, st.just("socket")), (1, st.just("other")), (4, st.just("clock")), (1, st.just("tag"))),
            label=f"sub {index}",
        )
        if kind == "socket" and self.state.entries:
            fd = data.draw(st.sampled_from(sorted(self.state.entries)))
            return struct.pack("<QB7xI28x", userdata, data.draw(st.sampled_from([1, 2])), fd), True
        if kind in ("socket", "other"):
            fd = data.draw(st.sampled_from([0, 1, 2, 3, 999, U32]))
            return struct.pack("<QB7xI28x", userdata, data.draw(st.sampled_from([1, 2])), fd), False
        if kind == "tag":
            return struct.pack("<QB", userdata, data.draw(st.sampled_from([3, 4, 255]))).ljust(48, b"\x5a"), False
        timeout = data.draw(
            weighted(
                (5, st.integers(0, SHORT_NS)),
                (2, st.sampled_from([25 * DAY_NS, 400 * DAY_NS, U64, U64 - 1, 2**63])),
                (1, st.integers(0, U64)),
            ),
            label="timeout",
        )
        clock = data.draw(st.sampled_from(CLOCK_IDS), label="clock")
        flags = data.draw(weighted((6, st.just(0)), (2, st.just(1)), (1, st.sampled_from([2, 3, 0xFFFF]))))
        return struct.pack("<QB7xI4xQQH6x", userdata, 0, clock, timeout, 0, flags), False

    # -- rules: the calls -----------------------------------------------------------------------

    @rule(data=st.data())
    def sock_open(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        family = data.draw(weighted((6, st.just(1)), (2, st.just(2)), (1, st.sampled_from([0, 3, 4, U32]))))
        kind = data.draw(weighted((6, st.just(2)), (3, st.just(1)), (1, st.sampled_from([0, 3, U32]))))
        fd_ptr = self.ptr(data, 4, "fd_ptr")
        self.new_fd(self.call("sock_open", family, kind, fd_ptr), fd_ptr)

    @rule(data=st.data())
    def sock_bind(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        self.call("sock_bind", self.fd(data), self.address(data), self.port(data, binding=True))

    @rule(data=st.data())
    def sock_listen(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        backlog = data.draw(st.sampled_from([0, 1, 5, 128, 4097, 0x7FFF_FFFF, 0x8000_0000, U32]))
        self.call("sock_listen", self.fd(data), backlog)

    @rule(data=st.data())
    def sock_accept(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        fd, fd_ptr = self.fd(data), self.ptr(data, 4, "fd_ptr")
        if self.variant == "v1":
            rc = self.call("sock_accept", fd, fd_ptr)
        else:
            flags = data.draw(weighted((4, st.just(0)), (4, st.just(4)), (1, st.sampled_from([1, 5, U32]))))
            rc = self.call("sock_accept", fd, flags, fd_ptr)
        self.new_fd(rc, fd_ptr)

    @rule(data=st.data())
    def sock_connect(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        self.call("sock_connect", self.fd(data), self.address(data), self.port(data, binding=False))

    @rule(data=st.data())
    def receive(self, data: st.DataObject) -> None:
        """``sock_recv``, ``sock_recv_from`` or ``fd_read``."""
        if self.cancelled:
            return
        self.draw_wild(data)
        how = data.draw(st.sampled_from(["sock_recv", "sock_recv_from", "fd_read"]), label="how")
        fd = self.fd(data)
        iovs, count = self.iovecs(data, sending=False)
        flags = data.draw(weighted((6, st.just(0)), (2, st.sampled_from([1, 2, 3])), (1, st.sampled_from([4, U32]))))
        nread, roflags = self.ptr(data, 4, "nread"), self.ptr(data, 2, "roflags")
        if how == "fd_read":
            self.call("fd_read", fd, iovs, count, nread)
        elif how == "sock_recv":
            self.call("sock_recv", fd, iovs, count, flags, nread, roflags)
        elif self.variant == "v1":
            self.call("sock_recv_from", fd, iovs, count, self.out_address(data), flags, nread, roflags)
        else:
            port = self.ptr(data, 2, "port")
            self.call("sock_recv_from", fd, iovs, count, self.out_address(data), flags, port, nread, roflags)

    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        """``sock_send``, ``sock_send_to`` or ``fd_write``."""
        if self.cancelled:
            return
        self.draw_wild(data)
        how = data.draw(st.sampled_from(["sock_send", "sock_send_to", "fd_write"]), label="how")
        fd = self.fd(data)
        iovs, count = self.iovecs(data, sending=True)
        flags = data.draw(weighted((8, st.just(0)), (1, st.sampled_from([1, U32]))))
        written = self.ptr(data, 4, "nwritten")
        if how == "fd_write":
            self.call("fd_write", fd, iovs, count, written)
        elif how == "sock_send":
            self.call("sock_send", fd, iovs, count, flags, written)
        else:
            address, port = self.address(data), self.port(data, binding=False)
            self.call("sock_send_to", fd, iovs, count, address, port, flags, written)

    @rule(data=st.data())
    def sock_shutdown(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.call("sock_shutdown", self.fd(data), data.draw(st.sampled_from([1, 2, 3, 0, 4, U32])))

    @rule(data=st.data())
    def get_address(self, data: st.DataObject) -> None:
        """``sock_getlocaladdr`` or ``sock_getpeeraddr``."""
        if self.cancelled:
            return
        self.draw_wild(data)
        name = data.draw(st.sampled_from(["sock_getlocaladdr", "sock_getpeeraddr"]))
        fd, address = self.fd(data), self.out_address(data)
        if self.variant == "v1":
            self.call(name, fd, address, self.ptr(data, 4, "type"), self.ptr(data, 4, "port"))
        else:
            self.call(name, fd, address, self.ptr(data, 4, "port"))

    @rule(data=st.data())
    def sock_setsockopt(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        level = data.draw(weighted((9, st.just(0)), (1, st.sampled_from([1, 6, U32]))))
        name = data.draw(weighted((9, st.integers(0, 15)), (1, u32s)), label="option")
        if name in (11, 12):
            value = struct.pack(
                "<qq",
                *data.draw(
                    weighted(
                        (6, st.sampled_from(TIMEVALS)),
                        (1, st.tuples(st.integers(-(2**63), I64), st.integers(-(2**63), I64))),
                    )
                ),
            )
        elif name == 9:
            value = struct.pack("<ii", *data.draw(st.sampled_from(LINGERS)))
        else:
            value = struct.pack(
                "<i", data.draw(weighted((6, st.sampled_from(I32S)), (1, st.integers(-(2**31), 2**31 - 1))))
            )
        ptr = self.ptr(data, len(value), "value")
        self.put(ptr, value)
        self.call("sock_setsockopt", self.fd(data), level, name, ptr, self.length(data, len(value), "size"))

    @rule(data=st.data())
    def sock_getsockopt(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        level = data.draw(weighted((9, st.just(0)), (1, st.sampled_from([1, U32]))))
        name = data.draw(weighted((9, st.integers(0, 15)), (1, u32s)), label="option")
        room = data.draw(st.sampled_from([16, 16, 8, 4, 0, 3, 200]), label="room")
        ptr, size_ptr = self.ptr(data, room, "value"), self.ptr(data, 4, "size")
        self.put(size_ptr, struct.pack("<I", self.length(data, room, "room")))
        self.call("sock_getsockopt", self.fd(data), level, name, ptr, size_ptr)

    @rule(data=st.data())
    def sock_getaddrinfo(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        node = data.draw(
            weighted((4, st.sampled_from(NODES[:4])), (4, st.sampled_from(NODES)), (1, st.binary(max_size=80))),
            label="node",
        )
        service = data.draw(
            weighted((4, st.sampled_from(SERVICES[:3])), (2, st.sampled_from(SERVICES)), (1, st.binary(max_size=12))),
            label="service",
        )
        node_ptr, service_ptr = self.ptr(data, len(node), "node"), self.ptr(data, len(service), "service")
        self.put(node_ptr, node)
        self.put(service_ptr, service)
        flags = data.draw(
            weighted((6, st.just(0)), (2, st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128])), (1, st.integers(0, 0xFFFF)))
        )
        valid = data.draw(weighted((3, st.just(True)), (1, st.just(False))), label="valid hints")
        hints = struct.pack(
            "<HBBBxxxIIIII",
            flags if not valid else flags & 0x7F & ~2,
            data.draw(st.sampled_from([0, 1, 2] if valid else [3, 255]), label="family"),
            data.draw(st.sampled_from([0, 1, 2] if valid else [3, 7]), label="socktype"),
            data.draw(st.sampled_from([0, 1, 2] if valid else [6, 255]), label="protocol"),
            0,
            0,
            0,
            0,
            0,
        )
        hints_ptr = self.ptr(data, 28, "hints")
        self.put(hints_ptr, hints)
        count = data.draw(st.integers(1, 4), label="records")
        records = [self.ptr(data, 28, f"record {i}") for i in range(count)]
        for i, record in enumerate(records):
            data_len = data.draw(st.sampled_from([26, 26, 16, 6, 0, 100]), label="data_len")
            data_ptr, sockaddr = self.ptr(data, data_len, "sa_data"), self.ptr(data, 12, "sockaddr")
            self.put(sockaddr, struct.pack("<BxxxII", 0, self.length(data, data_len, "sa_data_len"), data_ptr))
            canon_len = data.draw(st.sampled_from([0, 0, 16, 256]), label="canon_len")
            canon = self.ptr(data, canon_len, "canonname")
            following = records[i + 1] if i + 1 < count else 0
            self.put(record, struct.pack("<HBBBxxxIIIII", 0, 0, 0, 0, 0, sockaddr, canon, canon_len, following))
        res_ptr, res_len = self.ptr(data, 4, "res"), self.ptr(data, 4, "res_len")
        self.put(res_ptr, struct.pack("<I", records[0]))
        self.call(
            "sock_getaddrinfo",
            node_ptr,
            self.length(data, len(node), "node_len"),
            service_ptr,
            self.length(data, len(service), "service_len"),
            hints_ptr,
            res_ptr,
            self.length(data, count, "max_res"),
            res_len,
        )

    @rule(data=st.data())
    def poll_oneoff(self, data: st.DataObject) -> None:
        if self.cancelled:
            return
        self.draw_wild(data)
        n = data.draw(st.integers(1, 5), label="subscriptions")
        subs = [self.subscription(data, i) for i in range(n)]
        in_ptr, out_ptr, nevents = (
            self.ptr(data, 48 * n, "in"),
            self.ptr(data, 32 * n, "out"),
            self.ptr(data, 4, "nevents"),
        )
        count = self.length(data, n, "count")
        if count > n and in_ptr + 48 * count <= MEM:
            count = n  # the bytes after our subscriptions could be any clock: keep to a count that faults
        delegated = not any(socket_sub for _, socket_sub in subs[:count])
        if delegated:  # wasmtime's own poll answers, and sleeps its clocks: only short relative ones then
            subs = [(short_clock(raw), False) for raw, _ in subs]
        self.put(in_ptr, b"".join(raw for raw, _ in subs))
        self.call("poll_oneoff", in_ptr, out_ptr, count, nevents, delegated=delegated)

    @rule(data=st.data())
    def descriptor(self, data: st.DataObject) -> None:
        """``fd_fdstat_get``, ``fd_fdstat_set_flags`` or ``fd_close``."""
        if self.cancelled:
            return
        self.draw_wild(data)
        how = data.draw(
            weighted((3, st.just("fd_fdstat_get")), (3, st.just("fd_fdstat_set_flags")), (1, st.just("fd_close")))
        )
        fd = self.fd(data)
        if how == "fd_fdstat_get":
            self.call(how, fd, self.ptr(data, 24, "fdstat"))
        elif how == "fd_fdstat_set_flags":
            self.call(
                how, fd, data.draw(weighted((4, st.sampled_from([0, 4])), (1, st.sampled_from([1, 2, 5, 0xFFFF, U32]))))
            )
        else:
            self.call(how, fd)

    # -- rules: the peers ------------------------------------------------------------------------

    @rule(data=st.data())
    def peers_act(self, data: st.DataObject) -> None:
        """The host side: connect to the guest's listeners, send, accept, or close (with a reset)."""
        if self.cancelled:
            return
        peers = self.env.peers
        what = data.draw(st.sampled_from(["connect", "send", "accept", "close", "reset"]), label="peers")
        if what == "connect":
            peers.nudge(self.state)
        elif what == "send":
            peers.send_all(data.draw(st.binary(min_size=1, max_size=64), label="bytes"))
        elif what == "accept":
            peers.accept_all()
        else:
            peers.close_some(data.draw(st.integers(1, 3)), reset=what == "reset")

    @invariant()
    def sockets_are_the_stores_own(self) -> None:
        """Every socket the host holds for this guest was handed out by this guest's calls."""
        if self.state is not None:
            assert set(self.state.entries) <= self.issued

    def teardown(self) -> None:
        """Close the guest's sockets and the peers' connections: the host's table is empty."""
        if self.probe is not None and self.state is not None:
            self.probe.close()
            assert self.state.entries == {}, "sockets left in the host's table after the Store was closed"
        self.env.peers.close_some(len(self.env.peers.connections), reset=False)


def machine_for(env: SocketFuzzEnv) -> type[SocketFuzzMachine]:
    """The state machine class bound to ``env``."""
    return type("SocketFuzz", (SocketFuzzMachine,), {"ENV": env})


def run_socket_fuzz(
    env: SocketFuzzEnv, examples: int, steps: int, *, seed: int | None = None, shrink: bool = True
) -> SocketFuzzStats:
    """Run the machine: derandomized when ``seed`` is None, else from that seed.  Raises on a failure
    (hypothesis prints the shrunk call sequence)."""
    # the log lines are checked here, not printed (thousands of refusals)
    run_machine(
        machine_for(env),
        examples,
        steps,
        seed=seed,
        shrink=shrink,
        log=env.logs,
        level=logging.WARNING,
        propagate=False,
    )
    return env.stats


__all__ = ["SocketFuzzEnv", "SocketFuzzStats", "make_env", "run_socket_fuzz", "signatures"]
