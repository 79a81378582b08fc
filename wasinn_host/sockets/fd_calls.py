"""The preview 1 descriptor functions on socket descriptors.

``fd_read``/``fd_write`` receive and send, ``fd_close`` closes, ``fd_fdstat_get`` reports a
socket file type with ``NONBLOCK`` when set, ``fd_fdstat_set_flags`` sets or clears
``NONBLOCK`` (other flags: NOTSUP).  Calls on other descriptors never come here: the linking
layer hands them to wasmtime's own functions.
"""

from __future__ import annotations

import struct

from .call import Call
from .constants import (
    FDFLAGS_NONBLOCK,
    FILETYPE_SOCKET_DGRAM,
    FILETYPE_SOCKET_STREAM,
    SOCKET_RIGHTS,
    WasiErrno,
)
from .io_ops import receive, send
from .table import SockError


def fd_read(call: Call, fd: int, iovs: int, iovs_len: int, nread_ptr: int) -> int:
    """``fd_read`` on a socket: receive into the buffers."""
    call.view.address(nread_ptr, 4, "nread")
    entry = call.state.entry(fd)
    nbytes, _ = receive(call.state, entry, call.view.iovecs(iovs, iovs_len, "read"))
    call.view.put_u32(nread_ptr, nbytes, "nread")
    return 0


def fd_write(call: Call, fd: int, iovs: int, iovs_len: int, nwritten_ptr: int) -> int:
    """``fd_write`` on a socket: send the buffers."""
    call.view.address(nwritten_ptr, 4, "nwritten")
    entry = call.state.entry(fd)
    sent = send(call.state, entry, call.view.iovecs(iovs, iovs_len, "write"))
    call.view.put_u32(nwritten_ptr, sent, "nwritten")
    return 0


def fd_close(call: Call, fd: int) -> int:
    """``fd_close`` on a socket."""
    call.state.remove(fd)
    return 0


def fd_fdstat_get(call: Call, fd: int, stat_ptr: int) -> int:
    """``fd_fdstat_get`` on a socket: file type, ``NONBLOCK``, the socket rights."""
    call.view.address(stat_ptr, 24, "fdstat")
    entry = call.state.entry(fd)
    filetype = FILETYPE_SOCKET_STREAM if entry.filetype_is_stream else FILETYPE_SOCKET_DGRAM
    flags = FDFLAGS_NONBLOCK if entry.nonblocking else 0
    call.view.write(stat_ptr, struct.pack("<BxHxxxxQQ", filetype, flags, SOCKET_RIGHTS, SOCKET_RIGHTS), "fdstat")
    return 0


def fd_fdstat_set_flags(call: Call, fd: int, flags: int) -> int:
    """``fd_fdstat_set_flags`` on a socket: only ``NONBLOCK`` may be set or cleared."""
    entry = call.state.entry(fd)
    if flags & ~FDFLAGS_NONBLOCK:
        raise SockError(WasiErrno.NOTSUP)
    entry.nonblocking = bool(flags & FDFLAGS_NONBLOCK)
    return 0
