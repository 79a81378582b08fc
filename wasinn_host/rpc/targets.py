"""``--nn-rpc-uri`` values: where a server listens, and the backends a client connects to.

A server listens on ``unix:PATH``, ``unix:///abs/path`` (WasmEdge's ``unix://$PWD/...`` form)
or ``HOST:PORT``.  A client accepts any of those plus ``ipv4:a:p,b:p``, ``ipv6:...`` and
``dns:///name:port``, and turns each into one gRPC target per backend (a DNS name into one
per address, as a Kubernetes headless Service returns them), because contexts are pinned
to the server that holds them and gRPC's own balancing would spread their calls.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Iterable


class TargetError(ValueError):
    """A URI that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class ListenAddress:
    """Where ``wasinn serve`` listens."""

    target: str
    """The address as grpcio's ``add_*_port`` takes it."""
    unix_path: str | None = None
    host: str | None = None

    @property
    def loopback(self) -> bool:
        """A unix socket or a loopback TCP address: reachable from this machine only."""
        return self.unix_path is not None or _is_loopback(self.host or "")


def _unix_path(uri: str) -> str | None:
    if uri.startswith("unix://"):
        path = uri[len("unix://") :]
        if not path.startswith("/"):
            raise TargetError(
                f"{uri}: unix:// needs an absolute path (unix:///abs/path); use unix:PATH for a relative one"
            )
        return path
    if uri.startswith("unix:"):
        path = uri[len("unix:") :]
        if not path:
            raise TargetError(f"{uri}: no socket path after unix:")
        return os.path.abspath(path)
    return None


def _split_host_port(uri: str, spec: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise TargetError(f"{uri}: expected HOST:PORT, unix:PATH or unix:///abs/path")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(uri: str) -> ListenAddress:
    """The address ``wasinn serve --nn-rpc-uri URI`` listens on."""
    if uri.startswith("tcp://"):
        raise TargetError(f"{uri}: tcp:// is not a gRPC address; write HOST:PORT")
    path = _unix_path(uri)
    if path is not None:
        return ListenAddress("unix:" + path, unix_path=path)
    if uri.startswith(("dns:", "ipv4:", "ipv6:")):
        raise TargetError(f"{uri}: a server listens on HOST:PORT or unix:PATH")
    host, port = _split_host_port(uri, uri)
    return ListenAddress(uri, host=host or "0.0.0.0")


def _addresses(uri: str, host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TargetError(f"{uri}: cannot resolve {host}: {exc.strerror or exc}") from None
    targets: list[str] = []
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        target = f"ipv6:[{ip}]:{port}" if family == socket.AF_INET6 else f"ipv4:{ip}:{port}"
        if target not in targets:
            targets.append(target)
    return targets


def backend_targets(uri: str) -> list[str]:
    """The gRPC targets, one per backend, that a client ``--nn-rpc-uri URI`` stands for."""
    if uri.startswith("tcp://"):
        raise TargetError(f"{uri}: tcp:// is not a gRPC target; write HOST:PORT")
    path = _unix_path(uri)
    if path is not None:
        return ["unix:" + path]
    for scheme in ("ipv4:", "ipv6:"):
        if uri.startswith(scheme):
            parts = [p for p in uri[len(scheme) :].split(",") if p]
            if not parts:
                raise TargetError(f"{uri}: no addresses after {scheme}")
            for part in parts:
                _split_host_port(uri, part)
            return [scheme + part for part in parts]
    if uri.startswith("dns:"):
        name = uri[len("dns:") :].lstrip("/")
        if "/" in name:  # dns://authority/name:port
            name = name.split("/", 1)[1]
        host, port = _split_host_port(uri, name)
        return _addresses(uri, host, port)
    _split_host_port(uri, uri)
    return [uri]


def all_backend_targets(uris: Iterable[str]) -> list[str]:
    """Every backend of several ``--nn-rpc-uri`` values, without repeats."""
    targets: list[str] = []
    for uri in uris:
        targets.extend(t for t in backend_targets(uri) if t not in targets)
    return targets
