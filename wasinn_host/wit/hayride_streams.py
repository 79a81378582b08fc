"""Hayride's streaming interfaces (``hayride:ai`` graph-stream, inference-stream, tensor-stream).

Hayride's guests stream a generation through these beside ``wasi:nn``: ``graph-stream.load-by-name``
-> ``init-execution-context-stream`` -> ``compute(inputs)``, which takes the same input tensors as
``wasi:nn`` compute (``prompt``, ``metadata``, Hayride's ``options``) and returns the stream under
the name ``wasi:nn`` compute gives its text (``Output`` with Hayride's ``options``, else
``output``).  Each ``read(len)`` generates tokens (the backend's streaming steps, batched with
every other context) until it has bytes, and returns at most ``len`` of them; after the last
token (end of generation, a full context, or the config's ``n-predict``) it returns ``closed``.
A failure while generating is logged and also ends the stream with ``closed``: a
``last-operation-failed`` error is a ``wasi:io`` resource this host cannot create.
``subscribe`` returns a ready pollable (``read`` itself waits for the tokens; see
:mod:`~wasinn_host.wit.ready_pollable`).  A guest may also build a tensor-stream over bytes
(the constructor), which reads back those bytes.

The interfaces kept the same shape from hayride:ai 0.0.38 to 0.0.63; each of those versions is
defined, since a 0.0.x version only links to exactly itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from wasmtime import component as cm

from ..core.config.limits import Limits
from ..core.errors import WasiNNError
from ..core.generation import StopReason
from .llm_mapping import HAYRIDE_OUTPUT, OUTPUT, read_request
from .store_state import CONTEXT_STREAM, GRAPH_STREAM, TENSOR_STREAM, ComponentState

log = logging.getLogger("wasinn_host")

AddFunc = Callable[[cm.LinkerInstance, str, Callable[..., Any]], None]
"""Defines one host function on a linker instance (``fast_calls.add_fast_func`` or wasmtime-py's)."""
VERSIONS = tuple(f"0.0.{n}" for n in range(38, 64))
"""The hayride:ai versions defined (same interface shape in all of them)."""
CLOSED = None
"""``err(stream-error.closed)`` as wasmtime-py lowers it: the variant's cases have distinct Python
types (a resource, nothing), so it is untagged and ``closed`` is None; so is the result around it."""


@dataclass(eq=False)
class TensorStream:
    """One ``tensor-stream``: bytes not yet read, and the streaming context that makes more."""

    dimensions: tuple[int, ...]
    ty: str
    pending: bytearray = field(default_factory=bytearray)
    context: int | None = None
    """The rep of the ``graph-execution-context-stream`` generating into this stream (None: bytes only)."""
    left: int = -1
    """Tokens the config's ``n-predict`` still allows (-1: no limit)."""

    @property
    def done(self) -> bool:
        """No more bytes will come."""
        return self.context is None


class StreamHost(Protocol):
    """What the streaming interfaces use of the wasi:nn front end (``imports.WitNNImports``)."""

    limits: Limits

    def state(self, store: Any) -> ComponentState:
        """The resource tables of the calling Store."""

    def own(self, kind: str, rep: int) -> cm.ResourceHost:
        """An owned handle of a host resource for the guest."""

    def resource(self, instance: cm.LinkerInstance, kind: str) -> None:
        """Define a host resource on a linker instance."""

    def result(self, name: str, impl: Callable[..., Any], tagged: bool = True) -> Callable[..., Any]:
        """Wrap a ``result<T, error>`` function."""

    def graph_rep(self, state: ComponentState, name: str) -> int:
        """The rep of a graph loaded by name."""

    def take_inputs(self, state: ComponentState, inputs: list[tuple[str, int]]) -> Any:
        """The named input tensors, taken from the Store's table."""

    def ready_pollable(self, store: Any, state: ComponentState) -> Any:
        """A ready ``wasi:io/poll`` pollable."""


class HayrideStreams:
    """The three interfaces, on the state tables and backend of a :class:`StreamHost`."""

    def __init__(self, imports: StreamHost) -> None:
        self.imports = imports

    def add_to(self, root: cm.LinkerInstance, add: AddFunc) -> None:
        """Define every version's interfaces under ``root``; ``add`` defines one function."""
        imports = self.imports
        compute = imports.result("compute", self.compute, tagged=False)
        init = imports.result("init-execution-context-stream", self.init_execution_context)
        load = imports.result("load-by-name", self.load_by_name)
        for version in VERSIONS:
            with root.add_instance(f"hayride:ai/tensor-stream@{version}") as tensor_stream:
                imports.resource(tensor_stream, TENSOR_STREAM)
                add(tensor_stream, "[constructor]tensor-stream", self.tensor_stream_new)
                add(tensor_stream, "[method]tensor-stream.dimensions", self.dimensions)
                add(tensor_stream, "[method]tensor-stream.ty", self.ty)
                add(tensor_stream, "[method]tensor-stream.read", self.read)
                add(tensor_stream, "[method]tensor-stream.subscribe", self.subscribe)
            with root.add_instance(f"hayride:ai/inference-stream@{version}") as inference:
                imports.resource(inference, CONTEXT_STREAM)
                add(inference, "[method]graph-execution-context-stream.compute", compute)
            with root.add_instance(f"hayride:ai/graph-stream@{version}") as graph:
                imports.resource(graph, GRAPH_STREAM)
                add(graph, "[method]graph-stream.init-execution-context-stream", init)
                add(graph, "load-by-name", load)

    # -- graph-stream and inference-stream -------------------------------------------

    def load_by_name(self, state: ComponentState, name: str) -> cm.ResourceHost:
        """``load-by-name(name)``: as ``wasi:nn``'s, as a ``graph-stream``."""
        return self.imports.own(GRAPH_STREAM, self.imports.graph_rep(state, name))

    def init_execution_context(self, state: ComponentState, graph: int) -> cm.ResourceHost:
        """``[method]graph-stream.init-execution-context-stream()``: a new conversation on the graph."""
        return self.imports.own(CONTEXT_STREAM, state.add_context(state.graph(graph)))

    def compute(self, state: ComponentState, context_rep: int, inputs: list[tuple[str, int]]) -> tuple[str, Any]:
        """``compute(inputs)``: set the prompt (and config) and return the stream of the answer."""
        request = read_request(self.imports.take_inputs(state, inputs), self.imports.limits)
        context = state.context(context_rep)
        context.end_stream()  # a new compute starts a new answer: the context's older streams end here
        for older in state.streams.values():
            if older.context == context_rep:
                older.context = None
        if request.config is not None:
            context.configure(request.config)
        context.set_prompt(request.prompt)
        n_predict = int(request.config.stopping.get("n_predict", -1)) if request.config is not None else -1
        stream = TensorStream((1,), "U8", context=context_rep, left=n_predict if n_predict >= 0 else -1)
        name = HAYRIDE_OUTPUT if request.hayride else OUTPUT  # as wasi:nn compute names its output
        return name, self.imports.own(TENSOR_STREAM, state.add_stream(stream))

    # -- tensor-stream ---------------------------------------------------------------

    def tensor_stream_new(self, store: Any, dimensions: list[int], ty: str, data: bytes) -> cm.ResourceHost:
        """``[constructor]tensor-stream(dimensions, ty, data)``: a stream that reads back ``data``."""
        stream = TensorStream(tuple(dimensions), ty, bytearray(data))
        return self.imports.own(TENSOR_STREAM, self.imports.state(store).add_stream(stream))

    def dimensions(self, store: Any, handle: cm.ResourceAny) -> list[int]:
        """``[method]tensor-stream.dimensions()``."""
        return list(self._stream(store, handle)[1].dimensions)

    def ty(self, store: Any, handle: cm.ResourceAny) -> str:
        """``[method]tensor-stream.ty()``."""
        return self._stream(store, handle)[1].ty

    def subscribe(self, store: Any, handle: cm.ResourceAny) -> Any:
        """``[method]tensor-stream.subscribe()``: a pollable that is ready at once (``read`` waits)."""
        state, _ = self._stream(store, handle)
        return self.imports.ready_pollable(store, state)

    def read(self, store: Any, handle: cm.ResourceAny, length: int) -> Any:
        """``[method]tensor-stream.read(len)``: up to ``len`` bytes, generated as needed; ``closed`` at the end."""
        state, stream = self._stream(store, handle)
        while not stream.pending and not stream.done:
            self._step(state, stream)
        if not stream.pending:
            return CLOSED
        chunk = bytes(stream.pending[:length])
        del stream.pending[:length]
        return chunk

    def _stream(self, store: Any, handle: cm.ResourceAny) -> tuple[ComponentState, TensorStream]:
        state = self.imports.state(store)
        return state, state.stream(int(handle.to_host(store).rep))

    @staticmethod
    def _step(state: ComponentState, stream: TensorStream) -> None:
        """One token into ``stream.pending``, or the end of the stream."""
        assert stream.context is not None
        try:
            context = state.context(stream.context)
            if stream.left != 0 and context.stream_step().stop_reason is StopReason.TOKEN:
                stream.pending += context.last_piece
                stream.left -= 1 if stream.left > 0 else 0
                return
            context.end_stream()
        except WasiNNError as err:
            log.warning("hayride:ai tensor-stream read: %s; the stream is closed", err.message)
        stream.context = None
