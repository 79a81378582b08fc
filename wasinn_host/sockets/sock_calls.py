"""WasmEdge's ``sock_*`` functions: open, bind, listen, accept, connect, recv, send, shutdown, addresses.

Each takes a :class:`~wasinn_host.sockets.call.Call` and the guest's i32 arguments and
returns 0, or raises :class:`~wasinn_host.sockets.table.SockError` (or ``OSError``, which the
linking layer turns into the WASI errno).  Out-pointers are checked before anything is done,
so a bad pointer never leaves a socket half made.  V1 and V2 differ only where their
signatures do (``sock_accept``, the address getters, ``sock_recv_from``).  Every new socket
(opened, accepted, or re-made for another address family) is within the caps of :mod:`.budget`.
"""

from __future__ import annotations

import errno as os_errno
import select
import socket
from functools import partial

from . import budget
from .addresses import (
    from_sockaddr,
    host_family,
    read_address,
    sockaddr,
    write_address_v1,
    write_address_v2,
    write_storage,
)
from .call import Call
from .constants import (
    AF_INET4,
    AF_INET6,
    AF_UNIX,
    AF_UNSPEC,
    FDFLAGS_NONBLOCK,
    SDFLAGS_RD,
    SDFLAGS_WR,
    SOCK_ANY,
    SOCK_DGRAM,
    SOCK_STREAM,
    WasiErrno,
    errno_from_os,
)
from .io_ops import blocking, receive, receive_from, recv_flags, send
from .policy import IPAddress
from .table import SockError, SocketEntry

MAX_BACKLOG = 4096


def sock_open(call: Call, family: int, kind: int, fd_ptr: int) -> int:
    """``sock_open(af, type, *fd)``: a new socket (IPv4 for af 0 or 1, IPv6 for 2)."""
    call.view.address(fd_ptr, 4, "fd")
    if family in (AF_UNSPEC, AF_INET4):
        host = socket.AF_INET
    elif family == AF_INET6:
        host = socket.AF_INET6
    elif family == AF_UNIX:
        raise SockError(WasiErrno.NOSYS)
    else:
        raise SockError(WasiErrno.INVAL)
    if kind not in (SOCK_ANY, SOCK_STREAM, SOCK_DGRAM):
        raise SockError(WasiErrno.INVAL)
    kind = SOCK_DGRAM if kind == SOCK_DGRAM else SOCK_STREAM
    host_type = socket.SOCK_DGRAM if kind == SOCK_DGRAM else socket.SOCK_STREAM
    sock = budget.new_socket(call.state, call.policy, lambda: socket.socket(host, host_type), "sock_open")
    sock.setblocking(False)
    fd = call.state.add(SocketEntry(sock, kind))
    call.view.put_u32(fd_ptr, fd, "fd")
    return 0


def _port(port: int) -> int:
    if port > 0xFFFF:
        raise SockError(WasiErrno.INVAL)
    return port


def _match_family(call: Call, entry: SocketEntry, address: IPAddress, what: str) -> None:
    """Re-create a fresh socket for the address's family (a guest may open af 0 or 1 and bind IPv6)."""
    family = host_family(address)
    if entry.sock.family == family:
        return
    try:
        sock = socket.socket(family, entry.sock.type)
    except OSError as exc:
        budget.out_of_descriptors(call.state, exc, what)
        raise
    budget.check_descriptor(call.state, call.policy, sock, what)
    sock.setblocking(False)
    for (level, name), value in entry.options.items():
        sock.setsockopt(level, name, value)
    entry.sock.close()
    entry.sock = sock


def sock_bind(call: Call, fd: int, addr_ptr: int, port: int) -> int:
    """``sock_bind(fd, *addr, port)``: only where the policy allows (loopback by default); a stream socket
    of an instance of ``wasinn run --instances N`` shares the address with its siblings (:mod:`.shared`)."""
    entry = call.state.entry(fd)
    address = read_address(call.view, addr_ptr, "address")
    call.policy.check_bind(address, _port(port))
    _match_family(call, entry, address, "sock_bind")
    target = sockaddr(address, port)
    shared = call.state.shared
    if shared is None or entry.kind != SOCK_STREAM or entry.release is not None:
        entry.sock.bind(target)
        return 0
    sibling, release = shared.bind(target, entry.sock, partial(entry.sock.bind, target))
    if sibling is not None:  # a sibling instance bound this address: listen and accept on its socket
        try:
            budget.check_descriptor(call.state, call.policy, sibling, "sock_bind")
        except SockError:
            release()
            raise
        entry.sock.close()
        entry.sock = sibling
    entry.release = release
    return 0


