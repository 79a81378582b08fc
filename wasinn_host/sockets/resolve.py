"""``sock_getaddrinfo``: name resolution into the guest's own, pre-linked result records.

``sock_getaddrinfo(*node, node_len, *service, service_len, *hints, *res, max_res_len, *res_len)``:
``*res`` holds the address of the guest's first ``__wasi_addrinfo_t`` (28 bytes: flags u16,
family u8, socktype u8, protocol u8, addrlen u32 @8, addr u32 @12, canonname u32 @16,
canonname_len u32 @20, next u32 @24); each ``addr`` points at a ``__wasi_sockaddr_t`` (family u8,
data_len u32 @4, data u32 @8) whose data buffer receives the host ``sockaddr`` after its family
field (port in network order, then the address), as WasmEdge copies it.  Up to ``max_res_len``
records are filled and their count written to ``*res_len``.

Resolving a host name is network access: unless the policy allows outbound connections, only
numeric addresses and ``localhost`` resolve (others get ``AINONAME`` and one log line).  A node
that is no host name at all (not UTF-8, a label longer than 63 characters, 253 characters in all)
gets ``AINONAME`` and one log line saying why, as the host's resolver finds no such host.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from .call import Call
from .constants import ADDRINFO_SIZE, AF_INET4, AF_INET6, AF_UNSPEC, SOCK_DGRAM, SOCK_STREAM, WasiErrno
from .policy import CONNECT_OPTION
from .table import SockError

_AI_FLAGS = {
    1: socket.AI_PASSIVE,
    2: socket.AI_CANONNAME,
    4: socket.AI_NUMERICHOST,
    8: socket.AI_NUMERICSERV,
    16: socket.AI_V4MAPPED,
    32: socket.AI_ALL,
    64: socket.AI_ADDRCONFIG,
}
_FAMILIES = {AF_UNSPEC: socket.AF_UNSPEC, AF_INET4: socket.AF_INET, AF_INET6: socket.AF_INET6}
_TYPES = {0: 0, SOCK_DGRAM: socket.SOCK_DGRAM, SOCK_STREAM: socket.SOCK_STREAM}
_PROTOCOLS = {0: 0, 1: socket.IPPROTO_TCP, 2: socket.IPPROTO_UDP}
_GAI_ERRORS = {
    socket.EAI_AGAIN: WasiErrno.AIAGAIN,
    socket.EAI_BADFLAGS: WasiErrno.AIBADFLAG,
    socket.EAI_FAIL: WasiErrno.AIFAIL,
    socket.EAI_FAMILY: WasiErrno.AIFAMILY,
    socket.EAI_MEMORY: WasiErrno.AIMEMORY,
    socket.EAI_NONAME: WasiErrno.AINONAME,
}


def sock_getaddrinfo(
    call: Call,
    node_ptr: int,
    node_len: int,
    service_ptr: int,
    service_len: int,
    hints_ptr: int,
    res_ptr: int,
    max_res: int,
    res_len_ptr: int,
) -> int:
    """Resolve ``node``/``service`` with ``hints`` into the guest's records."""
    view = call.view
    raw_node = view.read(node_ptr, node_len, "node")
    service = view.read(service_ptr, service_len, "service").decode("utf-8", "replace")
    flags, family, kind, protocol = struct.unpack_from("<HBBB", view.read(hints_ptr, ADDRINFO_SIZE, "hints"))
    first = view.u32(res_ptr, "result pointer")
    view.address(res_len_ptr, 4, "result count")
    if not raw_node and not service:
        raise SockError(WasiErrno.AINONAME)
    if max_res < 1:
        raise SockError(WasiErrno.AIMEMORY)
    if flags & ~sum(_AI_FLAGS) or (flags & 2 and not raw_node):
        raise SockError(WasiErrno.AIBADFLAG)
    if family not in _FAMILIES:
        raise SockError(WasiErrno.AIFAMILY)
    if protocol not in _PROTOCOLS or kind not in _TYPES:
        raise SockError(WasiErrno.NOSYS)
    node = _node_name(raw_node)
    host_flags: int = sum(int(host) for bit, host in _AI_FLAGS.items() if flags & bit)
    if node and node != b"localhost" and not call.policy.resolve_names:
        host_flags |= socket.AI_NUMERICHOST
    try:
        results = socket.getaddrinfo(
            node or None, service or None, _FAMILIES[family], _TYPES[kind], _PROTOCOLS[protocol], host_flags
        )
    except socket.gaierror as exc:
        if host_flags & socket.AI_NUMERICHOST and not flags & 4 and exc.errno == socket.EAI_NONAME:
            raise SockError(
                WasiErrno.AINONAME,
                f"sock_getaddrinfo: not resolving {node.decode()!r}: guests may resolve host names only with "
                f"{CONNECT_OPTION}",
            ) from None
        raise SockError(_GAI_ERRORS.get(exc.errno or 0, WasiErrno.AIFAIL)) from None
    count = 0
    record = first
    for host_family, host_type, host_proto, canonname, address in results[:max_res]:
        _write_record(call, record, host_family, host_type, host_proto, canonname, address)
        count += 1
        record = view.u32(record + 24, "ai_next")
        if count < min(len(results), max_res) and record == 0:
            break
    view.put_u32(res_len_ptr, count, "result count")
    return 0


