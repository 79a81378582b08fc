"""The ``wasinn run`` options of the socket layer: where guests may bind and connect, how many sockets they hold."""

from __future__ import annotations

import argparse

from ..sockets.policy import (
    BIND_OPTION,
    CONNECT_OPTION,
    DEFAULT_MAX_SOCKETS_PER_STORE,
    DEFAULT_MAX_SOCKETS_TOTAL,
    DEFAULT_RESERVE_FDS,
    PER_STORE_OPTION,
    TOTAL_OPTION,
    SocketPolicy,
)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of sockets (0 or more), got {text!r}")
    return value


def add_socket_options(parser: argparse.ArgumentParser) -> None:
    """Add the socket policy options to ``wasinn run``."""
    group = parser.add_argument_group(
        "sockets (WasmEdge's socket extension, for guests such as LlamaEdge's llama-api-server)"
    )
    group.add_argument(
        BIND_OPTION,
        action="append",
        default=[],
        metavar="ADDR[:PORT]|all",
        help="let the guest listen on ADDR (e.g. 0.0.0.0, [::]:8080), or anywhere with 'all' "
        "(repeatable; loopback is always allowed, nothing else by default)",
    )
    group.add_argument(
        CONNECT_OPTION,
        action="append",
        default=[],
        metavar="HOST[:PORT]|all",
        help="let the guest open outbound connections (and send datagrams) to HOST, or anywhere with "
        "'all' (repeatable; none by default)",
    )
    group.add_argument(
        PER_STORE_OPTION,
        type=_count,
        default=DEFAULT_MAX_SOCKETS_PER_STORE,
        metavar="N",
        help="sockets one guest may hold, accepted connections included; beyond it sock_open and "
        f"sock_accept get errno 33 MFILE (default: {DEFAULT_MAX_SOCKETS_PER_STORE})",
    )
    group.add_argument(
        TOTAL_OPTION,
        type=_count,
        default=DEFAULT_MAX_SOCKETS_TOTAL,
        metavar="N",
        help="sockets all guests of the process may hold; beyond it errno 41 NFILE (default: "
        f"{DEFAULT_MAX_SOCKETS_TOTAL}). Guests' sockets never take the last {DEFAULT_RESERVE_FDS} "
        "descriptors below RLIMIT_NOFILE either (errno 33): those stay the host's",
    )


def socket_policy_from(ns: argparse.Namespace) -> SocketPolicy:
    """The policy the options ask for (ValueError naming the bad value)."""
    bind = getattr(ns, "sock_allow_bind", [])
    connect = getattr(ns, "sock_allow_connect", [])
    caps = {
        "max_sockets_per_store": getattr(ns, "max_sockets_per_store", DEFAULT_MAX_SOCKETS_PER_STORE),
        "max_sockets_total": getattr(ns, "max_sockets_total", DEFAULT_MAX_SOCKETS_TOTAL),
    }
    try:
        return SocketPolicy.from_specs(bind, connect, **caps)
    except ValueError as exc:
        raise ValueError(f"{BIND_OPTION}/{CONNECT_OPTION}: {exc}") from None
