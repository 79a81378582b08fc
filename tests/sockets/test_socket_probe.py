"""WasmEdge's socket imports edge by edge through the probe (tests/sockets/probe.py): descriptors, pointers,
poll, timeouts, datagrams, cancelling, wasi:logging, name resolution and IPv6, through the real host."""

from __future__ import annotations

import logging
import pathlib
import socket
import struct
import threading
import time

import pytest
import wasmtime

from wasinn_host import GuestError, WasiNN
from wasinn_host.sockets import SocketPolicy

from .probe import (
    ACCES,
    ADDR,
    ADDR_BYTES,
    AGAIN,
    BADF,
    DATA,
    FAULT,
    FD,
    INVAL,
    IOV,
    NOSYS,
    NOTSUP,
    OUT,
    STORAGE,
    WASI,
    Probe,
    clock_sub,
    fd_sub,
    getaddrinfo,
    id_of,
    probe_port,
)

WAIT = 30.0  # seconds: the longest any socket wait in these tests may take

# -- the ABI edge by edge: a WAT probe re-exporting the socket imports ------------------------------


def test_probe_serves_a_connection_with_every_descriptor_call(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    probe = Probe(nn, tmp_path / "out")
    listener, port = probe.listener()
    assert listener >= 65536
    client = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    assert probe("sock_accept", listener, 4, FD) == 0  # V2 with NONBLOCK for the new socket
    conn = probe.u32(FD)
    assert probe("fd_fdstat_get", conn, OUT) == 0
    assert probe.read(OUT, 4) == bytes([6, 0, 4, 0])  # SOCKET_STREAM, NONBLOCK
    iov = probe.iovec(bytes(16))
    assert probe("sock_recv", conn, iov, 1, 0, OUT, OUT + 4) == AGAIN
    client.sendall(b"ping")
    assert probe.poll([fd_sub(7, 1, conn), clock_sub(8, 5 * 10**9)]) == [(7, 0, 1, 4, 0)]
    assert probe("sock_recv", conn, iov, 1, 0, OUT, OUT + 4) == 0
    assert (probe.u32(OUT), probe.read(DATA, 4)) == (4, b"ping")
    assert probe("sock_send", conn, probe.iovec(b"pong"), 1, 0, OUT) == 0 and probe.u32(OUT) == 4
    assert probe("fd_write", conn, probe.iovec(b"!!"), 1, OUT) == 0 and probe.u32(OUT) == 2
    assert probe("sock_shutdown", conn, 2) == 0
    received = b""
    while chunk := client.recv(16):
        received += chunk
    assert received == b"pong!!"
    probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 4))
    assert probe("sock_getpeeraddr", conn, ADDR, OUT, OUT + 4) == 0  # V1: type 4, then the port
    assert (probe.read(ADDR_BYTES, 4), probe.u32(OUT), probe.u32(OUT + 4)) == (
        socket.inet_aton("127.0.0.1"),
        4,
        client.getsockname()[1],
    )
    assert probe("fd_close", conn) == 0
    assert probe("fd_close", conn) == BADF  # gone: wasmtime's fd_close answers for unknown numbers
    assert probe("fd_fdstat_set_flags", listener, 4) == 0
    assert probe("sock_accept", listener, 0, FD) == AGAIN
    client.close()