MAX_LABEL = 63
MAX_NAME = 253
NAMES_ACCEPTED = (
    f"a numeric IPv4 or IPv6 address, localhost, or a host name of dot-separated labels of 1 to {MAX_LABEL} "
    f"characters, {MAX_NAME} in all (UTF-8; non-ASCII labels in IDNA)"
)


def _node_name(raw: bytes) -> bytes:
    """The guest's node name as the resolver takes it, or AINONAME and one line saying why it is not one.

    Python's ``getaddrinfo`` IDNA-encodes a text name itself and raises ``UnicodeError`` for one that
    cannot be (a 64-character label, bytes that are not UTF-8); such a name is checked here instead.
    WasmEdge hands the guest's bytes to the host's ``getaddrinfo``, which finds no such host:
    ``EAI_NONAME``, hence AINONAME (and not INVAL, which WasmEdge never gives for a name)."""
    if not raw:
        return raw
    shown = raw[:80].decode("utf-8", "backslashreplace") + ("..." if len(raw) > 80 else "")
    try:
        text = raw.decode("utf-8")
        if "\0" in text:
            raise ValueError("it holds a NUL byte")
        name = text.encode("idna")
        if len(name.rstrip(b".")) > MAX_NAME:
            raise ValueError(f"it is {len(name.rstrip(b'.'))} characters long")
    except (UnicodeError, ValueError) as exc:
        raise SockError(
            WasiErrno.AINONAME,
            f"sock_getaddrinfo: node {shown!r} is not a host name ({_why(raw, exc)}); accepted: {NAMES_ACCEPTED}",
        ) from None
    return name


def _why(raw: bytes, exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"byte 0x{raw[exc.start]:02x} at {exc.start} is not UTF-8"
    if not isinstance(exc, UnicodeError):
        return str(exc)
    labels = raw.decode("utf-8").rstrip(".").split(".")
    longest = max(len(label) for label in labels)
    if longest > MAX_LABEL:
        return f"a label of {longest} characters"
    if not all(labels):
        return "an empty label"
    return "a character IDNA does not allow"


def _write_record(
    call: Call, record: int, family: int, kind: int, proto: int, canonname: str, address: tuple[Any, ...]
) -> None:
    view = call.view
    raw = view.read(record, ADDRINFO_SIZE, "addrinfo")
    addr_ptr, canon_ptr, canon_len = struct.unpack_from("<III", raw, 12)
    is_v6 = family == socket.AF_INET6
    port = struct.pack(">H", address[1])
    packed = socket.inet_pton(family, address[0].split("%", 1)[0])
    data = port + (
        struct.pack(">I", address[2]) + packed + struct.pack("<I", address[3]) if is_v6 else packed + bytes(8)
    )
    sa_family = AF_INET6 if is_v6 else AF_INET4
    wasi_kind = SOCK_DGRAM if kind == socket.SOCK_DGRAM else SOCK_STREAM if kind == socket.SOCK_STREAM else 0
    wasi_proto = 1 if proto == socket.IPPROTO_TCP else 2 if proto == socket.IPPROTO_UDP else 0
    data_len, data_ptr = struct.unpack("<II", view.read(addr_ptr + 4, 8, "sockaddr"))
    view.write(record, struct.pack("<HBBBxxxI", 0, sa_family, wasi_kind, wasi_proto, 2 + len(data)), "addrinfo")
    view.write(addr_ptr, bytes([sa_family]), "sockaddr")
    view.write(data_ptr, data[:data_len], "sockaddr data")
    if canonname and canon_len:
        name = canonname.encode()[: canon_len - 1] + b"\0"
        view.write(canon_ptr, name, "canonical name")
