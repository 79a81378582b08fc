"""Moving bytes on a guest socket: receive, send, and waiting the way a blocking socket would.

Host sockets never block.  A guest socket in blocking mode (the default; ``FDFLAGS_NONBLOCK``
clears it) waits in :meth:`~wasinn_host.sockets.table.SocketState.wait` until the socket is
ready, its ``SO_RCVTIMEO``/``SO_SNDTIMEO`` passes (AGAIN) or the host cancels the guest; a
guest socket in non-blocking mode gets AGAIN at once.  A blocking send sends everything.
"""

from __future__ import annotations

import select
import socket
import time
from functools import partial
from typing import Callable, TypeVar

from .constants import RIFLAGS_PEEK, RIFLAGS_WAITALL, WasiErrno
from .table import SockError, SocketEntry, SocketState

T = TypeVar("T")
ROFLAGS_DATA_TRUNCATED = 1


def blocking(state: SocketState, entry: SocketEntry, op: Callable[[], T], events: int, timeout: float | None) -> T:
    """Run ``op`` (a non-blocking socket call); if it would block, AGAIN for a non-blocking guest
    socket, else wait for ``events`` and retry until ``timeout`` seconds pass (then AGAIN)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return op()
        except BlockingIOError:
            if entry.nonblocking:
                raise SockError(WasiErrno.AGAIN) from None
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise SockError(WasiErrno.AGAIN)
        state.wait([(entry.sock.fileno(), events)], remaining)


def recv_flags(ri_flags: int) -> int:
    """Host ``recv`` flags for WASI's ``riflags`` (INVAL for unknown bits)."""
    if ri_flags & ~(RIFLAGS_PEEK | RIFLAGS_WAITALL):
        raise SockError(WasiErrno.INVAL)
    return (socket.MSG_PEEK if ri_flags & RIFLAGS_PEEK else 0) | (
        socket.MSG_WAITALL if ri_flags & RIFLAGS_WAITALL else 0
    )


def receive(state: SocketState, entry: SocketEntry, buffers: list[memoryview], flags: int = 0) -> tuple[int, int]:
    """Receive into the guest's buffers: (bytes received, WASI ``roflags``)."""
    if sum(len(b) for b in buffers) == 0:
        return 0, 0
    nbytes, _, msg_flags, _ = blocking(
        state, entry, lambda: entry.sock.recvmsg_into(buffers, 0, flags), select.POLLIN, entry.recv_timeout
    )
    return nbytes, ROFLAGS_DATA_TRUNCATED if msg_flags & socket.MSG_TRUNC else 0


def receive_from(
    state: SocketState, entry: SocketEntry, buffers: list[memoryview], flags: int = 0
) -> tuple[int, int, object]:
    """Receive a datagram: (bytes, ``roflags``, the sender's Python address)."""
    nbytes, _, msg_flags, address = blocking(
        state, entry, lambda: entry.sock.recvmsg_into(buffers, 0, flags), select.POLLIN, entry.recv_timeout
    )
    return nbytes, ROFLAGS_DATA_TRUNCATED if msg_flags & socket.MSG_TRUNC else 0, address


def send(state: SocketState, entry: SocketEntry, buffers: list[memoryview], address: object = None) -> int:
    """Send the guest's buffers; a blocking guest socket sends all of them. Returns the bytes sent."""
    extra = () if address is None else (address,)
    total = sum(len(b) for b in buffers)
    if total == 0 and address is None:
        return 0

    def once(views: list[memoryview]) -> int:
        return entry.sock.sendmsg(views, [], socket.MSG_NOSIGNAL, *extra)

    sent = blocking(state, entry, lambda: once(buffers), select.POLLOUT, entry.send_timeout)
    while sent < total and not entry.nonblocking:
        try:
            sent += blocking(state, entry, partial(once, _after(buffers, sent)), select.POLLOUT, entry.send_timeout)
        except SockError:
            return sent  # a send timeout after part of the data: report what went
    return sent


def _after(buffers: list[memoryview], offset: int) -> list[memoryview]:
    rest: list[memoryview] = []
    for buffer in buffers:
        if offset >= len(buffer):
            offset -= len(buffer)
            continue
        rest.append(buffer[offset:])
        offset = 0
    return rest
