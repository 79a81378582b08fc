"""Socket caps and the host's own descriptors (issue 28 items 1 and 6), through the real host.

A WAT guest opens sockets until the host refuses one, then loads a model and writes to stdout: the
host must survive (no wasmtime panic), refuse with errno 33/41 and one log line, and keep
descriptors for itself.  ``RLIMIT_NOFILE`` is set low in the child process so this stays fast (by a first
interpreter that then ``exec``s the host, not by a ``preexec_fn``: see :func:`limited`).  The
shipped ``socket_server.wasm`` must survive a client that resets before it is served and 200 idle
connections (item 7, the refusal's log line, is in test_socket_refusals.py).
"""

from __future__ import annotations

import http.client
import pathlib
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import wasmtime

from wasinn_host.testing.guest_runs import GUESTS

from .probe import read_line

SERVER = GUESTS / "socket_server.wasm"
WAIT = 30.0
MFILE, NFILE, ACCES = 33, 41, 2

FILLER_WAT = r"""(module
  (import "wasi_snapshot_preview1" "sock_open" (func $sock_open (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "load_by_name" (func $load (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "succ")
  (data (i32.const 200) " sockets, then errno ")
  (data (i32.const 240) "\nload_by_name ")
  (data (i32.const 260) ", init_execution_context ")
  (global $pos (mut i32) (i32.const 1024))
  (func $str (param $at i32) (param $len i32)
    (memory.copy (global.get $pos) (local.get $at) (local.get $len))
    (global.set $pos (i32.add (global.get $pos) (local.get $len))))
  (func $num (param $v i32)
    (local $start i32) (local $end i32) (local $t i32)
    (local.set $start (global.get $pos))
    (loop $digit
      (i32.store8 (global.get $pos) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
      (global.set $pos (i32.add (global.get $pos) (i32.const 1)))
      (local.set $v (i32.div_u (local.get $v) (i32.const 10)))
      (br_if $digit (local.get $v)))
    (local.set $end (i32.sub (global.get $pos) (i32.const 1)))
    (block $done (loop $swap
      (br_if $done (i32.ge_u (local.get $start) (local.get $end)))
      (local.set $t (i32.load8_u (local.get $start)))
      (i32.store8 (local.get $start) (i32.load8_u (local.get $end)))
      (i32.store8 (local.get $end) (local.get $t))
      (local.set $start (i32.add (local.get $start) (i32.const 1)))
      (local.set $end (i32.sub (local.get $end) (i32.const 1)))
      (br $swap))))
  ;; sock_open until refused: (sockets opened) * 100 + the errno
  (func $fill (export "fill") (result i32)
    (local $n i32) (local $rc i32)
    (block $refused (loop $open
      (local.set $rc (call $sock_open (i32.const 1) (i32.const 2) (i32.const 0)))
      (br_if $refused (local.get $rc))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $open)))
    (i32.add (i32.mul (local.get $n) (i32.const 100)) (local.get $rc)))
  ;; fill, then (sockets still held) load a model, make a context and print it all on stdout
  (func (export "_start")
    (local $filled i32)
    (local.set $filled (call $fill))
    (call $num (i32.div_u (local.get $filled) (i32.const 100)))
    (call $str (i32.const 200) (i32.const 21))
    (call $num (i32.rem_u (local.get $filled) (i32.const 100)))
    (call $str (i32.const 240) (i32.const 14))
    (call $num (call $load (i32.const 100) (i32.const 4) (i32.const 8)))
    (call $str (i32.const 260) (i32.const 25))
    (call $num (call $init (i32.load (i32.const 8)) (i32.const 12)))
    (i32.store8 (global.get $pos) (i32.const 10))
    (global.set $pos (i32.add (global.get $pos) (i32.const 1)))
    (i32.store (i32.const 16) (i32.const 1024))
    (i32.store (i32.const 20) (i32.sub (global.get $pos) (i32.const 1024)))
    (if (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)) (then unreachable))))
"""
FILLED = re.compile(r"(\d+) sockets, then errno (\d+)\nload_by_name 0, init_execution_context 0\n")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def filler(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("guests") / "filler.wasm"
    path.write_bytes(wasmtime.wat2wasm(FILLER_WAT))
    return path


SET_NOFILE_THEN_EXEC = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[3:]])"
)


