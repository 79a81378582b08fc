"""Bad arguments to the socket imports get an errno and one log line, never a trap (issue 28, item 3).

Each case trapped the guest with ``wasi_ephemeral_nn.sock_*: host error`` and logged nothing: a
``poll_oneoff`` of 2**28 or more subscriptions (the array's byte length wrapped modulo 2**32), a clock
subscription of 25 days or more beside a socket and a blocking ``recv`` under a 30-day ``SO_RCVTIMEO``
(Python's ``poll`` takes at most 2**31 - 1 ms), a ``sock_getaddrinfo`` node that Python cannot IDNA-encode,
and any exception a socket function did not mean to raise.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import wasmtime

from wasinn_host.sockets import SocketLayer, SocketPolicy, linking
from wasinn_host.testing.socket_probe import SocketProbe, clock_sub, fd_sub

FAULT, INVAL, IO, OVERFLOW, AINONAME = 21, 28, 29, 61, 82
FD, ADDR, ADDR_BYTES, STORAGE, IOV, DATA, OUT = 0, 16, 32, 64, 256, 512, 1024
SO_RCVTIMEO, SO_SNDTIMEO = 11, 12
DAY_NS = 86_400 * 10**9
U64_MAX = 2**64 - 1
WAIT = 20.0


@pytest.fixture(scope="module")
def engine() -> wasmtime.Engine:
    return wasmtime.Engine()


@pytest.fixture
def probe(engine: wasmtime.Engine) -> Iterator[SocketProbe]:
    """A guest under the default policy: loopback listeners, no outbound connections, numeric names."""
    started = SocketProbe(SocketLayer(engine))
    yield started
    started.close()


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The host's log records at WARNING and above during the test."""
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        yield caplog


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("wasinn_host") and r.levelno >= logging.WARNING]


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in records(caplog)]


def listener(probe: SocketProbe) -> tuple[int, int]:
    assert probe("sock_open", 1, 2, FD) == 0
    fd = probe.u32(FD)
    probe.write(ADDR_BYTES, socket.inet_aton("127.0.0.1"))
    probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 4))
    assert probe("sock_bind", fd, ADDR, 0) == 0
    assert probe("sock_listen", fd, 4) == 0
    probe.write(ADDR, struct.pack("<II", STORAGE, 128))
    assert probe("sock_getlocaladdr", fd, ADDR, OUT) == 0
    return fd, probe.u32(OUT)


def later(action: object, delay: float = 0.2) -> threading.Thread:
    """Run ``action`` in a thread after ``delay`` seconds (what ends the guest's wait)."""
    assert callable(action)

    def run() -> None:
        time.sleep(delay)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def poll(probe: SocketProbe, subs: list[bytes]) -> list[tuple[int, int, int, int, int]]:
    probe.write(OUT, b"".join(subs))
    events_ptr = OUT + 48 * len(subs)
    count_ptr = events_ptr + 32 * len(subs)
    assert probe("poll_oneoff", OUT, events_ptr, len(subs), count_ptr) == 0
    raw = probe.read(events_ptr, 32 * probe.u32(count_ptr))
    return [struct.unpack_from("<QHBxxxxxQH6x", raw, i) for i in range(0, len(raw), 32)]


# -- poll_oneoff: the subscription count -----------------------------------------------------------


@pytest.mark.parametrize("count", [1 << 28, 89_478_486, 0xFFFF_FFFF])
def test_poll_with_more_subscriptions_than_memory_is_fault(
    probe: SocketProbe, lines: pytest.LogCaptureFixture, count: int
) -> None:
    """2**28 x 48 bytes is 12 GiB, exactly 0 modulo 2**32; 89,478,486 x 48 is 32 modulo 2**32."""
    fd, _ = listener(probe)
    probe.write(OUT, fd_sub(1, 1, fd) * 2)  # what the wrapped length would have read
    assert probe("poll_oneoff", OUT, OUT + 4096, count, OUT + 8192) == FAULT
    assert messages(lines) == [
        f"poll_oneoff: {count} subscriptions [{OUT}, {OUT + 48 * count}) is outside the guest memory of "
        "65536 bytes (errno 21 FAULT)"
    ]
    assert poll(probe, [fd_sub(1, 1, fd), clock_sub(2, 1_000_000)]) == [(2, 0, 0, 0, 0)]  # the host goes on


