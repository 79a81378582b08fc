"""The gRPC servicer: WasmEdge's ``Graph``, ``GraphResource`` and ``GraphExecutionContextResource``
services and this host's ``Host`` service, over one backend and the session scopes.

Each call finds its session's handle tables, runs the same checks and the same execution
context code the core-module imports run (so the WasmEdge rules are identical), and turns a
:class:`WasiNNError` into status ``UNKNOWN`` with an ``errno`` trailer and one log line.
Config JSON from a client is screened (no server paths, no printing on the server).
A computation whose call ends early (client cancelled, deadline passed, client gone) is
cancelled in the engine.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Iterator, TypeVar

import orjson
from google.protobuf.empty_pb2 import Empty

from ..backend.local import LocalBackend
from ..core.config.keys import EMPTY_CONFIG
from ..core.config.preload import Target
from ..core.errors import ErrorKind, WasiNNError, invalid
from ..core.scheduling.stream_feed import LOOKAHEAD
from ..ephemeral.errno import errno_for
from ..ephemeral.execution import METADATA_INDEX, ExecutionContext
from ..ephemeral.handles import HandleTables
from ..ephemeral.tensor_check import check_dims_count, check_input_data, check_input_tensor
from .messages import SESSION_KEY, host, nn
from .remote_config import remote_config
from .sessions import ANONYMOUS, SessionScopes
from .stream_push import PushSender
from .wire_errors import abort_with

log = logging.getLogger("wasinn_host")

T = TypeVar("T")
MAX_AHEAD = LOOKAHEAD
"""Most pieces one ``ComputeSingleOutput`` sends ahead (a stream's job samples no further ahead)."""
_QUIET = (ErrorKind.END_OF_SEQUENCE,)
HEARTBEAT_S = 20.0
"""Seconds between a keep-alive stream's events: traffic on the stream, so that a proxy with an idle
limit on streams (Envoy's is 5 minutes) does not end it (gRPC's own pings are not stream traffic)."""


def session_of(context: Any) -> str:
    """The ``wasinn-session`` metadata of a call ('' for WasmEdge clients)."""
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_KEY:
            return str(value)
    return ANONYMOUS


class NNService:
    """One object serving every method of the four services (their names do not collide)."""

    def __init__(
        self, backend: LocalBackend, scopes: SessionScopes, allow_load_bytes: bool = False, max_pushes: int = 128
    ) -> None:
        self.backend = backend
        self.max_pushes = max_pushes
        """Streams pushed at once (each holds a serving thread while open); beyond them ``StreamSingle`` is
        answered UnsupportedOperation and the client streams with ``ComputeSingleOutput`` instead."""
        self._pushes = 0
        self._pushes_lock = threading.Lock()
        self._senders: set[PushSender] = set()
        self._draining = False
        self.allow_load_bytes = allow_load_bytes and scopes.limits.allow_load_bytes
        self.scopes = scopes
        self.limits = scopes.limits
        self.heartbeat_s = HEARTBEAT_S
        """Seconds between the events of a keep-alive stream."""
        self._attached: set[threading.Event] = set()
        self._attached_lock = threading.Lock()

    # -- plumbing --------------------------------------------------------------

    def _run(self, context: Any, method: str, body: Callable[[HandleTables, threading.Lock, str], T]) -> T:
        result = self._attempt(context, method, body)
        if isinstance(result, WasiNNError):
            abort_with(context, result)
        return result

    def _attempt(
        self, context: Any, method: str, body: Callable[[HandleTables, threading.Lock, str], T]
    ) -> T | WasiNNError:
        """``body`` in the caller's session scope: its result, or the error to end the call with (logged)."""
        session = session_of(context)
        state, lock = self.scopes.scope(session)
        try:
            return body(state, lock, session)
        except Exception as exc:
            return self._failure(method, session, exc)

    @staticmethod
    def _failure(method: str, session: str, exc: Exception) -> WasiNNError:
        """The error a call ends with for ``exc`` (a host bug is a runtime error), logged."""
        if isinstance(exc, WasiNNError):
            failure = exc
        else:  # a host bug is a runtime error for the client, never a crash
            log.exception("rpc %s: internal error: %s", method, exc, exc_info=exc)
            failure = WasiNNError(ErrorKind.RUNTIME_ERROR, f"{method}: internal error: {exc}")
        if failure.kind not in _QUIET:
            errno = errno_for(failure.kind)
            log.warning(
                "rpc %s: %s (errno %d %s)",
                method,
                failure.message,
                errno,
                errno.name,
                extra={"event": f"rpc_{method}", "errno": int(errno), "session": session},
            )
        return failure

    def _context(self, state: HandleTables, handle: int) -> ExecutionContext:
        return state.context(handle)

    @staticmethod
    def _cancel_if_gone(context: Any, ctx: ExecutionContext) -> None:
        """Cancel ``ctx``'s computation when the call ends before it does."""

        def on_end() -> None:
            if ctx.busy:
                ctx.cancel()

        context.add_callback(on_end)

    # -- wasi_ephemeral_nn.Graph -----------------------------------------------

    def LoadByName(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC method names)
        """``load_by_name``: a graph handle in the caller's scope."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            with lock:
                handle = state.load_named(self.backend, request.name, EMPTY_CONFIG, reuse=session == ANONYMOUS)
            return nn.LoadByNameResult(graph_handle=handle)

        return self._run(context, "load_by_name", body)

    def LoadByNameWithConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``load_by_name_with_config``: as LoadByName, with screened config JSON."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            config = remote_config(request.config.encode())
            with lock:
                handle = state.load_named(self.backend, request.name, config, reuse=session == ANONYMOUS)
            return nn.LoadByNameWithConfigResult(graph_handle=handle)

        return self._run(context, "load_by_name_with_config", body)

    # -- wasi_ephemeral_nn.GraphResource ---------------------------------------

    def InitExecutionContext(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``init_execution_context`` on a graph of the caller's scope."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            with lock:
                handle = state.open_context(request.resource_handle)
            return nn.InitExecutionContextResult(ctx_handle=handle)

        return self._run(context, "init_execution_context", body)

    # -- wasi_ephemeral_nn.GraphExecutionContextResource -----------------------

    def SetInput(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``set_input``: index 1 screened config JSON, any other the prompt."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            ctx = self._context(state, request.resource_handle)
            tensor = request.tensor
            check_dims_count(len(tensor.dimensions))
            check_input_tensor(int(tensor.ty), list(tensor.dimensions), len(tensor.data), self.limits)
            check_input_data(tensor.data, self.limits)
            if request.index == METADATA_INDEX:
                ctx.configure(remote_config(tensor.data))
            else:
                ctx.set_input(request.index, tensor.data)
            return Empty()

        return self._run(context, "set_input", body)

    def _compute(self, context: Any, method: str, step: Callable[[ExecutionContext], None], handle: int) -> Any:
        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            ctx = self._context(state, handle)
            self._cancel_if_gone(context, ctx)
            step(ctx)
            return Empty()

        return self._run(context, method, body)

    def Compute(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``compute``: the whole answer (context full: the output is kept and errno 101 sent)."""
        return self._compute(context, "compute", ExecutionContext.compute, request.resource_handle)

    def ComputeSingle(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``compute_single``: one token (end of sequence: errno 100)."""
        return self._compute(context, "compute_single", ExecutionContext.compute_single, request.resource_handle)

    def FiniSingle(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``fini_single``: end a stream."""
        return self._compute(context, "fini_single", ExecutionContext.fini_single, request.resource_handle)

    def GetOutput(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``get_output``: the whole output, or index 1's metadata JSON; at most ``output_max_size``
        bytes when the client sends one (larger: errno 7, as WasmEdge's server), else no limit."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            data = self._context(state, request.resource_handle).get_output(request.index)
            return nn.GetOutputResult(data=_within_max(data, request.output_max_size, "get_output"))

        return self._run(context, "get_output", body)

    def GetOutputSingle(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``get_output_single``: the last token's piece, or index 1's metadata JSON (``output_max_size``
        as for ``GetOutput``)."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            data = self._context(state, request.resource_handle).get_output_single(request.index)
            return nn.GetOutputResult(data=_within_max(data, request.output_max_size, "get_output_single"))

        return self._run(context, "get_output_single", body)

    # -- wasinn_host.rpc.v1.Host -----------------------------------------------

    def ComputeSingleOutput(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``compute_single`` and the new token's piece in one round trip (errors as ``ComputeSingle``),
        after the ``taken`` steps the client answered from earlier ``ready`` pieces; with ``ahead``, the
        pieces of up to that many tokens already sampled after it (:data:`MAX_AHEAD` at most)."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            ctx = self._context(state, request.ctx_handle)
            self._cancel_if_gone(context, ctx)
            for _ in range(min(request.taken, MAX_AHEAD)):
                ctx.compute_single()  # tokens the client has shown its guest: already sampled, no wait
            if request.sync_only:
                return host.StepResult()
            ctx.compute_single()
            ready = ctx.ready_pieces(min(request.ahead, MAX_AHEAD)) if request.ahead else []
            return host.StepResult(piece=ctx.get_output_single(0), ready=ready)

        return self._run(context, "compute_single", body)

    def StreamSingle(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:  # noqa: N802
        """``compute_single`` pushed: the pieces of a stream's tokens as they are sampled, the steps taken
        as the client reports its guest took them (:mod:`.stream_push`); errors as ``ComputeSingle``."""
        first = next(requests, None)
        if first is None:
            return
        session = session_of(context)
        with self._pushes_lock:
            room = self._pushes < self.max_pushes
            self._pushes += room
        if not room:
            abort_with(context, WasiNNError(ErrorKind.UNSUPPORTED, f"{self.max_pushes} streams are pushed already"))
        try:
            yield from self._push(first, requests, context, session)
        finally:
            with self._pushes_lock:
                self._pushes -= 1

    def _push(self, first: Any, requests: Iterator[Any], context: Any, session: str) -> Iterator[Any]:
        """The messages of one pushed stream (``first`` named its context)."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> PushSender:
            return PushSender(self._context(state, first.ctx_handle), requests)

        sender = self._attempt(context, "compute_single", body)
        if isinstance(sender, WasiNNError):
            abort_with(context, sender)
        context.add_callback(sender.cancel_unless_finished)  # a cancelled call cancels, as a unary one does
        with self._pushes_lock:
            self._senders.add(sender)
            if self._draining:
                sender.drain()
        failure: WasiNNError | None = None
        try:
            yield from sender.results()
        except Exception as exc:  # noqa: BLE001 - every failure ends the call with its errno
            failure = self._failure("compute_single", session, exc)
        finally:
            sender.stop()
            with self._pushes_lock:
                self._senders.discard(sender)
        if failure is not None:
            abort_with(context, failure)

    def ComputePieces(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        """``compute`` with each token's piece streamed as it is generated (what the client prints for a
        guest's ``stream-stdout``); ends with the same errors as ``Compute``, after the pieces."""
        pieces: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        outcome: list[object] = []

        def body(state: HandleTables, lock: threading.Lock, session: str) -> None:
            ctx = self._context(state, request.ctx_handle)
            self._cancel_if_gone(context, ctx)
            ctx.compute(on_piece=pieces.put)

        def compute() -> None:
            try:
                outcome.append(self._attempt(context, "compute", body))
            finally:
                pieces.put(None)

        threading.Thread(target=compute, name="wasinn-rpc-pieces", daemon=True).start()
        while (piece := pieces.get()) is not None:
            yield host.StepResult(piece=piece)
        if outcome and isinstance(outcome[0], WasiNNError):
            abort_with(context, outcome[0])

    def Load(self, request: Any, context: Any) -> Any:  # noqa: N802
        """A model from GGUF bytes, if the server allows it and within ``max_load_bytes``."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            if not self.allow_load_bytes:
                raise WasiNNError(
                    ErrorKind.UNSUPPORTED,
                    "load: models sent as bytes are refused by this server (start it with --allow-load-bytes)",
                )
            if len(request.model) > self.limits.max_load_bytes:
                raise self.limits.refuse(
                    ErrorKind.TOO_LARGE,
                    f"load: model of {len(request.model)} bytes",
                    "max_load_bytes",
                    self.limits.max_load_bytes,
                )
            if not request.model:
                raise invalid("load: no model bytes")
            config = remote_config(request.config.encode())
            if request.target:
                if request.target.upper() not in ("CPU", "GPU", "TPU"):
                    raise invalid(f"load: execution target {request.target!r} is not accepted; accepted: cpu, gpu, tpu")
                config = config.with_target(Target[request.target.upper()])
            with lock:
                state.check_graph_room()
            graph = self.backend.load_bytes(request.model, config)
            with lock:
                handle = state.add_graph(graph)
            return host.LoadResult(graph_handle=handle)

        return self._run(context, "load", body)

    def Unload(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``unload``: forget a graph of the caller's scope."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            with lock:
                state.unload(request.graph_handle)
            return host.UnloadResult()

        return self._run(context, "unload", body)

    def FinalizeExecutionContext(self, request: Any, context: Any) -> Any:  # noqa: N802
        """``finalize_execution_context``: free a context of the caller's scope."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            with lock:
                state.finalize(request.ctx_handle)
            return host.FinalizeResult()

        return self._run(context, "finalize_execution_context", body)

    def status(self) -> dict[str, Any]:
        """The backend's status plus the sessions section."""
        status = self.backend.status()
        status["rpc"] = self.scopes.status()
        return status

    def Status(self, request: Any, context: Any) -> Any:  # noqa: N802
        """The status JSON and the number of contexts open (the client's placement load)."""

        def body(state: HandleTables, lock: threading.Lock, session: str) -> Any:
            return host.StatusResult(
                json=orjson.dumps(self.status()).decode(),
                contexts=self.scopes.counter.value,
                scope=self.scopes.scope_id(session),
            )

        return self._run(context, "status", body)

    def Attach(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        """Keep the caller's session alive while this stream is open, with an event every
        :attr:`heartbeat_s`; once its last stream ends, the scope is freed after the grace
        (:class:`.sessions.SessionScopes`)."""
        session = session_of(context)
        if session == ANONYMOUS:
            abort_with(context, invalid("attach: the call names no wasinn-session"))
        ended = threading.Event()
        context.add_callback(ended.set)
        with self._attached_lock:
            self._attached.add(ended)
        scope = self.scopes.attach(session)
        try:
            yield host.AttachEvent(session=session, scope=scope)
            while not ended.wait(self.heartbeat_s):
                yield host.AttachEvent(session=session, scope=scope)
        finally:
            with self._attached_lock:
                self._attached.discard(ended)
            self.scopes.detach(session)

    def Detach(self, request: Any, context: Any) -> Any:  # noqa: N802
        """The caller's client is done: free its session's scope now (no grace)."""
        session = session_of(context)
        if session == ANONYMOUS:
            abort_with(context, invalid("detach: the call names no wasinn-session"))
        self.scopes.end(session, "closed by its client")
        return host.DetachResult()

    def end_attach_streams(self) -> None:
        """Let every keep-alive stream end (server shutdown)."""
        with self._attached_lock:
            for event in self._attached:
                event.set()

    def end_pushes(self) -> None:
        """End every pushed stream after the pieces sampled, and push no more (server shutdown)."""
        with self._pushes_lock:
            self._draining = True
            for sender in self._senders:
                sender.drain()


def _within_max(data: bytes, output_max_size: int, method: str) -> bytes:
    """``data`` if it fits the client's ``output_max_size`` (0: a client that sends none, no limit)."""
    if output_max_size and len(data) > output_max_size:
        raise WasiNNError(
            ErrorKind.TOO_LARGE,
            f"{method}: the output is {len(data)} bytes, more than the output_max_size of {output_max_size} "
            f"the client asked for",
        )
    return data
