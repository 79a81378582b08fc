"""Which guest bytes a socket call may write, for the socket fuzzer's memory check.

:func:`writable_ranges` reads the guest's own structures (iovec arrays, ``{buf, len}`` address
structs, ``sock_getaddrinfo``'s linked records, the room ``*size`` of ``sock_getsockopt``) from a
copy of guest memory and returns every ``(start, length)`` the call may change.  The fuzzer takes it
from memory before *and* after the call (a write can change a pointer a later write follows) and
checks that no other byte changed: a host that writes outside them, or outside memory, is caught.
"""

from __future__ import annotations

import struct

Range = tuple[int, int]
IOV_MAX = 1024
MAX_RECORDS = 64
"""``sock_getaddrinfo`` records followed at most (the host fills a few for a loopback name)."""
SOCKADDR_DATA = 26
"""The most bytes the host writes into one record's sockaddr data (port, flow info, address, scope)."""


def _u32(mem: bytes, ptr: int) -> int | None:
    if ptr + 4 > len(mem):
        return None
    return int(struct.unpack_from("<I", mem, ptr)[0])


def _iovecs(mem: bytes, ptr: int, count: int) -> list[Range]:
    if count > IOV_MAX or ptr + 8 * count > len(mem):
        return []
    pairs = struct.unpack_from(f"<{2 * count}I", mem, ptr)
    return [(pairs[2 * i], pairs[2 * i + 1]) for i in range(count)]


def _address_buffer(mem: bytes, ptr: int) -> list[Range]:
    """The ``buf`` of a ``{u32 buf, u32 buf_len}`` at ``ptr``."""
    buf, length = _u32(mem, ptr), _u32(mem, ptr + 4)
    return [] if buf is None or length is None else [(buf, length)]


def _records(mem: bytes, res_ptr: int, max_res: int) -> list[Range]:
    """What ``sock_getaddrinfo`` may write along the guest's chain of records."""
    out: list[Range] = []
    record = _u32(mem, res_ptr)
    for _ in range(min(max_res, MAX_RECORDS)):
        if record is None or record + 28 > len(mem):
            break
        out.append((record, 12))  # flags, family, socktype, protocol, padding, addrlen
        addr_ptr, canon_ptr, canon_len, next_ptr = struct.unpack_from("<IIII", mem, record + 12)
        out.append((addr_ptr, 1))  # the sockaddr's family byte
        data_len, data_ptr = _u32(mem, addr_ptr + 4), _u32(mem, addr_ptr + 8)
        if data_len is not None and data_ptr is not None:
            out.append((data_ptr, min(data_len, SOCKADDR_DATA)))
        out.append((canon_ptr, canon_len))
        if next_ptr == 0:
            break
        record = next_ptr
    return out


def writable_ranges(name: str, variant: str, args: tuple[int, ...], mem: bytes) -> list[Range]:
    """The guest ranges ``name(*args)`` may write, read from ``mem`` (guest memory at some moment)."""
    a = args
    if name in ("sock_open",):
        return [(a[2], 4)]
    if name == "sock_accept":
        return [(a[-1], 4)]
    if name in ("sock_recv", "fd_read"):
        tail = [(a[4], 4), (a[5], 2)] if name == "sock_recv" else [(a[3], 4)]
        return _iovecs(mem, a[1], a[2]) + tail
    if name == "sock_recv_from":
        out = _iovecs(mem, a[1], a[2]) + _address_buffer(mem, a[3])
        if variant == "v1":  # (fd, iovs, n, addr, riflags, nread, roflags)
            return out + [(a[5], 4), (a[6], 2)]
        return out + [(a[5], 2), (a[6], 4), (a[7], 2)]  # (..., riflags, port, nread, roflags)
    if name in ("sock_send", "fd_write", "sock_send_to"):
        return [(a[-1], 4)]
    if name in ("sock_getlocaladdr", "sock_getpeeraddr"):
        tail = [(a[2], 4), (a[3], 4)] if variant == "v1" else [(a[2], 4)]
        return _address_buffer(mem, a[1]) + tail
    if name == "sock_getsockopt":
        room = _u32(mem, a[4])
        return [(a[4], 4)] + ([(a[3], room)] if room is not None else [])
    if name == "sock_getaddrinfo":
        return [(a[7], 4)] + _records(mem, a[5], a[6])
    if name == "fd_fdstat_get":
        return [(a[1], 24)]
    if name == "poll_oneoff":
        return [(a[1], 32 * a[2]), (a[3], 4)]
    return []  # bind, listen, connect, shutdown, setsockopt, close, set_flags: nothing