def test_probe_refuses_connections_unless_allowed(
    nn: WasiNN, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        probe = Probe(nn, tmp_path / "out")
        fd = probe.socket()
        with caplog.at_level(logging.WARNING, logger="wasinn_host"):
            assert probe("sock_connect", fd, probe.address("127.0.0.1"), port) == ACCES
        assert [r.getMessage() for r in caplog.records] == [
            f"refused the guest's outbound connection to 127.0.0.1:{port}: outbound connections are off; "
            f"allow it with --sock-allow-connect 127.0.0.1:{port} (or --sock-allow-connect all)"
        ]
        allowed = WasiNN(
            registry=nn.local.registry if nn.local else None, sockets=SocketPolicy.from_specs(connect=["127.0.0.1"])
        )
        probe = Probe(allowed, tmp_path / "out2")
        fd = probe.socket()
        assert probe("sock_connect", fd, probe.address("127.0.0.1"), port) == 0  # blocking connect
        accepted, _ = server.accept()
        assert probe("sock_send", fd, probe.iovec(b"hi"), 1, 0, OUT) == 0
        accepted.settimeout(WAIT)
        assert accepted.recv(2) == b"hi"
        accepted.close()


def test_probe_checks_every_pointer_descriptor_and_value(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    probe = Probe(nn, tmp_path / "out")
    assert probe("sock_open", 1, 2, 65534) == FAULT  # the fd would end past the 64 KiB memory
    state = nn.sockets.stores.lookup(id_of(probe.store))
    assert state is not None and state.entries == {}  # nothing half made
    assert probe("sock_open", 3, 2, FD) == NOSYS  # AF_UNIX
    assert probe("sock_open", 9, 2, FD) == INVAL
    assert probe("sock_open", 1, 7, FD) == INVAL
    assert probe("sock_listen", 123456, 1) == BADF
    fd = probe.socket()
    assert probe("sock_bind", fd, 65535, 0) == FAULT
    probe.write(ADDR, struct.pack("<II", 65530, 16))
    assert probe("sock_bind", fd, ADDR, 0) == FAULT
    probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 5))
    assert probe("sock_bind", fd, ADDR, 0) == INVAL
    assert probe("sock_bind", fd, probe.address("127.0.0.1"), 70000) == INVAL
    assert probe("sock_recv", fd, IOV, 2000, 0, OUT, OUT + 4) == INVAL
    probe.write(IOV, struct.pack("<II", 65000, 1000))
    assert probe("sock_recv", fd, IOV, 1, 0, OUT, OUT + 4) == FAULT
    assert probe("sock_recv", fd, IOV, 1, 0, 65534, OUT + 4) == FAULT
    iov = probe.iovec(bytes(8))
    assert probe("sock_recv", fd, iov, 1, 8, OUT, OUT + 4) == INVAL  # unknown riflags
    assert probe("sock_shutdown", fd, 0) == INVAL
    probe.write(DATA, struct.pack("<i", 1))
    assert probe("sock_setsockopt", fd, 1, 0, DATA, 4) == INVAL  # only SOL_SOCKET
    assert probe("sock_setsockopt", fd, 0, 14, DATA, 4) == NOTSUP  # SO_BINDTODEVICE
    assert probe("sock_setsockopt", fd, 0, 0, DATA, 2) == INVAL  # too short
    assert probe("sock_setsockopt", fd, 0, 0, DATA, 4) == 0  # SO_REUSEADDR
    probe.write(OUT, struct.pack("<I", 4))
    assert probe("sock_getsockopt", fd, 0, 0, DATA, OUT) == 0 and probe.read(DATA, 4) == struct.pack("<i", 1)
    assert probe("sock_getsockopt", fd, 0, 1, DATA, OUT) == 0 and probe.read(DATA, 4) == struct.pack("<i", 2)
    assert probe("fd_fdstat_set_flags", fd, 1) == NOTSUP  # APPEND on a socket
    assert probe("poll_oneoff", OUT, OUT + 64, 0, OUT + 200) == INVAL
    assert probe("fd_write", 1, probe.iovec(b"still fine\n"), 1, OUT) == 0  # stdout: wasmtime's own
    assert (tmp_path / "out").read_text() == "still fine\n"


