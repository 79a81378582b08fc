"""WasmEdge's socket extension through the real host: the socket_server guest over HTTP (embedding API
and ``wasinn run``, Ctrl-C included), and every socket function's edge cases through a WAT probe."""

from __future__ import annotations

import http.client
import logging
import os
import pathlib
import re
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import wasmtime

from wasinn_host import GuestError, RunOptions, WasiNN
from wasinn_host.sockets import SocketPolicy
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

SERVER = GUESTS / "socket_server.wasm"
WAIT = 30.0  # seconds: the longest any socket wait in these tests may take


# -- the socket_server guest through WasiNN.run ----------------------------------------------------


@dataclass
class Server:
    """socket_server.wasm running in a thread through WasiNN.run."""

    port: int
    thread: threading.Thread
    out: pathlib.Path
    err: pathlib.Path
    result: dict[str, object] = field(default_factory=dict)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr_lines(self) -> list[str]:
        return self.err.read_text().splitlines()

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)

    def quit(self) -> None:
        conn = self.connect()
        assert request(conn, "POST", "/quit") == (200, b"bye\n")
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn.request(method, path, body=body)
    response = conn.getresponse()
    return response.status, response.read()


def wait_for_port(path: pathlib.Path, thread: threading.Thread | None = None) -> int:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.startswith("listening on 127.0.0.1:") and text.endswith("\n"):
            return int(text.splitlines()[0].rsplit(":", 1)[1])
        if thread is not None and not thread.is_alive():
            raise AssertionError("the server ended before listening")
        time.sleep(0.02)
    raise AssertionError("the server did not start listening")


