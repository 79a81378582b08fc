"""What the socket fuzzer draws: pointers and lengths near the memory's edges, descriptors, addresses,
names, services, option values, clocks, and the guest memory they live in.

:func:`ptr_for` and :func:`length_for` give mostly sane values and, for a "wild" call, edges, values
past the end of memory and absurd ones; the catalogues hold the values that found bugs (the issue's
names that fail IDNA, 25-day and u64::MAX clocks, 30-day and i64::MAX timeouts) beside ordinary ones.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from hypothesis import strategies as st

from wasinn_host.sockets.table import SOCKET_FD_BASE
from wasinn_host.testing.socket_probe import PAGE

U32 = 0xFFFF_FFFF
U64 = 2**64 - 1
I64 = 2**63 - 1
MEMORY_PAGES = 2
MEM = MEMORY_PAGES * PAGE
HUGE = (MEM, MEM + 1, MEM + 4096, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFC, U32)
BAD_FDS = (0, 1, 2, 3, 999, SOCKET_FD_BASE - 1, SOCKET_FD_BASE + 100_000, 0x7FFF_FFFF, 0x8000_0000, U32)
DAY_NS = 86_400 * 10**9
SHORT_NS = 20_000_000
"""The longest clock the fuzzer gives a poll that waits on no socket (wasmtime's own poll then sleeps it)."""


def weighted(*pairs: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick a strategy with the given integer weights."""
    table = [s for w, s in pairs for _ in range(w)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


u32s = st.integers(0, U32)


def ptr_for(n: int, wild: bool) -> st.SearchStrategy[int]:
    """A guest pointer meant for ``n`` bytes: inside memory, or (``wild``) often at its edges or past them."""
    n = min(n, MEM)
    inside = st.integers(0, MEM - n)
    if not wild:
        return inside
    edges = sorted({p for p in (0, MEM - n, MEM - n + 1, MEM - 1, *HUGE) if 0 <= p <= U32})
    return weighted((6, inside), (3, st.sampled_from(edges)), (1, u32s))


def length_for(n: int, wild: bool) -> st.SearchStrategy[int]:
    """A length or count for ``n``: exact, or (``wild``) sometimes off by one or absurd."""
    if not wild:
        return st.just(n)
    edges = sorted({x for x in (0, n - 1, n + 1, 1025, MEM, 1 << 28, 0x8000_0000, U32) if x >= 0})
    return weighted((8, st.just(n)), (3, st.sampled_from(edges)), (1, u32s))


ADDRESSES = (
    socket.inet_aton("127.0.0.1"),
    socket.inet_aton("127.0.0.1"),
    socket.inet_aton("127.0.0.2"),
    socket.inet_aton("0.0.0.0"),
    socket.inet_aton("10.1.2.3"),
    socket.inet_pton(socket.AF_INET6, "::1"),
    socket.inet_pton(socket.AF_INET6, "::ffff:127.0.0.1"),
    socket.inet_pton(socket.AF_INET6, "::"),
)
NODES = (
    b"127.0.0.1",
    b"::1",
    b"localhost",
    b"0.0.0.0",
    b"",
    b"a" * 64 + b".example",
    b"a" * 63 + b".invalid",
    b"\xff\xfe",
    b"x" * 300,
    b".".join([b"y" * 60] * 5),
    b"a..b",
    b"local\x00host",
    "b\u00fccher.invalid".encode(),
    "\ufffd".encode(),
    b"example.invalid",
    b"1.2.3.4.5",
    b"[::1]",
    b"fe80::1%lo",
)
SERVICES = (b"", b"80", b"0", b"65535", b"65536", b"99999999", b"http", b"-1", b"\xff", b"8\x000")
TIMEVALS = (
    (0, 1_000),
    (0, 20_000),
    (0, 0),
    (30 * 86_400, 0),
    (I64, 0),
    (I64, 999_999),
    (1 << 32, 0),
    (-1, 0),
    (0, 1_000_000),
    (0, -1),
    (-(2**63), 0),
)
I32S = (0, 1, -1, 2, 4096, 1 << 20, 2**31 - 1, -(2**31))
LINGERS = ((1, 0), (0, 0), (0, 100), (-1, 0), (2, -1))
CLOCK_IDS = (0, 1, 1, 1, 2, 3, 99, U32)


def short_clock(raw: bytes) -> bytes:
    """``raw`` with a clock's timeout cut to at most :data:`SHORT_NS`, relative (other kinds as they are)."""
    if raw[8] != 0:
        return raw
    userdata, clock, timeout, _precision, flags = struct.unpack("<Q8xI4xQQH6x", raw)
    return struct.pack("<QB7xI4xQQH6x", userdata, 0, clock, timeout % (SHORT_NS + 1), 0, flags & ~1)