def test_probe_poll_mixes_sockets_clocks_and_other_descriptors(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    probe = Probe(nn, tmp_path / "out")
    listener, _ = probe.listener()
    stdout_ready = probe.poll([fd_sub(2, 2, 1)])  # no socket: wasmtime's own poll_oneoff answers
    assert len(stdout_ready) == 1 and stdout_ready[0][:3] == (2, 0, 2)
    # with a socket, stdout (wasmtime's descriptor) is asked too: it answers as wasmtime did alone
    assert probe.poll([fd_sub(1, 1, listener), fd_sub(2, 2, 1), clock_sub(3, 5 * 10**9)]) == stdout_ready
    started = time.monotonic()
    assert probe.poll([fd_sub(1, 1, listener), clock_sub(3, 50_000_000)]) == [(3, 0, 0, 0, 0)]
    assert 0.045 <= time.monotonic() - started < 2.0
    assert probe("clock_time_get", 1, 1, OUT) == 0
    now = int(struct.unpack("<Q", probe.read(OUT, 8))[0])  # wasmtime's monotonic clock, its own origin
    started = time.monotonic()
    assert probe.poll([fd_sub(1, 1, listener), clock_sub(4, now + 80_000_000, absolute=True)]) == [(4, 0, 0, 0, 0)]
    assert 0.07 <= time.monotonic() - started < 2.0
    with socket.create_connection(("127.0.0.1", probe_port(probe, listener)), timeout=WAIT):
        assert probe.poll([fd_sub(1, 1, listener), clock_sub(3, 5 * 10**9)]) == [(1, 0, 1, 0, 0)]


def test_rcvtimeo_bounds_a_blocking_receive(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    probe = Probe(nn, tmp_path / "out")
    listener, port = probe.listener()
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT):
        assert probe("sock_accept", listener, 0, FD) == 0  # blocking: the client is already queued
        conn = probe.u32(FD)
        probe.write(DATA, struct.pack("<qq", 0, 200_000))
        assert probe("sock_setsockopt", conn, 0, 11, DATA, 16) == 0  # SO_RCVTIMEO 0.2 s
        started = time.monotonic()
        assert probe("sock_recv", conn, probe.iovec(bytes(8), DATA + 64), 1, 0, OUT, OUT + 4) == AGAIN
        assert 0.19 <= time.monotonic() - started < 2.0


def test_datagrams_need_the_connect_option_too(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    allowed = WasiNN(
        registry=nn.local.registry if nn.local else None, sockets=SocketPolicy.from_specs(connect=["127.0.0.1"])
    )
    for host, expected in ((nn, ACCES), (allowed, 0)):
        probe = Probe(host, tmp_path / "out")
        fd = probe.socket(kind=1)
        assert probe("sock_bind", fd, probe.address("127.0.0.1"), 0) == 0
        port = probe_port(probe, fd)
        iov = probe.iovec(b"datagram")
        assert probe("sock_send_to", fd, iov, 1, probe.address("127.0.0.1"), port, 0, OUT) == expected
    probe.write(IOV, struct.pack("<II", DATA + 100, 32))
    probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 4))
    assert probe("sock_recv_from", fd, IOV, 1, ADDR, 0, OUT, OUT + 4) == 0  # V1
    assert (probe.u32(OUT), probe.read(DATA + 100, 8), probe.read(ADDR_BYTES, 4)) == (
        8,
        b"datagram",
        socket.inet_aton("127.0.0.1"),
    )


BLOCKED_IN_ACCEPT = f"""
(module
  (import "{WASI}" "sock_open" (func $open (param i32 i32 i32) (result i32)))
  (import "{WASI}" "sock_bind" (func $bind (param i32 i32 i32) (result i32)))
  (import "{WASI}" "sock_listen" (func $listen (param i32 i32) (result i32)))
  (import "{WASI}" "sock_accept" (func $accept (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "\\20\\00\\00\\00\\04\\00\\00\\00")
  (data (i32.const 32) "\\7f\\00\\00\\01")
  (func (export "_start")
    (drop (call $open (i32.const 1) (i32.const 2) (i32.const 0)))
    (drop (call $bind (i32.load (i32.const 0)) (i32.const 16) (i32.const 0)))
    (drop (call $listen (i32.load (i32.const 0)) (i32.const 1)))
    (loop $retry  ;; a guest that retries whatever the error: only the host's trap ends it
      (br_if $retry (call $accept (i32.load (i32.const 0)) (i32.const 8))))))
"""


def test_cancel_all_stops_a_guest_blocked_in_accept(nn: WasiNN) -> None:
    module = wasmtime.wat2wasm(BLOCKED_IN_ACCEPT)
    errors: list[str] = []

    def run() -> None:
        try:
            nn.run(bytes(module))
        except GuestError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # waiting in the V1 sock_accept
    started = time.monotonic()
    nn.cancel_all()  # socket calls answer INTR for a second (a run's stop traps the guest then), then trap
    thread.join(WAIT)
    assert not thread.is_alive()
    assert 0.9 <= time.monotonic() - started < 5.0
    assert errors == ["the guest trapped: interrupted: the host stopped the guest while it used a socket"]