def limited(limit: tuple[int, int] | None, *argv: str) -> list[str]:
    """The command line of ``python ARGV`` under ``RLIMIT_NOFILE`` ``limit`` (soft, hard) when given.

    A first interpreter sets the limit and ``exec``s the real one.  Not a ``preexec_fn``: that makes
    Python fork this process (not vfork) and run Python code in the child before the ``exec`` (unsafe
    in a process with threads, Python's documentation says); once gRPC had run in this process
    (tests/rpc), its fork handlers restarted its pollers in such a child, which aborted there
    (tests/rpc/test_rpc_fork.py)."""
    if limit is None:
        return [sys.executable, *argv]
    return [sys.executable, "-c", SET_NOFILE_THEN_EXEC, str(limit[0]), str(limit[1]), *argv]


def test_the_launcher_sets_the_limit() -> None:
    code = "import resource; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    done = subprocess.run(limited((200, 300), "-c", code), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "200 300\n"), done.stderr


def wasinn(*args: str, limit: tuple[int, int] | None = None, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # type: ignore[call-overload]
        limited(limit, "-m", "wasinn_host", "run", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        **popen,
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out.decode(), err.decode()


# -- item 1: a guest taking every socket it can ---------------------------------------------------


def test_a_guest_taking_every_socket_leaves_the_host_its_descriptors(
    filler: pathlib.Path, preload_specs: list[str]
) -> None:
    code, out, err = finish(wasinn("--nn-preload", preload_specs[0], str(filler), limit=(256, 256)))
    assert code == 0, err  # before: a Rust panic in wasmtime's WASI (TooManyOpenFiles) and SIGABRT
    filled = FILLED.fullmatch(out)
    assert filled is not None, out + err
    sockets, errno = int(filled[1]), int(filled[2])
    assert errno == MFILE
    assert 64 <= sockets < 128  # descriptors 128-255 stay the host's (the model loaded after this)
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = re.fullmatch(
        r"wasinn: WARNING: refused the guest's sock_open: the process is near its descriptor limit "
        r"\(RLIMIT_NOFILE 256, (\d+) open, (\d+) of them guests' sockets\) and keeps the last 128 for the host "
        r"\(raise the limit with `ulimit -n`, or lower SocketPolicy\(reserve_fds=\.\.\.\)\) \(errno 33 MFILE\)",
        lines[0],
    )
    assert line is not None, lines[0]
    assert int(line[2]) == sockets and sockets < int(line[1]) <= 128


def test_the_soft_descriptor_limit_is_raised_and_one_guest_gets_1024_sockets(
    filler: pathlib.Path, preload_specs: list[str]
) -> None:
    code, out, err = finish(wasinn("--nn-preload", preload_specs[0], str(filler), limit=(256, 2048)))
    assert code == 0, err
    assert out == "1024 sockets, then errno 33\nload_by_name 0, init_execution_context 0\n"
    assert err.splitlines() == [
        "wasinn: WARNING: refused the guest's sock_open: it holds 1024 sockets, limit max_sockets_per_store=1024 "
        "reached (raise it with SocketPolicy(max_sockets_per_store=...) or `wasinn run --max-sockets-per-store N`) "
        "(errno 33 MFILE)"
    ]


def test_max_sockets_options_cap_a_guest_and_the_process(filler: pathlib.Path, preload_specs: list[str]) -> None:
    code, out, err = finish(wasinn("--max-sockets-per-store", "20", "--nn-preload", preload_specs[0], str(filler)))
    assert (code, out) == (0, "20 sockets, then errno 33\nload_by_name 0, init_execution_context 0\n"), err
    assert err.splitlines() == [
        "wasinn: WARNING: refused the guest's sock_open: it holds 20 sockets, limit max_sockets_per_store=20 "
        "reached (raise it with SocketPolicy(max_sockets_per_store=...) or `wasinn run --max-sockets-per-store N`) "
        "(errno 33 MFILE)"
    ]
    code, out, err = finish(wasinn("--max-sockets-total", "7", "--nn-preload", preload_specs[0], str(filler)))
    assert (code, out) == (0, "7 sockets, then errno 41\nload_by_name 0, init_execution_context 0\n"), err
    assert err.splitlines() == [
        "wasinn: WARNING: refused the guest's sock_open: guests hold 7 sockets in this process, limit "
        "max_sockets_total=7 reached (raise it with SocketPolicy(max_sockets_total=...) or "
        "`wasinn run --max-sockets-total N`) (errno 41 NFILE)"
    ]


def test_a_bad_max_sockets_value_is_a_usage_error(filler: pathlib.Path) -> None:
    code, _, err = finish(wasinn("--max-sockets-per-store", "-1", str(filler)))
    assert code == 2
    assert err.splitlines() == [
        "wasinn: error: argument --max-sockets-per-store: expected a number of sockets (0 or more), got '-1' "
        "(see 'wasinn run --help')"
    ]


EMBEDDED = """
import logging, sys, wasmtime
from wasinn_host import WasiNN
from wasinn_host.sockets import SocketPolicy
logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
wat = sys.stdin.read()
nn = WasiNN(sockets=SocketPolicy(max_sockets_per_store=20, max_sockets_total=30))
module = wasmtime.Module(nn.engine, wat)
linker = wasmtime.Linker(nn.engine)
linker.define_wasi()
nn.add_to_linker(linker)
nn.sockets.link(linker, module)
stores = []
for _ in range(3):
    store = wasmtime.Store(nn.engine)
    store.set_wasi(wasmtime.WasiConfig())
    nn.attach(store)
    fill = linker.instantiate(store, module).exports(store)["fill"]
    print(fill(store), fill(store), flush=True)
    stores.append(store)
nn.detach(stores[0])
store = stores[1]
print(linker.instantiate(store, module).exports(store)["fill"](store))
"""


def test_an_embedding_process_caps_every_store_and_the_process() -> None:
    proc = subprocess.run(
        limited((200, 200), "-c", EMBEDDED),
        input=FILLER_WAT.encode(),
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    # Store 1: 20, then its cap; store 2: the 10 left in the process; store 3: none; once store 1 is
    # gone, store 2 takes its 10 more (then its own cap of 20)
    assert proc.stdout.decode().split() == ["2033", "33", "1041", "41", "41", "41", "1033"]
    assert proc.stderr.decode().splitlines() == [
        "WARNING refused the guest's sock_open: it holds 20 sockets, limit max_sockets_per_store=20 reached "
        "(raise it with SocketPolicy(max_sockets_per_store=...) or `wasinn run --max-sockets-per-store N`) "
        "(errno 33 MFILE)",
        "WARNING refused the guest's sock_open: guests hold 30 sockets in this process, limit max_sockets_total=30 "
        "reached (raise it with SocketPolicy(max_sockets_total=...) or `wasinn run --max-sockets-total N`) "
        "(errno 41 NFILE)",
        "WARNING refused the guest's sock_open: guests hold 30 sockets in this process, limit max_sockets_total=30 "
        "reached (raise it with SocketPolicy(max_sockets_total=...) or `wasinn run --max-sockets-total N`) "
        "(errno 41 NFILE)",
        "WARNING refused the guest's sock_open: it holds 20 sockets, limit max_sockets_per_store=20 reached "
        "(raise it with SocketPolicy(max_sockets_per_store=...) or `wasinn run --max-sockets-per-store N`) "
        "(errno 33 MFILE)",
    ]


# -- item 6: the shipped server survives its clients ----------------------------------------------


class Server:
    """socket_server.wasm under ``wasinn run``."""

    def __init__(self, preload: str, *options: str) -> None:
        self.proc = wasinn(*options, "--nn-preload", preload, str(SERVER), "succ", "127.0.0.1", "0")
        line = read_line(self.proc.stdout, WAIT)
        assert line.startswith(b"listening on 127.0.0.1:"), (line, self.proc.stderr)
        self.port = int(line.split(b":")[1])

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def quit(self) -> tuple[int, str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        conn.request("POST", "/quit")
        assert conn.getresponse().read() == b"bye\n"
        conn.close()
        return finish(self.proc)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()


def test_a_client_resetting_before_it_is_served_does_not_end_the_server(
    preload_specs: list[str], servers: list[Server]
) -> None:
    server = Server(preload_specs[0])
    servers.append(server)
    server.proc.send_signal(signal.SIGSTOP)  # the connection waits in the listener's queue...
    try:
        rude = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
        rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rude.close()  # ...and is reset there, before the server accepts it
        time.sleep(0.1)
    finally:
        server.proc.send_signal(signal.SIGCONT)
    assert server.get("/health") == (200, b"ok\n")  # before: the server had exited
    code, out, err = server.quit()
    assert code == 0, err
    assert out.endswith("bye after 2 requests\n")
    lines = sorted(re.sub(r"from 127\.0\.0\.1:\d+$", "from", line) for line in err.splitlines())
    assert lines == [
        "a connection left before it was served (sock_getpeeraddr returned 53)",
        "connection 0 closed by the peer",
        "connection 0 from",
        "connection 1 from",
    ]


def test_200_idle_connections_do_not_starve_a_real_client(preload_specs: list[str], servers: list[Server]) -> None:
    server = Server(preload_specs[0])
    servers.append(server)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) for _ in range(200)]
    try:
        assert server.get("/health") == (200, b"ok\n")  # before: 32 connections, the rest closed at once
        idle[-1].sendall(b"GET /health HTTP/1.1\r\n\r\n")  # the newest idle ones are still served
        assert idle[-1].recv(100).startswith(b"HTTP/1.1 200 OK")
        idle[0].settimeout(WAIT)
        assert idle[0].recv(100) == b""  # the oldest was closed to make room
        code, _, err = server.quit()
    finally:
        for conn in idle:
            conn.close()
    assert code == 0, err
    made_room = [line for line in err.splitlines() if line.endswith(" closed to make room")]
    assert len(made_room) == 201 - 64  # 200 idle and 1 real connection, 64 at once (the real one's slot freed)
    assert made_room[0] == "connection 0 closed to make room"


def test_a_server_at_the_hosts_socket_cap_closes_its_quietest_connection(
    preload_specs: list[str], servers: list[Server]
) -> None:
    server = Server(preload_specs[0], "--max-sockets-per-store", "5")  # the listener and 4 connections
    servers.append(server)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) for _ in range(10)]
    try:
        assert server.get("/health") == (200, b"ok\n")
        idle[-1].sendall(b"GET /health HTTP/1.1\r\n\r\n")  # served after the server saw the real one leave
        assert idle[-1].recv(100).startswith(b"HTTP/1.1 200 OK")
        code, _, err = server.quit()
    finally:
        for conn in idle:
            conn.close()
    assert code == 0, err
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("wasinn:")] == [
        "wasinn: WARNING: refused the guest's sock_accept: it holds 5 sockets, limit max_sockets_per_store=5 "
        "reached (raise it with SocketPolicy(max_sockets_per_store=...) or `wasinn run --max-sockets-per-store N`) "
        "(errno 33 MFILE)"
    ]
    assert sum(line.endswith(" closed to make room") for line in lines) == 11 - 4, err  # 10 idle and 1 real, 4 at once


def test_idle_connections_are_closed_after_idle_timeout(preload_specs: list[str], servers: list[Server]) -> None:
    server = Server(preload_specs[0], "--env", "idle_timeout=1")
    servers.append(server)
    quiet = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    started = time.monotonic()
    assert quiet.recv(10) == b""
    assert 1.0 <= time.monotonic() - started < 5.0
    quiet.close()
    code, _, err = server.quit()
    assert code == 0, err
    assert "connection 0 closed after 1 s idle" in err.splitlines()