# -- poll_oneoff: clocks of any length beside a socket ------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "absolute"),
    [(25 * DAY_NS, False), (400 * DAY_NS, False), (U64_MAX, False), (U64_MAX, True)],
    ids=["25-days", "400-days", "u64-max", "u64-max-absolute"],
)
def test_a_far_clock_beside_a_socket_waits_for_the_socket(
    probe: SocketProbe, lines: pytest.LogCaptureFixture, timeout: int, absolute: bool
) -> None:
    """WASI allows any u64 timeout: the clock just fires that late; the socket ends the wait first."""
    fd, port = listener(probe)
    client = socket.socket()
    thread = later(lambda: client.connect(("127.0.0.1", port)))
    started = time.monotonic()
    assert poll(probe, [fd_sub(1, 1, fd), clock_sub(2, timeout, absolute)]) == [(1, 0, 1, 0, 0)]
    assert 0.15 <= time.monotonic() - started < WAIT
    thread.join(WAIT)
    client.close()
    assert messages(lines) == []


def test_a_far_clock_does_not_hide_a_near_one(probe: SocketProbe, lines: pytest.LogCaptureFixture) -> None:
    fd, _ = listener(probe)
    started = time.monotonic()
    subs = [fd_sub(1, 1, fd), clock_sub(2, 30 * DAY_NS), clock_sub(3, U64_MAX), clock_sub(4, 50_000_000)]
    assert poll(probe, subs) == [(4, 0, 0, 0, 0)]
    assert 0.045 <= time.monotonic() - started < WAIT
    # an unknown clock flag is that subscription's INVAL, as in WasmEdge
    assert poll(probe, [fd_sub(1, 1, fd), clock_sub(5, 0, flags=2)]) == [(5, INVAL, 0, 0, 0)]
    assert messages(lines) == []


def test_misaligned_arrays_beside_a_socket_never_trap(probe: SocketProbe, lines: pytest.LogCaptureFixture) -> None:
    """Found by the socket fuzzer: wasmtime traps on a misaligned pointer, and the socket layer asked it
    (for the guest's clock, and about its own descriptors) on the guest's own, misaligned arrays."""
    fd, _ = listener(probe)
    assert probe("clock_time_get", 1, 1, OUT) == 0
    now = int(struct.unpack("<Q", probe.read(OUT, 8))[0])
    subs = fd_sub(1, 1, fd) + clock_sub(2, now + 50_000_000, absolute=True)
    probe.write(OUT + 1, subs)
    started = time.monotonic()
    assert probe("poll_oneoff", OUT + 1, OUT + 201, 2, OUT + 300) == 0  # the clock is read into an aligned place
    assert 0.045 <= time.monotonic() - started < WAIT
    assert probe.u32(OUT + 300) == 1 and struct.unpack_from("<QHB", probe.read(OUT + 201, 11)) == (2, 0, 0)
    assert messages(lines) == []
    probe.write(OUT + 1, fd_sub(1, 1, fd) + fd_sub(3, 2, 1))  # a socket and stdout: wasmtime must be asked
    assert probe("poll_oneoff", OUT + 1, OUT + 201, 2, OUT + 300) == INVAL
    assert messages(lines) == [
        f"poll_oneoff: subscriptions at {OUT + 1}, events at {OUT + 201} and nevents at {OUT + 300} must be aligned "
        "to 8, 8 and 4 bytes to wait on sockets and other descriptors together (errno 28 INVAL)"
    ]


# -- SO_RCVTIMEO / SO_SNDTIMEO of any length -----------------------------------------------------------