LOGGING_GUEST = """
(module
  (import "wasi:logging/logging" "log" (func $log (param i32 i32 i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "stdout")
  (data (i32.const 16) "llama-core")
  (data (i32.const 32) "hello from the guest")
  (func (export "_start")
    (call $log (i32.const 2) (i32.const 0) (i32.const 6) (i32.const 32) (i32.const 20))
    (call $log (i32.const 3) (i32.const 16) (i32.const 10) (i32.const 32) (i32.const 20))
    (call $log (i32.const 2) (i32.const 16) (i32.const 10) (i32.const 65530) (i32.const 20))))
"""


def test_wasi_logging_prints_or_logs(
    nn: WasiNN, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="wasinn_host"):
        assert nn.run(bytes(wasmtime.wat2wasm(LOGGING_GUEST))) == 0
    assert capfd.readouterr().out == "hello from the guest\n"
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "wasinn_host.guest"] == [
        (logging.WARNING, "llama-core: hello from the guest"),
        (logging.WARNING, "wasi:logging/logging.log: the context or message is outside the guest memory"),
    ]


def test_only_modules_importing_sockets_get_the_layer(nn: WasiNN) -> None:
    from wasinn_host.sockets import needs_sockets

    assert needs_sockets(wasmtime.Module(nn.engine, BLOCKED_IN_ACCEPT))
    assert not needs_sockets(wasmtime.Module(nn.engine, LOGGING_GUEST))
    plain = wasmtime.Module(
        nn.engine, f'(module (import "{WASI}" "fd_write" (func (param i32 i32 i32 i32) (result i32))))'
    )
    assert not needs_sockets(plain)


def test_getaddrinfo_resolves_numbers_and_localhost_only_unless_connections_are_allowed(
    nn: WasiNN, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = Probe(nn, tmp_path / "out")
    # family 1 (IPv4), socktype 2, protocol 1 (TCP), addrlen 16; sockaddr family 1, port 8080, 127.0.0.1
    expected = bytes([1, 2, 1, 16, 1]) + struct.pack(">H", 8080) + socket.inet_aton("127.0.0.1") + bytes(8)
    assert getaddrinfo(probe, b"127.0.0.1", b"8080") == (0, [expected])
    code, records = getaddrinfo(probe, b"localhost", b"8080")
    assert code == 0 and expected in records
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        assert getaddrinfo(probe, b"example.invalid", b"80") == (82, [])  # AINONAME
    assert [r.getMessage() for r in caplog.records] == [
        "sock_getaddrinfo: not resolving 'example.invalid': guests may resolve host names only with "
        "--sock-allow-connect (errno 82 AINONAME)"
    ]
    assert getaddrinfo(probe, b"", b"") == (82, [])
    assert probe("sock_getaddrinfo", 2000, 9, 2032, 4, 65530, 2100, 2, 2800) == FAULT


def test_ipv6_addresses_in_both_forms(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    probe = Probe(nn, tmp_path / "out")
    fd = probe.socket()  # opened as IPv4 (af 1): re-made as IPv6 when bound to an IPv6 address
    probe.write(STORAGE, struct.pack("<H", 2) + socket.inet_pton(socket.AF_INET6, "::1") + bytes(110))
    probe.write(ADDR, struct.pack("<II", STORAGE, 128))  # V2 storage form
    assert probe("sock_bind", fd, ADDR, 0) == 0
    assert probe("sock_listen", fd, 1) == 0
    port = probe_port(probe, fd)
    assert probe.read(STORAGE, 18) == struct.pack("<H", 2) + socket.inet_pton(socket.AF_INET6, "::1")
    with socket.create_connection(("::1", port), timeout=WAIT) as client:
        assert probe("sock_accept", fd, 0, FD) == 0
        conn = probe.u32(FD)
        probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 16))  # V1: 16 raw bytes, type 6
        assert probe("sock_getpeeraddr", conn, ADDR, OUT, OUT + 4) == 0
        assert (probe.read(ADDR_BYTES, 16), probe.u32(OUT), probe.u32(OUT + 4)) == (
            socket.inet_pton(socket.AF_INET6, "::1"),
            6,
            client.getsockname()[1],
        )
        probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 4))  # an IPv6 peer does not fit 4 bytes
        assert probe("sock_getpeeraddr", conn, ADDR, OUT, OUT + 4) == INVAL
