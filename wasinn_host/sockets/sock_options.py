"""``sock_setsockopt`` and ``sock_getsockopt``: WasmEdge's ``SOL_SOCKET`` options on host sockets.

Integer options are 4-byte ``i32`` values; ``SO_LINGER`` is ``{i32 onoff, i32 seconds}``;
``SO_RCVTIMEO``/``SO_SNDTIMEO`` are ``{i64 seconds, i64 microseconds}`` and bound how long a
blocking guest socket waits (then AGAIN), however long (2**32 seconds or more: no timeout).
``SO_BINDTODEVICE`` is refused (NOTSUP); the read-only ``SO_TYPE``, ``SO_ERROR`` and
``SO_ACCEPTCONN`` cannot be set (NOPROTOOPT).
"""

from __future__ import annotations

import socket
import struct

from .call import Call
from .constants import (
    SO_ACCEPTCONN,
    SO_BINDTODEVICE,
    SO_BROADCAST,
    SO_DONTROUTE,
    SO_ERROR,
    SO_KEEPALIVE,
    SO_LINGER,
    SO_OOBINLINE,
    SO_RCVBUF,
    SO_RCVLOWAT,
    SO_RCVTIMEO,
    SO_REUSEADDR,
    SO_SNDBUF,
    SO_SNDTIMEO,
    SO_TYPE,
    SOL_SOCKET,
    WasiErrno,
    errno_from_os,
)
from .table import SockError, SocketEntry

INT_OPTIONS = {
    SO_REUSEADDR: socket.SO_REUSEADDR,
    SO_DONTROUTE: socket.SO_DONTROUTE,
    SO_BROADCAST: socket.SO_BROADCAST,
    SO_SNDBUF: socket.SO_SNDBUF,
    SO_RCVBUF: socket.SO_RCVBUF,
    SO_KEEPALIVE: socket.SO_KEEPALIVE,
    SO_OOBINLINE: socket.SO_OOBINLINE,
    SO_RCVLOWAT: socket.SO_RCVLOWAT,
}
NO_TIMEOUT_SECONDS = 1 << 32
"""``SO_RCVTIMEO``/``SO_SNDTIMEO`` of this many seconds (136 years) or more mean no timeout."""
_TIMEVAL = struct.Struct("<qq")
_LINGER = struct.Struct("<ii")
_I32 = struct.Struct("<i")


def sock_setsockopt(call: Call, fd: int, level: int, name: int, flag_ptr: int, size: int) -> int:
    """``sock_setsockopt(fd, level, name, *value, size)``."""
    call.view.address(flag_ptr, size, "option value")
    value = call.view.read(flag_ptr, min(size, _TIMEVAL.size), "option value")  # no option is longer
    entry = call.state.entry(fd)
    if level != SOL_SOCKET:
        raise SockError(WasiErrno.INVAL)
    if name in INT_OPTIONS:
        _need(size, 4)
        _set(entry, INT_OPTIONS[name], _I32.unpack_from(value)[0])
    elif name == SO_LINGER:
        _need(size, _LINGER.size)
        _set(entry, socket.SO_LINGER, value[: _LINGER.size])
    elif name in (SO_RCVTIMEO, SO_SNDTIMEO):
        _need(size, _TIMEVAL.size)
        seconds, micros = _TIMEVAL.unpack_from(value)
        if seconds < 0 or not 0 <= micros < 1_000_000:
            raise SockError(WasiErrno.INVAL)
        # Any length is valid (30 days is a 30-day timeout: the wait is cut into pieces the host's poll
        # can take, see SocketState.wait).  Past NO_TIMEOUT_SECONDS it means none, as Linux (which
        # WasmEdge hands the option to) treats a timeout past its scheduler's limit, and reads back 0.
        timeout = None if seconds >= NO_TIMEOUT_SECONDS else seconds + micros / 1e6 or None
        if name == SO_RCVTIMEO:
            entry.recv_timeout = timeout
        else:
            entry.send_timeout = timeout
    elif name in (SO_TYPE, SO_ERROR, SO_ACCEPTCONN):
        raise SockError(WasiErrno.NOPROTOOPT)
    elif name == SO_BINDTODEVICE:
        raise SockError(WasiErrno.NOTSUP, f"sock_setsockopt: SO_BINDTODEVICE on socket {fd} is not allowed")
    else:
        raise SockError(WasiErrno.INVAL)
    return 0


def sock_getsockopt(call: Call, fd: int, level: int, name: int, flag_ptr: int, size_ptr: int) -> int:
    """``sock_getsockopt(fd, level, name, *value, *size)``: ``*size`` is the room, then the length."""
    view = call.view
    room = view.u32(size_ptr, "option size")
    view.address(flag_ptr, room, "option value")
    entry = call.state.entry(fd)
    if level != SOL_SOCKET:
        raise SockError(WasiErrno.INVAL)
    if name in INT_OPTIONS:
        data = _I32.pack(entry.sock.getsockopt(socket.SOL_SOCKET, INT_OPTIONS[name]))
    elif name == SO_TYPE:
        data = _I32.pack(entry.kind)
    elif name == SO_ERROR:
        code = entry.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        data = _I32.pack(errno_from_os(code) if code else 0)
    elif name == SO_ACCEPTCONN:
        data = _I32.pack(entry.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    elif name == SO_LINGER:
        data = entry.sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER.size)
    elif name in (SO_RCVTIMEO, SO_SNDTIMEO):
        timeout = entry.recv_timeout if name == SO_RCVTIMEO else entry.send_timeout
        whole = int(timeout or 0)
        data = _TIMEVAL.pack(whole, round(((timeout or 0) - whole) * 1e6))
    else:
        raise SockError(WasiErrno.INVAL)
    _need(room, len(data))
    view.write(flag_ptr, data, "option value")
    view.put_u32(size_ptr, len(data), "option size")
    return 0


def _need(size: int, wanted: int) -> None:
    if size < wanted:
        raise SockError(WasiErrno.INVAL)


def _set(entry: SocketEntry, name: int, value: int | bytes) -> None:
    entry.sock.setsockopt(socket.SOL_SOCKET, name, value)
    entry.options[(socket.SOL_SOCKET, name)] = value