def timeval(probe: SocketProbe, fd: int, name: int) -> tuple[int, int]:
    probe.write(OUT, struct.pack("<I", 16))
    assert probe("sock_getsockopt", fd, 0, name, DATA, OUT) == 0
    assert probe.u32(OUT) == 16
    seconds, micros = struct.unpack("<qq", probe.read(DATA, 16))
    return seconds, micros


@pytest.mark.parametrize(
    ("seconds", "reads_back"),
    [(30 * 86_400, (30 * 86_400, 250_000)), (2**63 - 1, (0, 0))],
    ids=["30-days", "i64-max"],
)
def test_a_long_receive_timeout_lets_a_blocking_recv_wait(
    probe: SocketProbe, lines: pytest.LogCaptureFixture, seconds: int, reads_back: tuple[int, int]
) -> None:
    """30 days is a 30-day timeout (read back as set); 2**32 seconds or more means none (read back as
    0, as Linux, which WasmEdge hands the option to, does for a timeout past its limit)."""
    fd, port = listener(probe)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as client:
        assert probe("sock_accept", fd, 0, FD) == 0  # V2, blocking: the client is queued
        conn = probe.u32(FD)
        probe.write(DATA, struct.pack("<qq", seconds, 250_000))
        assert probe("sock_setsockopt", conn, 0, SO_RCVTIMEO, DATA, 16) == 0
        assert timeval(probe, conn, SO_RCVTIMEO) == reads_back
        thread = later(lambda: client.sendall(b"late"))
        probe.write(IOV, struct.pack("<II", DATA + 64, 16))
        started = time.monotonic()
        assert probe("sock_recv", conn, IOV, 1, 0, OUT, OUT + 4) == 0
        assert 0.15 <= time.monotonic() - started < WAIT
        assert (probe.u32(OUT), probe.read(DATA + 64, 4)) == (4, b"late")
        thread.join(WAIT)
    assert messages(lines) == []


def test_a_long_send_timeout_lets_a_blocking_connect_finish(
    engine: wasmtime.Engine, lines: pytest.LogCaptureFixture
) -> None:
    probe = SocketProbe(SocketLayer(engine, SocketPolicy.from_specs(connect=["127.0.0.1"])))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert probe("sock_open", 1, 2, FD) == 0
        fd = probe.u32(FD)
        probe.write(DATA, struct.pack("<qq", 30 * 86_400, 0))
        assert probe("sock_setsockopt", fd, 0, SO_SNDTIMEO, DATA, 16) == 0
        probe.write(ADDR_BYTES, socket.inet_aton("127.0.0.1"))
        probe.write(ADDR, struct.pack("<II", ADDR_BYTES, 4))
        assert probe("sock_connect", fd, ADDR, server.getsockname()[1]) == 0
        server.accept()[0].close()
    probe.close()
    assert messages(lines) == []


# -- sock_getaddrinfo: names that are no host names ----------------------------------------------------


def getaddrinfo(probe: SocketProbe, node: bytes) -> int:
    """sock_getaddrinfo of ``node``, service 80, for a STREAM socket into one pre-linked record."""
    probe.write(4000, node)
    probe.write(3900, b"80")
    probe.write(3904, struct.pack("<HBBBxxxIIIII", 0, 0, 2, 0, 0, 0, 0, 0, 0))  # hints: SOCK_STREAM
    probe.write(3940, struct.pack("<I", 3950))
    probe.write(3950, struct.pack("<HBBBxxxIIIII", 0, 0, 0, 0, 0, 3980, 0, 0, 0))
    probe.write(3980, struct.pack("<BxxxII", 0, 26, 3800))
    return probe("sock_getaddrinfo", 4000, len(node), 3900, 2, 3904, 3940, 1, 3996)


ACCEPTED = (
    "accepted: a numeric IPv4 or IPv6 address, localhost, or a host name of dot-separated labels of 1 to 63 "
    "characters, 253 in all (UTF-8; non-ASCII labels in IDNA) (errno 82 AINONAME)"
)


