"""One Store's component resources: tensors, graphs, execution contexts and errors.

A resource crosses the boundary as its ``rep``, a number this table gave it; the numbers are
per Store and never reused.  The guest dropping a resource calls :meth:`ComponentState.drop`;
the Store going away calls :meth:`ComponentState.close`, which frees whatever the guest kept.
An execution context of the older ``wasi:nn`` versions also holds the tensors ``set-input`` gave
it and the outputs of its last ``compute()``, freed with it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Iterable, Sequence, TypeVar

from ..backend.protocol import BackendContext, BackendGraph
from ..core.config.limits import Limits
from ..core.errors import ErrorKind, invalid
from ..guest.files import give_image_reader
from ..guest.scope import GuestScope
from ..guest.stdout import PieceSink, inherited_stdout
from ..guest.store_tables import ContextCounter
from .error_code import ErrorCode
from .tensors import HostTensor

T = TypeVar("T")

TENSOR = "tensor"
GRAPH = "graph"
CONTEXT = "graph-execution-context"
ERROR = "error"
GRAPH_STREAM = "graph-stream"
CONTEXT_STREAM = "graph-execution-context-stream"
TENSOR_STREAM = "tensor-stream"
"""Hayride's streaming resources (``hayride_streams.py``): its graphs and contexts live in the same
tables as ``wasi:nn``'s, its streams in their own."""


