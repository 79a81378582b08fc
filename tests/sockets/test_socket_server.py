"""WasmEdge's socket extension through the real host: the socket_server guest over HTTP (embedding API
and ``wasinn run``, Ctrl-C included); every socket function's edge cases are in test_socket_probe.py."""

from __future__ import annotations

import http.client
import logging
import pathlib
import re
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

from wasinn_host import GuestError, RunOptions, WasiNN
from wasinn_host.sockets import SocketPolicy
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

from .probe import read_line

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