@pytest.mark.parametrize(
    ("node", "shown", "why"),
    [
        (b"a" * 64 + b".example", "a" * 64 + ".example", "a label of 64 characters"),
        (b"\xff\xfe", "\\xff\\xfe", "byte 0xff at 0 is not UTF-8"),
        (b"x" * 300, "x" * 80 + "...", "a label of 300 characters"),
        (b".".join([b"y" * 60] * 5), ".".join(["y" * 60] * 5)[:80] + "...", "it is 304 characters long"),
        (b"a..b", "a..b", "an empty label"),
        (b"local\x00host", "local\x00host", "it holds a NUL byte"),
        ("\ufffd.example".encode(), "\ufffd.example", "a character IDNA does not allow"),
    ],
    ids=["64-char-label", "ff-fe", "300-chars", "304-chars", "empty-label", "nul", "replacement-char"],
)
def test_a_node_that_is_no_host_name_is_ainoname_with_one_line(
    probe: SocketProbe, lines: pytest.LogCaptureFixture, node: bytes, shown: str, why: str
) -> None:
    """WasmEdge hands the bytes to the host's getaddrinfo, which finds no such host (EAI_NONAME)."""
    assert getaddrinfo(probe, node) == AINONAME
    assert messages(lines) == [f"sock_getaddrinfo: node {shown!r} is not a host name ({why}); {ACCEPTED}"]


def test_names_that_encode_still_resolve_as_before(probe: SocketProbe, lines: pytest.LogCaptureFixture) -> None:
    assert getaddrinfo(probe, b"127.0.0.1") == 0
    assert probe.u32(3996) == 1 and probe.read(3800, 6) == struct.pack(">H", 80) + socket.inet_aton("127.0.0.1")
    assert getaddrinfo(probe, b"a" * 63 + b".invalid") == AINONAME  # a name, but not a number: the policy
    assert getaddrinfo(probe, "bücher.invalid".encode()) == AINONAME
    assert messages(lines) == [
        f"sock_getaddrinfo: not resolving '{'a' * 63}.invalid': guests may resolve host names only with "
        "--sock-allow-connect (errno 82 AINONAME)",
        "sock_getaddrinfo: not resolving 'xn--bcher-kva.invalid': guests may resolve host names only with "
        "--sock-allow-connect (errno 82 AINONAME)",
    ]


# -- the wrapper: no exception of a socket function traps the guest ------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [(ZeroDivisionError("division by zero"), IO), (OverflowError("timeout is too large"), OVERFLOW)],
    ids=["ZeroDivisionError", "OverflowError"],
)
def test_an_unexpected_exception_is_an_errno_and_one_error_line(
    engine: wasmtime.Engine,
    monkeypatch: pytest.MonkeyPatch,
    lines: pytest.LogCaptureFixture,
    error: Exception,
    code: int,
) -> None:
    """A bug a guest reaches in any socket function: the guest gets an errno and goes on, the log one
    ERROR line naming the call, its arguments, the exception and where it was raised."""

    def broken(call: object, fd: int, backlog: int) -> int:
        raise error

    monkeypatch.setitem(linking.VARIANTS["sock_listen"], 2, broken)
    probe = SocketProbe(SocketLayer(engine))
    try:
        assert probe("sock_open", 1, 2, FD) == 0
        fd = probe.u32(FD)
        assert probe("sock_listen", fd, 7) == code
        name = type(error).__name__
        found = records(lines)
        assert len(found) == 1 and found[0].levelno == logging.ERROR
        assert re.fullmatch(
            rf"wasi_snapshot_preview1\.sock_listen\({fd}, 7\): unexpected {name}: {error} at "
            rf"test_socket_errno\.py:\d+; the guest gets errno {code} \w+ \(a host bug: please report it\)",
            found[0].getMessage(),
        ), found[0].getMessage()
        assert probe("sock_open", 1, 2, FD) == 0  # the guest goes on
    finally:
        probe.close()