class ComponentState(GuestScope):
    """The resource tables of one Store, with the limits and model-name allow-list of its guest."""

    def __init__(
        self,
        limits: Limits,
        counter: ContextCounter,
        allowed: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
    ) -> None:
        super().__init__(limits, counter, allowed, dirs, stdout, "the component's stdout")
        self._lock = threading.Lock()
        self._next = 1
        self.tensors: dict[int, HostTensor] = {}
        self.graphs: dict[int, BackendGraph] = {}
        self.contexts: dict[int, BackendContext] = {}
        self.errors: dict[int, tuple[ErrorCode, str]] = {}
        self.set_inputs: dict[int, dict[str, HostTensor]] = {}
        """Per context, the tensors ``set-input`` gave it for its next ``compute()`` (08-19, 06-25)."""
        self.outputs: dict[int, dict[str, HostTensor]] = {}
        """Per context, the outputs of its last ``compute()``, for ``get-output`` (08-19, 06-25)."""
        self.streams: dict[int, Any] = {}
        """Hayride tensor-streams (``hayride_streams.TensorStream``)."""
        self.pollable_factory: dict[str, Any] = {}
        """This Store's instance of the ready-pollable factory (``ready_pollable.py``), once made."""
        self._context_graph: dict[int, BackendGraph] = {}
        """The graph each context was opened on: a graph the guest dropped is closed after its last context."""
        self._dropped_graphs: list[BackendGraph] = []
        self._touched: dict[int, float] = {}
        """When a guest call last named each context."""
        self.closed = False
        self.calls: Counter[str] = Counter()
        """How many times the guest called each function returning a result (load, load-by-name,
        init-execution-context, compute), by name (kept after :meth:`close`)."""

    def _add(self, table: dict[int, T], item: T) -> int:
        with self._lock:
            rep = self._next
            self._next += 1
            table[rep] = item
        return rep

    @staticmethod
    def _get(table: dict[int, T], rep: int, what: str) -> T:
        item = table.get(rep)
        if item is None:
            raise invalid(f"{what} {rep} does not exist in this store")
        return item

    def add_tensor(self, tensor: HostTensor) -> int:
        """A new tensor's rep."""
        return self._add(self.tensors, tensor)

    def tensor(self, rep: int) -> HostTensor:
        """The tensor behind ``rep``."""
        return self._get(self.tensors, rep, "tensor")

    def take_tensor(self, rep: int) -> HostTensor:
        """The tensor behind ``rep``, removed: the guest handed its ownership over."""
        tensor = self.tensor(rep)
        del self.tensors[rep]
        return tensor

    def add_graph(self, graph: BackendGraph) -> int:
        """A new graph's rep (refused beyond ``max_graphs_per_store``)."""
        if len(self.graphs) >= self.limits.max_graphs_per_store:
            graph.close()
            raise self.limits.refuse(ErrorKind.BUSY, "load", "max_graphs_per_store", self.limits.max_graphs_per_store)
        return self._add(self.graphs, graph)

    def graph(self, rep: int) -> BackendGraph:
        """The graph behind ``rep``."""
        return self._get(self.graphs, rep, "graph")

    def add_context(self, graph: BackendGraph) -> int:
        """A new execution context on ``graph`` (refused beyond the per-Store and process limits)."""
        self.limits.check_context_room("init-execution-context", len(self.contexts), self._counter.value)
        context = graph.open_context()
        give_image_reader(context, self.dirs)
        rep = self._add(self.contexts, context)
        self._context_graph[rep] = graph
        self._touched[rep] = time.monotonic()
        self._counter.add(1)
        return rep

    def context(self, rep: int) -> BackendContext:
        """The execution context behind ``rep`` (marked as just used)."""
        context = self._get(self.contexts, rep, "execution context")
        self._touched[rep] = time.monotonic()
        return context

    def set_input(self, context_rep: int, name: str, tensor: HostTensor) -> None:
        """Keep ``tensor`` as the input ``name`` of the context's next ``compute()``."""
        self.context(context_rep)
        self.set_inputs.setdefault(context_rep, {})[name] = tensor

    def take_set_inputs(self, context_rep: int) -> list[tuple[str, HostTensor]]:
        """The inputs set on the context since its last ``compute()``, removed, in the order first set;
        the outputs of that compute go too (a failed compute leaves none to get)."""
        self.outputs.pop(context_rep, None)
        return list(self.set_inputs.pop(context_rep, {}).items())

    def keep_outputs(self, context_rep: int, outputs: list[tuple[str, HostTensor]]) -> None:
        """The outputs of the context's ``compute()``, kept for ``get-output`` until the next one."""
        self.outputs[context_rep] = dict(outputs)

    def output(self, context_rep: int, name: str) -> HostTensor:
        """The output ``name`` of the context's last ``compute()``."""
        self.context(context_rep)
        outputs = self.outputs.get(context_rep)
        if outputs is None:
            raise invalid(f"no output {name!r}: this context has no compute() result (none ran, or the last failed)")
        if name not in outputs:
            raise invalid(f"no output named {name!r}; the last compute() gave: {', '.join(outputs)}")
        return outputs[name]

    def reap_idle(self, idle_seconds: float) -> int:
        """Free the contexts unused for ``idle_seconds`` (never one computing); return how many.

        The guest's handle stays valid as a handle; using it is then an invalid argument, as a reaped
        context is for a core module."""
        now = time.monotonic()
        stale = [
            rep
            for rep, context in list(self.contexts.items())
            if not context.busy and now - max(self._touched.get(rep, 0.0), context.last_used) > idle_seconds
        ]
        for rep in stale:
            self.drop(CONTEXT, rep)
        return len(stale)

    def add_stream(self, stream: Any) -> int:
        """A new tensor-stream's rep."""
        return self._add(self.streams, stream)

    def stream(self, rep: int) -> Any:
        """The tensor-stream behind ``rep``."""
        return self._get(self.streams, rep, "tensor-stream")

    def add_error(self, code: ErrorCode, data: str) -> int:
        """A new error resource's rep."""
        return self._add(self.errors, (code, data))

    def error(self, rep: int) -> tuple[ErrorCode, str]:
        """The code and message of the error behind ``rep``."""
        return self._get(self.errors, rep, "error")

    def drop(self, kind: str, rep: int) -> None:
        """The guest dropped its handle: free what is behind it."""
        if kind == TENSOR:
            self.tensors.pop(rep, None)
        elif kind == ERROR:
            self.errors.pop(rep, None)
        elif kind == TENSOR_STREAM:
            self.streams.pop(rep, None)
        elif kind in (GRAPH, GRAPH_STREAM):
            graph = self.graphs.pop(rep, None)
            if graph is not None:
                self._dropped_graphs.append(graph)
                self._close_unused_graphs()
        elif kind in (CONTEXT, CONTEXT_STREAM):
            context = self.contexts.pop(rep, None)
            self._context_graph.pop(rep, None)
            self.set_inputs.pop(rep, None)
            self.outputs.pop(rep, None)
            self._touched.pop(rep, None)
            if context is not None:
                self._counter.add(-1)
                context.close()
                self._close_unused_graphs()

    def _close_unused_graphs(self) -> None:
        """Close the graphs the guest dropped once no context of theirs is left (a context outlives its
        graph handle, as resources are independent in the component model)."""
        in_use = {id(g) for g in self._context_graph.values()}
        keep = []
        for graph in self._dropped_graphs:
            if id(graph) in in_use:
                keep.append(graph)
            else:
                graph.close()
        self._dropped_graphs = keep

    def live(self) -> dict[str, int]:
        """How many resources of each kind this Store holds now."""
        return {
            TENSOR: len(self.tensors),
            GRAPH: len(self.graphs),
            CONTEXT: len(self.contexts),
            ERROR: len(self.errors),
            TENSOR_STREAM: len(self.streams),
        }

    def close(self) -> None:
        """Free every resource of this Store (its contexts first)."""
        if self.closed:
            return
        self.closed = True
        self.stdout.close()
        for rep in list(self.contexts):
            self.drop(CONTEXT, rep)
        for rep in list(self.graphs):
            self.drop(GRAPH, rep)
        self.tensors.clear()
        self.errors.clear()
        self.streams.clear()
        self.pollable_factory.clear()
