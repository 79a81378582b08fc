"""Numbers of the socket ABI: WASI errno, WasmEdge's socket enums and the structs' layouts.

This module is the only place in :mod:`wasinn_host.sockets` where these numbers appear.  The
errno values are WASI preview 1's (``witx``); the address family, socket type and option
numbers are WasmEdge's (``lib/host/wasi``, crate ``wasmedge_wasi_socket``).
"""

from __future__ import annotations

import enum
import errno as os_errno


class WasiErrno(enum.IntEnum):
    """WASI preview 1 errno values the socket layer returns."""

    SUCCESS = 0
    TOOBIG = 1
    ACCES = 2
    ADDRINUSE = 3
    ADDRNOTAVAIL = 4
    AFNOSUPPORT = 5
    AGAIN = 6
    ALREADY = 7
    BADF = 8
    CONNABORTED = 13
    CONNREFUSED = 14
    CONNRESET = 15
    DESTADDRREQ = 17
    FAULT = 21
    HOSTUNREACH = 23
    INPROGRESS = 26
    INTR = 27
    INVAL = 28
    IO = 29
    ISCONN = 30
    MFILE = 33
    MSGSIZE = 35
    NETDOWN = 38
    NETRESET = 39
    NETUNREACH = 40
    NFILE = 41
    NOBUFS = 42
    NOMEM = 48
    NOPROTOOPT = 50
    NOSYS = 52
    NOTCONN = 53
    NOTSOCK = 57
    NOTSUP = 58
    OVERFLOW = 61
    PIPE = 64
    TIMEDOUT = 73
    NOTCAPABLE = 76
    # WasmEdge's getaddrinfo errors (after WASI's numbers)
    AIAGAIN = 77
    AIBADFLAG = 78
    AIFAIL = 79
    AIFAMILY = 80
    AIMEMORY = 81
    AINONAME = 82


_FROM_OS = {
    os_errno.EACCES: WasiErrno.ACCES,
    os_errno.EPERM: WasiErrno.ACCES,
    os_errno.EADDRINUSE: WasiErrno.ADDRINUSE,
    os_errno.EADDRNOTAVAIL: WasiErrno.ADDRNOTAVAIL,
    os_errno.EAFNOSUPPORT: WasiErrno.AFNOSUPPORT,
    os_errno.EAGAIN: WasiErrno.AGAIN,
    os_errno.EALREADY: WasiErrno.ALREADY,
    os_errno.EBADF: WasiErrno.BADF,
    os_errno.ECONNABORTED: WasiErrno.CONNABORTED,
    os_errno.ECONNREFUSED: WasiErrno.CONNREFUSED,
    os_errno.ECONNRESET: WasiErrno.CONNRESET,
    os_errno.EDESTADDRREQ: WasiErrno.DESTADDRREQ,
    os_errno.EHOSTUNREACH: WasiErrno.HOSTUNREACH,
    os_errno.EINPROGRESS: WasiErrno.INPROGRESS,
    os_errno.EINTR: WasiErrno.INTR,
    os_errno.EINVAL: WasiErrno.INVAL,
    os_errno.EISCONN: WasiErrno.ISCONN,
    os_errno.EMFILE: WasiErrno.MFILE,
    os_errno.EMSGSIZE: WasiErrno.MSGSIZE,
    os_errno.ENETDOWN: WasiErrno.NETDOWN,
    os_errno.ENETRESET: WasiErrno.NETRESET,
    os_errno.ENETUNREACH: WasiErrno.NETUNREACH,
    os_errno.ENFILE: WasiErrno.NFILE,
    os_errno.ENOBUFS: WasiErrno.NOBUFS,
    os_errno.ENOMEM: WasiErrno.NOMEM,
    os_errno.ENOPROTOOPT: WasiErrno.NOPROTOOPT,
    os_errno.ENOTCONN: WasiErrno.NOTCONN,
    os_errno.ENOTSOCK: WasiErrno.NOTSOCK,
    os_errno.EOPNOTSUPP: WasiErrno.NOTSUP,
    os_errno.EPIPE: WasiErrno.PIPE,
    os_errno.ETIMEDOUT: WasiErrno.TIMEDOUT,
}


def errno_from_os(code: int | None) -> WasiErrno:
    """The WASI errno for a host ``errno`` (IO when WASI has no such number)."""
    return _FROM_OS.get(code or 0, WasiErrno.IO)


# WasmEdge's address families (sock_open's first argument, the V2 address storage's first u16)
AF_UNSPEC = 0
AF_INET4 = 1
AF_INET6 = 2
AF_UNIX = 3

# WasmEdge's socket types (sock_open's second argument, SO_TYPE)
SOCK_ANY = 0
SOCK_DGRAM = 1
SOCK_STREAM = 2

# sock_getsockopt / sock_setsockopt: the one level and the option names
SOL_SOCKET = 0
SO_REUSEADDR = 0
SO_TYPE = 1
SO_ERROR = 2
SO_DONTROUTE = 3
SO_BROADCAST = 4
SO_SNDBUF = 5
SO_RCVBUF = 6
SO_KEEPALIVE = 7
SO_OOBINLINE = 8
SO_LINGER = 9
SO_RCVLOWAT = 10
SO_RCVTIMEO = 11
SO_SNDTIMEO = 12
SO_ACCEPTCONN = 13
SO_BINDTODEVICE = 14

# flags
FDFLAGS_APPEND = 1
FDFLAGS_NONBLOCK = 4
RIFLAGS_PEEK = 1
RIFLAGS_WAITALL = 2
SDFLAGS_RD = 1
SDFLAGS_WR = 2

# fd_fdstat_get: file types and the rights a socket descriptor has
FILETYPE_SOCKET_DGRAM = 5
FILETYPE_SOCKET_STREAM = 6
SOCKET_RIGHTS = (1 << 1) | (1 << 3) | (1 << 6) | (1 << 21) | (1 << 27) | (1 << 28) | (1 << 29)
"""fd_read, fd_fdstat_set_flags, fd_write, fd_filestat_get, poll_fd_readwrite, sock_shutdown, sock_accept."""

# poll_oneoff
EVENTTYPE_CLOCK = 0
EVENTTYPE_FD_READ = 1
EVENTTYPE_FD_WRITE = 2
SUBCLOCKFLAGS_ABSTIME = 1
EVENTRWFLAGS_HANGUP = 1
CLOCK_REALTIME = 0
CLOCK_MONOTONIC = 1
SUBSCRIPTION_SIZE = 48
EVENT_SIZE = 32

# sizes
ADDRESS_SIZE = 8
"""``__wasi_address_t``: ``{u32 buf, u32 buf_len}``."""
ADDR_STORAGE_SIZE = 128
"""The V2 address storage: ``u16`` family, then the address bytes."""
IOVEC_SIZE = 8
IOV_MAX = 1024
FDSTAT_SIZE = 24
ADDRINFO_SIZE = 28
SOCKADDR_SIZE = 12
