"""Which addresses a guest may listen on and connect to.

By default a guest may bind only loopback addresses (127.0.0.0/8 and ::1, any port) and may
not open outbound connections.  ``--sock-allow-bind`` and ``--sock-allow-connect`` widen that,
each with ``all`` or ``ADDR`` / ``ADDR:PORT`` (``[v6]:PORT`` for IPv6; port 0 or none means any
port; a host name is resolved once, when the option is read).  A refusal is an
:class:`Refused` carrying the one log line that names the option to use.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Iterable, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

BIND_OPTION = "--sock-allow-bind"
CONNECT_OPTION = "--sock-allow-connect"


class Refused(Exception):
    """A bind or connect the policy does not allow; the message is the log line."""


@dataclass(frozen=True)
class Rule:
    """One allowed address (``None``: any address) and port (0: any port)."""

    address: IPAddress | None
    port: int = 0

    def matches(self, address: IPAddress, port: int) -> bool:
        """Whether ``address:port`` is allowed by this rule."""
        if self.port and self.port != port:
            return False
        return self.address is None or _unmapped(self.address) == _unmapped(address)


def parse_rules(spec: str) -> list[Rule]:
    """``all``, ``ADDR``, ``ADDR:PORT``, ``[V6]:PORT`` or ``HOST[:PORT]`` as rules (ValueError if malformed)."""
    text = spec.strip()
    if text.lower() == "all":
        return [Rule(None)]
    host, port = _split_port(text, spec)
    try:
        return [Rule(ipaddress.ip_address(host), port)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"{spec!r}: not an address, and the host name does not resolve ({exc})") from None
    return [Rule(ipaddress.ip_address(info[4][0]), port) for info in infos]


def _split_port(text: str, spec: str) -> tuple[str, int]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"{spec!r}: expected [IPV6]:PORT")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""  # an IPv6 address without brackets, or no port
    if not host:
        raise ValueError(f"{spec!r}: no address (use 'all' for any address)")
    if not port_text:
        return host, 0
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{spec!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def _unmapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class SocketPolicy:
    """What guests of one :class:`~wasinn_host.WasiNN` may do with WasmEdge's sockets.

    ``bind``: rules for addresses beyond loopback a guest may listen on (loopback is always
    allowed); ``connect``: rules for outbound connections and datagrams (none by default).
    Build it from option strings with :meth:`from_specs`.
    """

    bind: tuple[Rule, ...] = ()
    connect: tuple[Rule, ...] = ()
    resolve_names: bool = field(default=False)
    """Whether ``sock_getaddrinfo`` may resolve host names (on when any connect rule is given)."""

    @classmethod
    def from_specs(cls, bind: Iterable[str] = (), connect: Iterable[str] = ()) -> "SocketPolicy":
        """A policy from ``--sock-allow-bind`` and ``--sock-allow-connect`` values (ValueError if one is bad)."""
        bind_rules = tuple(rule for spec in bind for rule in parse_rules(spec))
        connect_rules = tuple(rule for spec in connect for rule in parse_rules(spec))
        return cls(bind_rules, connect_rules, bool(connect_rules))

    def check_bind(self, address: IPAddress, port: int) -> None:
        """Raise :class:`Refused` unless a guest may listen on ``address:port``."""
        if _unmapped(address).is_loopback or any(rule.matches(address, port) for rule in self.bind):
            return
        shown = _show(address, port)
        raise Refused(
            f"refused the guest's bind to {shown}: guests may listen on loopback only; "
            f"allow it with {BIND_OPTION} {_show_option(address)} (or {BIND_OPTION} all)"
        )

    def check_connect(self, address: IPAddress, port: int, what: str = "connection") -> None:
        """Raise :class:`Refused` unless a guest may open a ``what`` to ``address:port``."""
        if any(rule.matches(address, port) for rule in self.connect):
            return
        raise Refused(
            f"refused the guest's outbound {what} to {_show(address, port)}: outbound connections are off; "
            f"allow it with {CONNECT_OPTION} {_show(address, port)} (or {CONNECT_OPTION} all)"
        )


def _show(address: IPAddress, port: int) -> str:
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _show_option(address: IPAddress) -> str:
    return f"[{address}]" if address.version == 6 else str(address)