def sock_listen(call: Call, fd: int, backlog: int) -> int:
    """``sock_listen(fd, backlog)``."""
    entry = call.state.entry(fd)
    if entry.kind != SOCK_STREAM:
        raise SockError(WasiErrno.NOTSUP)
    entry.sock.listen(min(backlog, MAX_BACKLOG) if backlog < 0x8000_0000 else 0)
    return 0


def sock_accept_v1(call: Call, fd: int, fd_ptr: int) -> int:
    """``sock_accept(fd, *fd)`` (WasmEdge's V1): the new socket blocks."""
    return sock_accept_v2(call, fd, 0, fd_ptr)


def sock_accept_v2(call: Call, fd: int, flags: int, fd_ptr: int) -> int:
    """``sock_accept(fd, fdflags, *fd)`` (preview 1 and WasmEdge's V2); ``TCP_NODELAY`` is set on the
    new socket (HTTP servers write headers and body separately)."""
    call.view.address(fd_ptr, 4, "fd")
    if flags & ~FDFLAGS_NONBLOCK:
        raise SockError(WasiErrno.INVAL)
    entry = call.state.entry(fd)
    if entry.release is not None and entry.nonblocking and fd in call.state.accepted:
        raise SockError(WasiErrno.AGAIN)  # one connection per poll from a shared listener: see .shared
    listening = entry.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if listening and budget.is_full(call.state, call.policy):  # refused only when a connection waits (it stays queued)
        blocking(call.state, entry, partial(_pending, entry.sock), select.POLLIN, entry.recv_timeout)
        budget.check_room(call.state, call.policy, "sock_accept")
    try:
        conn, _ = blocking(call.state, entry, entry.sock.accept, select.POLLIN, entry.recv_timeout)
    except OSError as exc:
        budget.out_of_descriptors(call.state, exc, "sock_accept")
        raise
    budget.check_descriptor(call.state, call.policy, conn, "sock_accept")  # refused: that connection is closed
    conn.setblocking(False)
    if conn.type == socket.SOCK_STREAM:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    new_fd = call.state.add(SocketEntry(conn, SOCK_STREAM, bool(flags & FDFLAGS_NONBLOCK)))
    if entry.release is not None:
        call.state.accepted.add(fd)
    call.view.put_u32(fd_ptr, new_fd, "fd")
    return 0


