"""Keeping a client's session on one server (:class:`SessionKeeper`, one per :class:`~.endpoint.Endpoint`).

* **The keep-alive stream** (``Attach``): the server holds the session while it is open.  When something
  on the way ends it (a proxy's idle or stream-age limit, a reset connection) the keeper opens it again
  at once, then after waits that double up to :data:`REATTACH_SECONDS`' longest while the server cannot
  be reached; after :data:`GIVE_UP_SECONDS` of that it stops, and the endpoint starts it again once the
  server answers.  Meanwhile the server keeps the session for its grace (``wasinn serve
  --session-grace``, 30 s by default).
* **The scope's id**: each event of the stream, and each ``Status`` answer, names the server's scope of
  the session, a new id whenever the server made the scope anew.  Another id than before means the
  handles there are gone (the server restarted, or the client was away longer than the grace): the
  client forgets them (:attr:`.endpoint.Endpoint.on_lost`).
* **Frees kept for later**: a context or graph closed while the server cannot be reached is finalised or
  unloaded once the server answers again with the same scope.  A server that names no scope (one before
  scopes had ids, or WasmEdge's) is taken to free a session that lost its stream, as such servers do.
* **Detach**: a closing client tells the server, which frees the session at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Protocol

import grpc

from ..core.errors import WasiNNError
from .messages import host

log = logging.getLogger("wasinn_host")

REATTACH_SECONDS = (0.2, 5.0)
"""The first and the longest wait before a keep-alive stream that ended is opened again (doubling while
the server cannot be reached; well within the server's grace, 30 s by default)."""
STEADY_SECONDS = 1.0
"""A stream open this long was a working one: its end is logged and the next is opened at once."""
GIVE_UP_SECONDS = 60.0
"""How long the keeper tries to reach a server that does not answer before it leaves that to the
endpoint's probes (a backend that went away for good keeps no thread busy)."""
DETACH_TIMEOUT = 2.0
"""How long a closing client waits for the server to take its ``Detach``."""


class KeptEndpoint(Protocol):
    """What the keeper needs of its :class:`~.endpoint.Endpoint`."""

    target: str
    host: Any
    """The ``Host`` service's stub."""
    metadata: tuple[tuple[str, str], ...]
    has_host: bool | None
    down_since: float | None
    closed: bool
    on_lost: Callable[[Any], None] | None

    def host_call(self, method: str, request: Any) -> Any:
        """A call of the ``Host`` service (failures as :class:`WasiNNError`)."""


class SessionKeeper:
    """The keep-alive stream, the scope's id, frees kept for later and the ``Detach`` of one endpoint."""

    def __init__(self, endpoint: KeptEndpoint) -> None:
        self.endpoint = endpoint
        self.scope: str | None = None
        """The server's id of this session's scope, as last seen (None: not seen yet, or none named)."""
        self._stream: Any = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._later: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._detach: Any = None

    def start(self, now: bool = True) -> None:
        """Keep the session: start the keep-alive loop if it is not running; if it is and waits to open the
        stream again, open it ``now``."""
        endpoint = self.endpoint
        if endpoint.has_host is False or endpoint.closed:
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                if now:
                    self._wake.set()
                return
            self._thread = threading.Thread(target=self._keep, daemon=True, name="wasinn-attach")
            self._thread.start()

    def _keep(self) -> None:
        endpoint = self.endpoint
        delay = REATTACH_SECONDS[0]
        unreachable_since: float | None = None
        while not endpoint.closed:
            opened = time.monotonic()
            events, why = self._attend()
            if events is None or endpoint.closed:
                return
            if events and time.monotonic() - opened >= STEADY_SECONDS:
                delay, unreachable_since = REATTACH_SECONDS[0], None
                log.info(
                    "RPC backend %s: the session's keep-alive stream ended (%s); opening it again", endpoint.target, why
                )
            elif not events:
                unreachable_since = unreachable_since or opened
                if time.monotonic() - unreachable_since > GIVE_UP_SECONDS:
                    return  # the endpoint starts the loop again once the server answers a probe
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(delay * 2, REATTACH_SECONDS[1])

    def _attend(self) -> tuple[int | None, str]:
        """One keep-alive stream, read to its end: the events it brought (None: keep no more: the client
        closed, or the server has no ``Attach``) and why it ended."""
        endpoint = self.endpoint
        try:
            call = endpoint.host.Attach(host.AttachRequest(), metadata=endpoint.metadata)
        except ValueError:  # the channel was closed meanwhile
            return None, "closed"
        self._stream = call
        if endpoint.closed:  # the close may have cancelled the stream before this one
            call.cancel()
            return None, "closed"
        events = 0
        try:
            for event in call:
                events += 1
                endpoint.has_host = True
                self.saw_scope(event.scope)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                endpoint.has_host = False  # a server without this host's service (WasmEdge's)
                return None, "unimplemented"
            return events, f"{exc.code().name}: {exc.details()}"
        return events, "the server ended it"

    def saw_scope(self, scope: str) -> None:
        """The server names ``scope`` as this session's: if it named another before, the handles there are
        gone (the endpoint's ``on_lost``); else the frees kept for later go now."""
        if not scope:
            return  # a server that names none
        with self._lock:
            before, self.scope = self.scope, scope
            later, self._later = self._later, []
        endpoint = self.endpoint
        if before is not None and before != scope:
            log.warning(
                "RPC backend %s no longer holds this client's graphs and contexts (it restarted, or the client "
                "was away longer than its grace): they are forgotten",
                endpoint.target,
            )
            if endpoint.on_lost is not None:
                endpoint.on_lost(endpoint)
            return
        for method, request in later:
            try:
                endpoint.host_call(method, request)
            except WasiNNError as err:
                log.info("%s on %s, kept from an outage: %s", method, endpoint.target, err.message)

    def later(self, method: str, request: Any) -> None:
        """Call ``method`` (a finalize or an unload) with ``request`` once the server answers again with
        this session's scope; nothing where the server names no scope (it frees the session itself)."""
        if self.scope is None:
            return
        with self._lock:
            self._later.append((method, request))

    @property
    def keeps_sessions(self) -> bool:
        """Whether the server keeps this session across an outage (it names the session's scope)."""
        return self.scope is not None

    def begin_close(self) -> None:
        """Tell the server this session is done (a ``Detach`` whose answer :meth:`end` waits for), and
        let the keep-alive loop end."""
        endpoint = self.endpoint
        if endpoint.has_host is not False and endpoint.down_since is None:
            try:
                self._detach = endpoint.host.Detach.future(
                    host.DetachRequest(), metadata=endpoint.metadata, timeout=DETACH_TIMEOUT
                )
            except ValueError:  # the channel is closed
                self._detach = None
        self._wake.set()

    def end(self) -> None:
        """Wait for the server to take the ``Detach`` (at most :data:`DETACH_TIMEOUT` after it was sent),
        then end the keep-alive stream."""
        detach, self._detach = self._detach, None
        if detach is not None:
            try:
                detach.result()
            except grpc.RpcError:
                pass  # a server without Detach frees the session once the stream ends, after its grace
        stream = self._stream
        if stream is not None:
            stream.cancel()
