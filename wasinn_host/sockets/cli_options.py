"""The ``wasinn run`` options of the socket layer: ``--sock-allow-bind`` and ``--sock-allow-connect``."""

from __future__ import annotations

import argparse

from .policy import BIND_OPTION, CONNECT_OPTION, SocketPolicy


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


def socket_policy_from(ns: argparse.Namespace) -> SocketPolicy:
    """The policy the options ask for (ValueError naming the bad value)."""
    bind = getattr(ns, "sock_allow_bind", [])
    connect = getattr(ns, "sock_allow_connect", [])
    try:
        return SocketPolicy.from_specs(bind, connect)
    except ValueError as exc:
        raise ValueError(f"{BIND_OPTION}/{CONNECT_OPTION}: {exc}") from None
