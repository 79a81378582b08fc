"""Socket addresses in guest memory, both of WasmEdge's forms.

A guest passes ``__wasi_address_t`` (``{u32 buf, u32 buf_len}``) pointing at the address bytes:
V1 gives 4 (IPv4) or 16 (IPv6) raw bytes; V2 gives a 128-byte storage whose first ``u16`` is
WasmEdge's address family (1 IPv4, 2 IPv6) and whose address bytes follow.  Ports travel as
separate ``u32`` values in host order.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Any

from .constants import ADDR_STORAGE_SIZE, AF_INET4, AF_INET6, WasiErrno
from .guest_view import GuestView
from .policy import IPAddress
from .table import SockError


def read_address(view: GuestView, ptr: int, what: str) -> IPAddress:
    """The IP address a guest's ``__wasi_address_t`` at ``ptr`` names (INVAL for another length)."""
    buf, length = struct.unpack("<II", view.read(ptr, 8, what))
    data = view.read(buf, length, f"{what} bytes")
    if length == 4:
        return ipaddress.IPv4Address(data)
    if length == 16:
        return ipaddress.IPv6Address(data)
    if length == ADDR_STORAGE_SIZE:
        family = struct.unpack_from("<H", data)[0]
        if family == AF_INET4:
            return ipaddress.IPv4Address(data[2:6])
        if family == AF_INET6:
            return ipaddress.IPv6Address(data[2:18])
        raise SockError(WasiErrno.INVAL)
    raise SockError(WasiErrno.INVAL)


def host_family(address: IPAddress) -> socket.AddressFamily:
    """The host's address family for ``address``."""
    return socket.AF_INET if address.version == 4 else socket.AF_INET6


def sockaddr(address: IPAddress, port: int) -> tuple[Any, ...]:
    """The Python socket address for ``address:port``."""
    return (str(address), port) if address.version == 4 else (str(address), port, 0, 0)


def from_sockaddr(name: Any) -> tuple[IPAddress, int]:
    """The address and port of a Python socket address (getsockname, getpeername, recvfrom)."""
    host = str(name[0]).split("%", 1)[0]
    return ipaddress.ip_address(host), int(name[1])


def write_address_v1(view: GuestView, ptr: int, type_ptr: int, port_ptr: int, name: Any) -> None:
    """V1 ``sock_getlocaladdr``/``sock_getpeeraddr``: the bytes into the guest's 4- or 16-byte
    buffer, the type as 4 or 6 (WasmEdge's numbering) and the port as a ``u32``."""
    address, port = from_sockaddr(name)
    buf, length = struct.unpack("<II", view.read(ptr, 8, "address"))
    if length not in (4, 16):
        raise SockError(WasiErrno.INVAL)
    view.address(type_ptr, 4, "address type")
    view.address(port_ptr, 4, "port")
    if len(address.packed) > length:
        raise SockError(WasiErrno.INVAL)
    view.write(buf, address.packed, "address bytes")
    view.put_u32(type_ptr, address.version, "address type")
    view.put_u32(port_ptr, port, "port")


def write_address_v2(view: GuestView, ptr: int, port_ptr: int, name: Any) -> None:
    """V2: the family and bytes into the guest's 128-byte storage, the port as a ``u32``."""
    address, port = from_sockaddr(name)
    buf, length = struct.unpack("<II", view.read(ptr, 8, "address"))
    if length != ADDR_STORAGE_SIZE:
        raise SockError(WasiErrno.INVAL)
    view.address(port_ptr, 4, "port")
    family = AF_INET4 if address.version == 4 else AF_INET6
    view.write(buf, struct.pack("<H", family) + address.packed, "address storage")
    view.put_u32(port_ptr, port, "port")


def write_storage(view: GuestView, ptr: int, name: Any) -> None:
    """``sock_recv_from``: the sender into the guest's ``__wasi_address_t`` (4/16 raw bytes, or a
    128-byte storage with the family first)."""
    address, _ = from_sockaddr(name)
    buf, length = struct.unpack("<II", view.read(ptr, 8, "address"))
    if length == ADDR_STORAGE_SIZE:
        family = AF_INET4 if address.version == 4 else AF_INET6
        view.write(buf, struct.pack("<H", family) + address.packed, "address storage")
    elif length >= len(address.packed):
        view.write(buf, address.packed, "address bytes")
    else:
        raise SockError(WasiErrno.INVAL)
