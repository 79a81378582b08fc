"""``wasinn serve``'s gRPC server: binding, security, message sizes, health and draining.

Rules: a unix socket is created mode 0600; a TCP address that is not loopback needs a token
(``--nn-rpc-token``, checked on every call) or TLS (``--tls-cert``/``--tls-key``), else the
server refuses to start.  Message sizes follow the host limits (prompt, output, model bytes)
instead of gRPC's 4 MiB default.  The standard health service answers ``SERVING`` while the
server runs (without a token, so probes work) and ``NOT_SERVING`` while it drains.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..backend.local import LocalBackend
from ..core.config.limits import INLINE_IMAGE_ROOM
from .messages import KEEPALIVE, MAX_MESSAGE, TOKEN_KEY, host_grpc, nn_grpc
from .service import NNService
from .sessions import SessionScopes
from .targets import ListenAddress, TargetError, parse_listen

log = logging.getLogger("wasinn_host")

SERVICES = (
    "wasi_ephemeral_nn.Graph",
    "wasi_ephemeral_nn.GraphResource",
    "wasi_ephemeral_nn.GraphExecutionContextResource",
    "wasinn_host.rpc.v1.Host",
)
ENVELOPE = 64 << 10
"""Room for the protobuf framing around the largest payload a message may carry."""
SERVER_KEEPALIVE = [*KEEPALIVE, ("grpc.http2.min_ping_interval_without_data_ms", 5_000)]


@dataclass
class ServeOptions:
    """Security and capacity settings of one server."""

    token: str | None = None
    """Required as ``authorization: Bearer TOKEN`` on every call but health checks."""
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    max_workers: int = 256
    """Threads serving calls (a computing call, a pushed stream and a keep-alive stream hold one each; at
    most half of them push streams)."""
    drain_seconds: float = 30.0
    """How long a shutdown waits for calls in flight."""
    session_grace_s: float = 30.0
    """How long a client session whose keep-alive streams all ended is kept for its client to attach
    again (a client that closes says so and is freed at once); 0: freed at once."""
    allow_load_bytes: bool = False
    """Accept models sent as bytes (``Load``), within the limits' ``max_load_bytes``."""


class TokenCheck(grpc.ServerInterceptor):
    """Refuse (``UNAUTHENTICATED``) every call but health checks without the server's token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        """Pass the call on, or answer it with a refusal of the same kind."""
        handler = continuation(details)
        if handler is None or details.method.startswith("/grpc.health.v1.Health/"):
            return handler
        sent = dict(details.invocation_metadata or ()).get(TOKEN_KEY, "")
        if hmac.compare_digest(str(sent).encode(), self._expected):
            return handler
        method = details.method

        def deny(request: Any, context: Any) -> Any:
            log.warning("rpc: refused %s: missing or wrong token", method, extra={"event": "rpc_auth"})
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "this server requires its token (--nn-rpc-token)")

        kind = grpc.unary_stream_rpc_method_handler if handler.unary_stream else grpc.unary_unary_rpc_method_handler
        return kind(deny, handler.request_deserializer, handler.response_serializer)


def check_exposure(address: ListenAddress, options: ServeOptions) -> None:
    """Refuse to listen beyond this machine without a token or TLS."""
    if address.loopback or options.token or options.tls_cert:
        return
    raise TargetError(
        f"{address.target}: refusing to listen on a non-loopback address without --nn-rpc-token "
        f"or --tls-cert/--tls-key (anyone who can reach it could run the models)"
    )


def _message_limits(service: NNService) -> list[tuple[str, int]]:
    limits = service.limits
    largest_in = max(
        limits.max_prompt_bytes + INLINE_IMAGE_ROOM, limits.max_load_bytes if service.allow_load_bytes else 0
    )
    return [
        ("grpc.max_receive_message_length", min(MAX_MESSAGE, largest_in + ENVELOPE)),
        ("grpc.max_send_message_length", min(MAX_MESSAGE, limits.max_output_bytes + ENVELOPE)),
    ]


class NNServer:
    """A gRPC server for one backend: start, serve, drain."""

    def __init__(
        self,
        uri: str,
        backend: LocalBackend,
        allowed: Iterable[str] | None = None,
        options: ServeOptions | None = None,
    ) -> None:
        self.options = options or ServeOptions()
        self.address = parse_listen(uri)
        check_exposure(self.address, self.options)
        self.scopes = SessionScopes(backend.limits, allowed, self.options.session_grace_s)
        self.service = NNService(
            backend, self.scopes, self.options.allow_load_bytes, max_pushes=max(1, self.options.max_workers // 2)
        )
        self.health = health.HealthServicer()
        interceptors = [TokenCheck(self.options.token)] if self.options.token else []
        self.server = grpc.server(
            ThreadPoolExecutor(self.options.max_workers, thread_name_prefix="wasinn-rpc"),
            interceptors=interceptors,
            options=_message_limits(self.service) + SERVER_KEEPALIVE,
        )
        for add in (
            nn_grpc.add_GraphServicer_to_server,
            nn_grpc.add_GraphResourceServicer_to_server,
            nn_grpc.add_GraphExecutionContextResourceServicer_to_server,
            host_grpc.add_HostServicer_to_server,
        ):
            add(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self._bind()
        self._stopped = threading.Event()
        self._reaper: threading.Thread | None = None

    def _bind(self) -> int:
        path = self.address.unix_path
        if path is not None and os.path.exists(path):
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                raise TargetError(f"unix:{path}: exists and is not a socket")
            os.unlink(path)  # a socket left by a server that died
        old_umask = os.umask(0o177) if path is not None else None
        try:
            if self.options.tls_cert and self.options.tls_key:
                credentials = grpc.ssl_server_credentials([(self.options.tls_key, self.options.tls_cert)])
                port = self.server.add_secure_port(self.address.target, credentials)
            else:
                port = self.server.add_insecure_port(self.address.target)
        except RuntimeError as exc:
            raise TargetError(f"{self.address.target}: cannot listen: {exc}") from None
        finally:
            if old_umask is not None:
                os.umask(old_umask)
        if path is not None:
            os.chmod(path, 0o600)
        elif port == 0:
            raise TargetError(f"{self.address.target}: cannot listen (address in use or not available)")
        return int(port)

    def start(self) -> None:
        """Serve calls; health says SERVING."""
        self.server.start()
        for name in ("", *SERVICES):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        idle_ms = self.scopes.limits.idle_timeout_ms
        if idle_ms > 0:
            self._reaper = threading.Thread(target=self._reap, args=(idle_ms / 1000,), daemon=True)
            self._reaper.start()
        log.info("serving WASI-NN over gRPC on %s", self.address.target, extra={"event": "rpc_serve"})

    def _reap(self, idle_seconds: float) -> None:
        while not self._stopped.wait(min(idle_seconds, 10.0)):
            reaped = self.scopes.reap_idle(idle_seconds)
            if reaped:
                log.info("finalised %d execution contexts idle for %g s", reaped, idle_seconds)

    def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, no new calls, calls in flight finish (up to ``grace`` s)."""
        self.health.enter_graceful_shutdown()
        self.service.end_pushes()
        self.service.end_attach_streams()
        self._stopped.set()
        self.server.stop(self.options.drain_seconds if grace is None else grace).wait()
        self.scopes.close()
        if self.address.unix_path is not None:
            try:
                os.unlink(self.address.unix_path)
            except FileNotFoundError:
                pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout`` s pass); True if it stopped."""
        return bool(self.server.wait_for_termination(timeout))