def _pending(sock: socket.socket) -> None:
    """Return if a connection waits on the listener ``sock``, else raise ``BlockingIOError``."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    if not poller.poll(0):
        raise BlockingIOError


def sock_connect(call: Call, fd: int, addr_ptr: int, port: int) -> int:
    """``sock_connect(fd, *addr, port)``: only where the policy allows (nowhere by default)."""
    entry = call.state.entry(fd)
    address = read_address(call.view, addr_ptr, "address")
    call.policy.check_connect(address, _port(port))
    _match_family(call, entry, address, "sock_connect")
    code = entry.sock.connect_ex(sockaddr(address, port))
    if code == 0:
        return 0
    if code != os_errno.EINPROGRESS:
        raise SockError(errno_from_os(code))
    if entry.nonblocking:
        raise SockError(WasiErrno.INPROGRESS)
    if not call.state.wait([(entry.sock.fileno(), select.POLLOUT)], entry.send_timeout):
        raise SockError(WasiErrno.INPROGRESS)  # SO_SNDTIMEO passed: still connecting, as Linux says
    code = entry.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise SockError(errno_from_os(code))
    return 0


def sock_recv(call: Call, fd: int, iovs: int, iovs_len: int, ri_flags: int, len_ptr: int, flags_ptr: int) -> int:
    """``sock_recv(fd, *iovs, n, riflags, *nread, *roflags)``."""
    view = call.view
    view.address(len_ptr, 4, "nread")
    view.address(flags_ptr, 2, "roflags")
    entry = call.state.entry(fd)
    buffers = view.iovecs(iovs, iovs_len, "receive")
    nbytes, ro_flags = receive(call.state, entry, buffers, recv_flags(ri_flags))
    view.put_u32(len_ptr, nbytes, "nread")
    view.put_u16(flags_ptr, ro_flags, "roflags")
    return 0


def sock_send(call: Call, fd: int, iovs: int, iovs_len: int, _si_flags: int, len_ptr: int) -> int:
    """``sock_send(fd, *iovs, n, siflags, *nwritten)``."""
    view = call.view
    view.address(len_ptr, 4, "nwritten")
    entry = call.state.entry(fd)
    sent = send(call.state, entry, view.iovecs(iovs, iovs_len, "send"))
    view.put_u32(len_ptr, sent, "nwritten")
    return 0


def sock_recv_from_v1(
    call: Call, fd: int, iovs: int, iovs_len: int, addr_ptr: int, ri_flags: int, len_ptr: int, flags_ptr: int
) -> int:
    """``sock_recv_from(fd, *iovs, n, *addr, riflags, *nread, *roflags)`` (V1)."""
    return _recv_from(call, fd, iovs, iovs_len, addr_ptr, ri_flags, None, len_ptr, flags_ptr)


def sock_recv_from_v2(
    call: Call,
    fd: int,
    iovs: int,
    iovs_len: int,
    addr_ptr: int,
    ri_flags: int,
    port_ptr: int,
    len_ptr: int,
    flags_ptr: int,
) -> int:
    """``sock_recv_from(fd, *iovs, n, *addr, riflags, *port, *nread, *roflags)`` (V2, port as u16)."""
    return _recv_from(call, fd, iovs, iovs_len, addr_ptr, ri_flags, port_ptr, len_ptr, flags_ptr)


def _recv_from(
    call: Call,
    fd: int,
    iovs: int,
    iovs_len: int,
    addr_ptr: int,
    ri_flags: int,
    port_ptr: int | None,
    len_ptr: int,
    flags_ptr: int,
) -> int:
    view = call.view
    view.address(len_ptr, 4, "nread")
    view.address(flags_ptr, 2, "roflags")
    view.address(addr_ptr, 8, "address")
    if port_ptr is not None:
        view.address(port_ptr, 2, "port")
    entry = call.state.entry(fd)
    nbytes, ro_flags, sender = receive_from(
        call.state, entry, view.iovecs(iovs, iovs_len, "receive"), recv_flags(ri_flags)
    )
    if sender is not None:
        write_storage(view, addr_ptr, sender)
        if port_ptr is not None:
            view.put_u16(port_ptr, from_sockaddr(sender)[1], "port")
    view.put_u32(len_ptr, nbytes, "nread")
    view.put_u16(flags_ptr, ro_flags, "roflags")
    return 0


def sock_send_to(
    call: Call, fd: int, iovs: int, iovs_len: int, addr_ptr: int, port: int, _si_flags: int, len_ptr: int
) -> int:
    """``sock_send_to(fd, *iovs, n, *addr, port, siflags, *nwritten)``: an outbound datagram (policy)."""
    view = call.view
    view.address(len_ptr, 4, "nwritten")
    entry = call.state.entry(fd)
    address = read_address(view, addr_ptr, "address")
    call.policy.check_connect(address, _port(port), "datagram")
    _match_family(call, entry, address, "sock_send_to")
    sent = send(call.state, entry, view.iovecs(iovs, iovs_len, "send"), sockaddr(address, port))
    view.put_u32(len_ptr, sent, "nwritten")
    return 0


def sock_shutdown(call: Call, fd: int, how: int) -> int:
    """``sock_shutdown(fd, sdflags)``: RD 1, WR 2, both 3."""
    entry = call.state.entry(fd)
    modes = {SDFLAGS_RD: socket.SHUT_RD, SDFLAGS_WR: socket.SHUT_WR, SDFLAGS_RD | SDFLAGS_WR: socket.SHUT_RDWR}
    if how not in modes:
        raise SockError(WasiErrno.INVAL)
    entry.sock.shutdown(modes[how])
    return 0


def sock_getlocaladdr_v1(call: Call, fd: int, addr_ptr: int, type_ptr: int, port_ptr: int) -> int:
    """``sock_getlocaladdr(fd, *addr, *addr_type, *port)`` (V1: type written as 4 or 6)."""
    write_address_v1(call.view, addr_ptr, type_ptr, port_ptr, call.state.entry(fd).sock.getsockname())
    return 0


def sock_getpeeraddr_v1(call: Call, fd: int, addr_ptr: int, type_ptr: int, port_ptr: int) -> int:
    """``sock_getpeeraddr(fd, *addr, *addr_type, *port)`` (V1)."""
    write_address_v1(call.view, addr_ptr, type_ptr, port_ptr, call.state.entry(fd).sock.getpeername())
    return 0


def sock_getlocaladdr_v2(call: Call, fd: int, addr_ptr: int, port_ptr: int) -> int:
    """``sock_getlocaladdr(fd, *addr, *port)`` (V2: a 128-byte storage)."""
    write_address_v2(call.view, addr_ptr, port_ptr, call.state.entry(fd).sock.getsockname())
    return 0


def sock_getpeeraddr_v2(call: Call, fd: int, addr_ptr: int, port_ptr: int) -> int:
    """``sock_getpeeraddr(fd, *addr, *port)`` (V2)."""
    write_address_v2(call.view, addr_ptr, port_ptr, call.state.entry(fd).sock.getpeername())
    return 0
