"""One RPC backend as the client sees it: a channel, the stubs, and whether it is up.

Every call carries the client's session id (and the token, if any); a failed call becomes a
:class:`WasiNNError` through :func:`~wasinn_host.rpc.wire_errors.error_from` (errno trailer,
else a runtime error).  A call that finds the server unreachable marks it down with one log
line; placement skips it until a status probe succeeds again (gRPC reconnects by itself).
The session's keep-alive stream, its scope's id, the frees kept through an outage and the closing
``Detach`` are the :class:`~.session_keeper.SessionKeeper`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import grpc

from ..core.errors import ErrorKind, WasiNNError
from .messages import KEEPALIVE, MAX_MESSAGE, SESSION_KEY, TOKEN_KEY, host, host_grpc, nn_grpc
from .session_keeper import SessionKeeper
from .wire_errors import errno_of, error_from

log = logging.getLogger("wasinn_host")

RETRY_SECONDS = 1.0
"""How long a backend found down is skipped before a probe is tried again."""
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    *KEEPALIVE,
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


@dataclass
class ClientOptions:
    """How a client reaches its servers."""

    token: str | None = None
    """Sent as ``authorization: Bearer TOKEN`` (servers started with ``--nn-rpc-token``)."""
    tls_ca: bytes | None = None
    """PEM roots to verify servers started with ``--tls-cert``; None: plain connections."""
    unary_timeout: float = 60.0
    """Deadline in seconds of calls that do not compute (load, set_input, get_output ...)."""
    compute_timeout: float | None = None
    """Deadline of ``compute``/``compute_single`` (None: none; the server cancels at the deadline)."""


class Endpoint:
    """One server: stubs bound to the session's metadata, up/down state, keep-alive stream."""

    def __init__(self, target: str, session: str, options: ClientOptions) -> None:
        self.target = target
        self.options = options
        if options.tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=options.tls_ca)
            self.channel = grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.graph = nn_grpc.GraphStub(self.channel)
        self.graph_resource = nn_grpc.GraphResourceStub(self.channel)
        self.context = nn_grpc.GraphExecutionContextResourceStub(self.channel)
        self.host = host_grpc.HostStub(self.channel)
        metadata = [(SESSION_KEY, session)]
        if options.token:
            metadata.append((TOKEN_KEY, f"Bearer {options.token}"))
        self.metadata = tuple(metadata)
        self.has_host: bool | None = None
        """Whether the server has this host's own service (None: not known yet)."""
        self.has_step = True
        """False once the server answered ``ComputeSingleOutput`` as unimplemented."""
        self.has_pieces = True
        """False once the server answered ``ComputePieces`` as unimplemented."""
        self.has_push = True
        """False once the server answered ``StreamSingle`` as unimplemented (or its contexts cannot push)."""
        self.down_since: float | None = None
        self.closed = False
        """True after :meth:`close`: calls fail with a runtime error instead of grpcio's ValueError."""
        self.contexts = 0
        """Contexts this client has open on the server."""
        self._lock = threading.Lock()
        self._finished = False
        self.on_lost: Callable[[Endpoint], None] | None = None
        """Called when the server no longer holds this client's handles (it restarted, or the client was
        away longer than its grace; for a server that keeps no session across an outage, when it is found
        unreachable): the client forgets them."""
        self.keeper = SessionKeeper(self)

    def call(self, rpc: Any, request: Any, method: str, timeout: float | None = None) -> Any:
        """``rpc(request)`` with the session metadata; failures as :class:`WasiNNError`."""
        if self.closed:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"{method}: the connection to {self.target} is closed")
        try:
            return rpc(request, metadata=self.metadata, timeout=timeout or self.options.unary_timeout)
        except grpc.RpcError as exc:
            raise self._failure(exc, method) from None

    def compute(self, rpc: Any, request: Any, method: str, started: Callable[[Any], None] | None) -> Any:
        """A computing call, cancellable: ``started`` receives the call's future.  Without ``started``, a
        call that cannot be cancelled, for one that never waits for the model: the blocking form costs
        the client about 250 us of CPU where a future costs 400-470 (measured, unix socket)."""
        if started is None:
            try:
                return rpc(request, metadata=self.metadata, timeout=self.options.compute_timeout)
            except grpc.RpcError as exc:
                raise self._failure(exc, method) from None
        future = rpc.future(request, metadata=self.metadata, timeout=self.options.compute_timeout)
        started(future)
        try:
            return future.result()
        except grpc.FutureCancelledError:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"{method} on {self.target} was cancelled") from None
        except grpc.RpcError as exc:
            raise self._failure(exc, method) from None

    def stream(self, rpc: Any, request: Any, method: str, started: Callable[[Any], None]) -> Iterator[Any]:
        """A computing call that streams its results, cancellable: ``started`` receives the call."""
        call = rpc(request, metadata=self.metadata, timeout=self.options.compute_timeout)
        started(call)
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and errno_of(exc) is None:
                raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"{method} on {self.target} was cancelled") from None
            raise self._failure(exc, method) from None

    def _failure(self, exc: grpc.RpcError, method: str) -> WasiNNError:
        err = error_from(exc, self.target, method)
        if errno_of(exc) is None and exc.code() == grpc.StatusCode.UNAVAILABLE:
            self.mark_down(str(exc.details()))
        elif errno_of(exc) is None and exc.code() == grpc.StatusCode.UNIMPLEMENTED and method in HOST_METHODS:
            self.has_host = False  # (an errno, e.g. a Load the server refuses, says nothing of the service)
        return err

    def host_call(self, method: str, request: Any) -> Any:
        """A call of this host's own service; UnsupportedOperation if the server lacks it."""
        if self.has_host is False:
            raise WasiNNError(ErrorKind.UNSUPPORTED, f"the server at {self.target} does not implement {method}")
        response = self.call(getattr(self.host, method), request, method)
        self.has_host = True
        return response

    def load(self) -> int | None:
        """Contexts open on the server (all clients), or None if it cannot say."""
        if self.has_host is False:
            return None
        try:
            reply = self.host_call("Status", host.StatusRequest())
        except WasiNNError:
            return None
        self.keeper.saw_scope(reply.scope)
        self.keeper.start(now=False)  # (the keep-alive loop stops after a long outage; the server answers again)
        return int(reply.contexts)

    def mark_down(self, why: str) -> None:
        """Note the server unreachable (one log line per outage)."""
        with self._lock:
            if self.down_since is not None:
                self.down_since = time.monotonic()
                return
            self.down_since = time.monotonic()
        log.error("RPC backend %s is unreachable: %s; its contexts fail with errno 5", self.target, why)
        if not self.keeper.keeps_sessions and self.on_lost is not None:
            self.on_lost(self)  # a server that names no scope: its handles are taken for gone, as before

    def usable(self) -> bool:
        """Up, or down long enough ago that a probe is worth it and succeeds."""
        if self.down_since is None:
            return True
        if time.monotonic() - self.down_since < RETRY_SECONDS:
            return False
        before = self.down_since
        scope = ""
        try:
            scope = self.call(self.host.Status, host.StatusRequest(), "Status", timeout=2.0).scope
        except WasiNNError as err:
            if self.down_since != before:  # still unreachable (any answer at all means it is up)
                return False
            self.has_host = err.kind is not ErrorKind.UNSUPPORTED
        log.warning("RPC backend %s is reachable again", self.target)
        self.down_since = None
        self.keeper.saw_scope(scope)
        self.attach()
        return True

    def attach(self) -> None:
        """Keep this client's session on the server (:meth:`.SessionKeeper.start`)."""
        self.keeper.start()

    def begin_close(self) -> None:
        """The first half of :meth:`close`: no more calls; the server is told the session is done (so that a
        client closing several endpoints waits for their answers together)."""
        if self.closed:
            return
        self.closed = True
        self.keeper.begin_close()

    def close(self) -> None:
        """Tell the server this session is done (it frees the session's contexts and graphs at once), end
        the keep-alive stream and the channel (again: nothing)."""
        self.begin_close()
        if self._finished:
            return
        self._finished = True
        self.keeper.end()
        self.channel.close()


HOST_METHODS = ("Load", "Unload", "FinalizeExecutionContext", "Status", "Attach", "Detach")