def start_server(nn: WasiNN, tmp_path: pathlib.Path, addr: str = "127.0.0.1") -> Server:
    out, err = tmp_path / "server.out", tmp_path / "server.err"
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["code"] = nn.run(SERVER, ["succ", addr, "0"], RunOptions(stdout=str(out), stderr=str(err)))
        except GuestError as exc:
            result["error"] = str(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return Server(wait_for_port(out, thread), thread, out, err, result)


@pytest.fixture
def server(nn: WasiNN, tmp_path: pathlib.Path) -> Iterator[Server]:
    started = start_server(nn, tmp_path)
    yield started
    if started.thread.is_alive():
        nn.cancel_all()
        started.thread.join(WAIT)


def test_socket_guest_serves_http_with_keep_alive_and_completions(server: Server) -> None:
    first = server.connect()
    assert request(first, "GET", "/health") == (200, b"ok\n")
    assert first.sock is not None
    client_port = first.sock.getsockname()[1]
    assert request(first, "GET", "/peer") == (200, f"127.0.0.1:{client_port}\n".encode())
    for prompt in ("hello", "abc", "hello"):  # repeated requests on one connection and one model
        assert request(first, "POST", "/complete", prompt.encode()) == (200, (successor_text(prompt) + "</s>").encode())
    second = server.connect()  # connection 1 reads with fd_read, connection 0 with sock_recv
    assert request(second, "POST", "/complete", b"u") == (200, b"vwxyz</s>")
    assert request(second, "GET", "/nope") == (404, b"not found\n")
    first.close()
    server.quit()
    assert server.result == {"code": 0}
    assert server.stdout() == f"listening on 127.0.0.1:{server.port}\nbye after 8 requests\n"
    lines = server.stderr_lines()
    assert lines[0] == f"connection 0 from 127.0.0.1:{client_port}"
    assert lines[1].startswith("connection 1 from 127.0.0.1:")
    assert "connection 0 closed by the peer" in lines


def test_a_client_leaving_mid_request_closes_only_its_connection(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as leaver:
        leaver.sendall(b"POST /complete HTTP/1.1\r\nContent-Length: 50\r\n\r\nhel")
        time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as rude:
        rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        rude.sendall(b"GET /heal")
        time.sleep(0.2)
    conn = server.connect()
    assert request(conn, "POST", "/complete", b"x") == (200, b"yz</s>")
    server.quit()
    assert server.result == {"code": 0}
    lines = sorted(re.sub(r" from 127\.0\.0\.1:\d+$", " from", line) for line in server.stderr_lines())
    assert lines == [
        "connection 0 closed by the peer mid-request (50 bytes)",
        "connection 0 from",
        "connection 1 from",
        "connection 1: recv error 15",  # CONNRESET, whether the 9 bytes were read first or not
        "connection 2 from",
        "connection 3 from",
    ]


def test_bind_beyond_loopback_is_refused_with_one_line_naming_the_option(
    nn: WasiNN, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        code = nn.run(SERVER, ["succ", "0.0.0.0", "0"], RunOptions(stdout=str(out), stderr=str(err)))
    assert code == 1
    assert err.read_text() == "socket error: sock_bind returned 2\n"  # ACCES
    refusals = [r.getMessage() for r in caplog.records if "sock-allow-bind" in r.getMessage()]
    assert refusals == [
        "refused the guest's bind to 0.0.0.0:0: guests may listen on loopback only; "
        "allow it with --sock-allow-bind 0.0.0.0 (or --sock-allow-bind all)"
    ]


def test_sock_allow_bind_lets_the_guest_listen_there(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    wide = WasiNN(registry=nn.local.registry if nn.local else None, sockets=SocketPolicy.from_specs(bind=["0.0.0.0"]))
    out = tmp_path / "out"
    thread = threading.Thread(
        target=wide.run, args=(SERVER, ["succ", "0.0.0.0", "0"], RunOptions(stdout=str(out))), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + WAIT
    while not (out.exists() and out.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.read_text().startswith("listening on 0.0.0.0:")
    port = int(out.read_text().split(":")[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    assert request(conn, "POST", "/quit") == (200, b"bye\n")
    thread.join(WAIT)
    assert not thread.is_alive()


# -- wasinn run: the CLI, a refused bind, Ctrl-C with connections open -----------------------------


def wasinn_run(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "wasinn_host", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=GUESTS.parent,
    )


def read_line(stream: object, timeout: float) -> bytes:
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


def test_wasinn_run_serves_and_ctrl_c_ends_it_with_connections_open(preload_specs: list[str]) -> None:
    proc = wasinn_run("--nn-preload", preload_specs[0], str(SERVER), "succ", "127.0.0.1", "0")
    try:
        line = read_line(proc.stdout, WAIT)
        assert line.startswith(b"listening on 127.0.0.1:"), line
        port = int(line.split(b":")[1])
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        assert request(idle, "POST", "/complete", b"hello") == (200, (successor_text("hello") + "</s>").encode())
        waiting = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        waiting.sendall(b"POST /complete HTTP/1.1\r\nContent-Length: 10\r\n\r\nab")
        time.sleep(0.2)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert elapsed < 5.0
    assert err.decode().splitlines()[-1] == "wasinn: interrupted"
    waiting.settimeout(WAIT)
    assert waiting.recv(10) == b""  # the host closed the guest's sockets
    waiting.close()
    idle.close()


def test_wasinn_run_timeout_stops_a_server_waiting_on_its_sockets(preload_specs: list[str]) -> None:
    started = time.monotonic()
    proc = wasinn_run("--timeout", "1", "--nn-preload", preload_specs[0], str(SERVER), "succ", "127.0.0.1", "0")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 134  # a trap, with the run's own message
    assert out.startswith(b"listening on 127.0.0.1:")
    assert err.decode().splitlines()[-1] == "wasinn: error: the guest trapped: stopped by --timeout 1s"
    assert time.monotonic() - started < 30


def test_wasinn_run_refused_bind_is_one_line_and_the_guest_sees_acces(preload_specs: list[str]) -> None:
    proc = wasinn_run("--nn-preload", preload_specs[0], str(SERVER), "succ", "0.0.0.0", "0")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and out == b""
    assert err.decode().splitlines() == [
        "wasinn: WARNING: refused the guest's bind to 0.0.0.0:0: guests may listen on loopback only; "
        "allow it with --sock-allow-bind 0.0.0.0 (or --sock-allow-bind all)",
        "socket error: sock_bind returned 2",
    ]


def test_a_bad_sock_allow_option_is_a_usage_error() -> None:
    proc = wasinn_run("--sock-allow-connect", "1.2.3.4:99999", str(SERVER), "succ", "127.0.0.1", "0")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.decode().splitlines() == [
        "wasinn: error: --sock-allow-bind/--sock-allow-connect: '1.2.3.4:99999': the port must be a number "
        "from 0 to 65535"
    ]


# -- the ABI edge by edge: a WAT probe re-exporting the socket imports ------------------------------

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
    lines = ["(module"]
    for name, arity in PROBE_IMPORTS.items():
        lines.append(f'(import "{WASI}" "{name}" (func ${name} (param{" i32" * arity}) (result i32)))')
    lines.append(f'(import "{WASI}" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))')
    lines.append('(memory (export "memory") 1)')
    for name, arity in PROBE_IMPORTS.items():
        gets = " ".join(f"local.get {i}" for i in range(arity))
        lines.append(f'(func (export "{name}") (param{" i32" * arity}) (result i32) {gets} call ${name})')
    lines.append(
        '(func (export "clock_time_get") (param i32 i64 i32) (result i32) '
        "local.get 0 local.get 1 local.get 2 call $clock)"
    )
    lines.append('(func (export "_start")))')
    return "\n".join(lines)


class Probe:
    """The probe instantiated through the embedding API (own Linker, ``nn.sockets.link``)."""

    def __init__(self, nn: WasiNN, stdout: pathlib.Path) -> None:
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
        nn.attach(self.store)
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


def id_of(store: wasmtime.Store) -> int:
    from wasinn_host.guest.store_tables import store_key

    return store_key(store)


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


def probe_port(probe: Probe, fd: int) -> int:
    probe.write(ADDR, struct.pack("<II", STORAGE, 128))
    assert probe("sock_getlocaladdr", fd, ADDR, OUT + 500) == 0
    return probe.u32(OUT + 500)


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
