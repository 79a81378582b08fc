"""Which addresses a guest may listen on and connect to, and how many sockets guests may hold.

By default a guest may bind only loopback addresses (127.0.0.0/8 and ::1, any port) and may
not open outbound connections.  ``--sock-allow-bind`` and ``--sock-allow-connect`` widen that,
each with ``all`` or ``ADDR`` / ``ADDR:PORT`` (``[v6]:PORT`` for IPv6; port 0 or none means any
port; a host name is resolved once, when the option is read).  A refusal is an
:class:`Refused` carrying the one log line that names the rule (or the lack of one) that refused
it and the option to use.  The socket caps (per guest, per process, the descriptors kept for the
host) are enforced by :mod:`.budget`.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Iterable, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

BIND_OPTION = "--sock-allow-bind"
CONNECT_OPTION = "--sock-allow-connect"
PER_STORE_OPTION = "--max-sockets-per-store"
TOTAL_OPTION = "--max-sockets-total"
DEFAULT_MAX_SOCKETS_PER_STORE = 1024
"""Sockets one guest (Store) may hold at once, accepted connections included."""
DEFAULT_MAX_SOCKETS_TOTAL = 8192
"""Sockets all guests of the process may hold at once."""
DEFAULT_RESERVE_FDS = 128
"""Descriptors below ``RLIMIT_NOFILE`` that guests' sockets never take: they stay the host's own."""


class Refused(Exception):
    """A bind or connect the policy does not allow; the message is the log line."""


@dataclass(frozen=True)
class Rule:
    """One allowed address (``None``: any address) and port (0: any port); ``spec`` is the option value
    it came from (a host name gives one rule per address), to name it in a refusal."""

    address: IPAddress | None
    port: int = 0
    spec: str = field(default="", compare=False)

    def matches(self, address: IPAddress, port: int) -> bool:
        """Whether ``address:port`` is allowed by this rule."""
        if self.port and self.port != port:
            return False
        return self.address is None or _unmapped(self.address) == _unmapped(address)


def parse_rules(spec: str) -> list[Rule]:
    """``all``, ``ADDR``, ``ADDR:PORT``, ``[V6]:PORT`` or ``HOST[:PORT]`` as rules (ValueError if malformed)."""
    text = spec.strip()
    if text.lower() == "all":
        return [Rule(None, 0, text)]
    host, port = _split_port(text, spec)
    try:
        return [Rule(ipaddress.ip_address(host), port, text)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"{spec!r}: not an address, and the host name does not resolve ({exc})") from None
    return [Rule(ipaddress.ip_address(info[4][0]), port, text) for info in infos]


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
    ``max_sockets_per_store``: sockets one guest may hold (accepted ones included; beyond it errno
    33 ``MFILE``); ``max_sockets_total``: sockets all guests of the process may hold (errno 41
    ``NFILE``); ``reserve_fds``: the last descriptors below ``RLIMIT_NOFILE`` that a guest's socket
    never takes (errno 33), so the host can always open its own files.  Build it from option
    strings with :meth:`from_specs`.
    """

    bind: tuple[Rule, ...] = ()
    connect: tuple[Rule, ...] = ()
    resolve_names: bool = field(default=False)
    """Whether ``sock_getaddrinfo`` may resolve host names (on when any connect rule is given)."""
    max_sockets_per_store: int = DEFAULT_MAX_SOCKETS_PER_STORE
    max_sockets_total: int = DEFAULT_MAX_SOCKETS_TOTAL
    reserve_fds: int = DEFAULT_RESERVE_FDS

    def __post_init__(self) -> None:
        for name in ("max_sockets_per_store", "max_sockets_total", "reserve_fds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")

    @classmethod
    def from_specs(
        cls,
        bind: Iterable[str] = (),
        connect: Iterable[str] = (),
        *,
        max_sockets_per_store: int = DEFAULT_MAX_SOCKETS_PER_STORE,
        max_sockets_total: int = DEFAULT_MAX_SOCKETS_TOTAL,
        reserve_fds: int = DEFAULT_RESERVE_FDS,
    ) -> "SocketPolicy":
        """A policy from ``--sock-allow-bind`` and ``--sock-allow-connect`` values and the socket caps
        (ValueError if one is bad)."""
        bind_rules = tuple(rule for spec in bind for rule in parse_rules(spec))
        connect_rules = tuple(rule for spec in connect for rule in parse_rules(spec))
        return cls(
            bind_rules,
            connect_rules,
            bool(connect_rules),
            max_sockets_per_store=max_sockets_per_store,
            max_sockets_total=max_sockets_total,
            reserve_fds=reserve_fds,
        )

    def check_bind(self, address: IPAddress, port: int) -> None:
        """Raise :class:`Refused` unless a guest may listen on ``address:port``."""
        if _unmapped(address).is_loopback or any(rule.matches(address, port) for rule in self.bind):
            return
        why = _why_refused(self.bind, address, port, BIND_OPTION, "guests may listen on loopback only")
        raise Refused(
            f"refused the guest's bind to {_show(address, port)}: {why}; "
            f"allow it with {BIND_OPTION} {_show_option(address)} (or {BIND_OPTION} all)"
        )

    def check_connect(self, address: IPAddress, port: int, what: str = "connection") -> None:
        """Raise :class:`Refused` unless a guest may open a ``what`` to ``address:port``."""
        if any(rule.matches(address, port) for rule in self.connect):
            return
        why = _why_refused(self.connect, address, port, CONNECT_OPTION, "outbound connections are off")
        raise Refused(
            f"refused the guest's outbound {what} to {_show(address, port)}: {why}; "
            f"allow it with {CONNECT_OPTION} {_show(address, port)} (or {CONNECT_OPTION} all)"
        )


def _why_refused(rules: tuple[Rule, ...], address: IPAddress, port: int, option: str, no_rules: str) -> str:
    """What refused ``address:port``: no rules at all, rules for this address on other ports (named),
    or rules for other addresses only (named)."""
    if not rules:
        return no_rules
    near = [rule for rule in rules if rule.address is not None and _same(rule.address, address)]
    if near:  # a rule for this address on other ports (one on any port would have matched)
        specs = _specs(near)
        ports = list(dict.fromkeys(str(rule.port) for rule in near))
        named = ", ".join(f"{option} {spec}" for spec in specs)
        verb = "allows" if len(specs) == 1 else "allow"
        return f"{named} {verb} port{'s' if len(ports) > 1 else ''} {', '.join(ports)} only"
    return f"no {option} rule names {_show_option(address)} (given: {', '.join(_specs(rules))})"


def _same(a: IPAddress, b: IPAddress) -> bool:
    return _unmapped(a) == _unmapped(b)


def _specs(rules: Iterable[Rule]) -> list[str]:
    """The option values of ``rules``, once each, in order."""
    return list(dict.fromkeys(rule.spec for rule in rules))


def _show(address: IPAddress, port: int) -> str:
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _show_option(address: IPAddress) -> str:
    return f"[{address}]" if address.version == 6 else str(address)
