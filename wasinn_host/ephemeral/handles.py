"""Per-Store handle tables, with the limits and the model-name allow-list of one guest.

Graph and context handles are numbered from 0 in each Store and never reused, so
another guest's handle numbers mean nothing here.  A Store keeps its :data:`RESIDENT_CONTEXTS` most
recently named contexts in memory; the others are spilled (``ExecutionContext.spill``) and come back
when named again.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Any, Callable, Iterable, Sequence

from ..backend.protocol import Backend, BackendGraph
from ..core.config.keys import ParsedConfig
from ..core.config.limits import Limits
from ..core.errors import ErrorKind, invalid
from ..guest.files import give_image_reader, with_guest_projector
from ..guest.memory import U32_MASK
from ..guest.native_func import MemoryRef
from ..guest.scope import GuestScope
from ..guest.stdout import PieceSink, inherited_stdout
from ..guest.store_tables import ContextCounter
from .execution import ExecutionContext

RESIDENT_CONTEXTS = 1000
"""Execution contexts a Store keeps in memory; beyond them the least recently named idle ones are spilled."""
SPILL_TRIES = 4
"""Contexts one call may try to spill (those that cannot go yet, e.g. computing, are tried again later)."""


class HandleTables(GuestScope):
    """One Store's graphs and execution contexts (or one RPC session's), numbered as the ABI's handles."""

    def __init__(
        self,
        limits: Limits,
        counter: ContextCounter,
        allowed: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
    ) -> None:
        super().__init__(limits, counter, allowed, dirs, stdout, "the guest's stdout")
        self.graphs: dict[int, BackendGraph] = {}
        self.contexts: dict[int, ExecutionContext] = {}
        self.by_name: dict[str, int] = {}
        self.next_graph = 0
        self.next_context = 0
        self.memory: MemoryRef | None = None
        self.cache_memory = False
        self.closed = False
        self.calls: Counter[str] = Counter()
        """How many times the guest called each import, by name (kept after :meth:`close`)."""
        self._image_reader: Callable[[str], bytes] | None = None
        self._guest_files: Any = None
        """The ``read_image`` every context of this Store shares (one per Store, not one per context)."""
        self._current: ExecutionContext | None = None
        """The context the guest named last: the only one that keeps its metadata JSON cached."""
        self.resident_contexts = RESIDENT_CONTEXTS
        self._resident: OrderedDict[int, None] = OrderedDict()
        """Handles of the contexts not spilled (as far as this Store knows), least recently named first."""
        self._last_named = -1
        """The handle last in ``_resident`` when it was last named (-1: none): named again, nothing moves
        (a streaming guest names its context twice a token)."""

    def graph(self, handle: int) -> BackendGraph:
        """The graph behind a guest's handle, or an invalid argument."""
        graph = self.graphs.get(handle & U32_MASK)
        if graph is None:
            raise invalid(f"graph handle {handle & U32_MASK} is not loaded in this store")
        return graph

    def context(self, handle: int) -> ExecutionContext:
        """The execution context behind a guest's handle (marked as just used), or an invalid argument."""
        context = self.contexts.get(handle & U32_MASK)
        if context is None:
            raise invalid(f"execution context handle {handle & U32_MASK} does not exist in this store")
        context.touched = time.monotonic()
        if context is not self._current:
            if self._current is not None:
                self._current.forget_metadata()
            self._current = context
        if handle & U32_MASK != self._last_named:  # (named again: it is the most recently named already)
            self._named(handle & U32_MASK)
        return context

    def _named(self, handle: int) -> None:
        """``handle`` is in use (it is taken back from the spill store if it was there): the most recently
        named; beyond ``resident_contexts`` the least recently named go to the spill store."""
        resident = self._resident
        try:
            resident.move_to_end(handle)
        except KeyError:
            resident[handle] = None
        tries = SPILL_TRIES
        last = True
        while len(resident) > self.resident_contexts and tries > 0:
            tries -= 1
            old, _ = resident.popitem(last=False)
            context = self.contexts.get(old)
            if context is not None and not context.spilled and not context.spill():
                resident[old] = None  # cannot go yet (computing, warm in its model's worker, images)
                last = False  # now after the handle named
        self._last_named = handle if last and handle in resident else -1

    def load_named(self, backend: Backend, name: str, config: ParsedConfig, reuse: bool = True) -> int:
        """The handle of ``name`` loaded with ``config``; with ``reuse``, the cached handle of an
        earlier load of ``name`` while it is current (WasmEdge's behaviour within one Store)."""
        self.check_name(name)
        cached = self.by_name.get(name) if reuse else None
        if cached is not None and not self.graphs[cached].stale:
            return cached
        self.check_graph_room()
        handle = self.add_graph(backend.load_by_name(name, with_guest_projector(config, self.dirs)))
        self.by_name[name] = handle
        return handle

    def open_context(self, graph_handle: int) -> int:
        """A new execution context on the graph behind ``graph_handle``; its handle."""
        graph = self.graph(graph_handle)
        self.check_context_room()
        inner = graph.open_context()
        local: Any = inner  # a local context reads its ``image`` key's file; a remote one has no reader
        if self._image_reader is not None and hasattr(local, "read_image"):
            local.read_image, local.guest_files = self._image_reader, self._guest_files
        elif give_image_reader(local, self.dirs):
            self._image_reader, self._guest_files = local.read_image, local.guest_files
        return self.add_context(ExecutionContext(graph, inner, self.stdout))

    def check_graph_room(self) -> None:
        """Refuse (busy) a new graph beyond ``max_graphs_per_store``."""
        if len(self.graphs) >= self.limits.max_graphs_per_store:
            raise self.limits.refuse(ErrorKind.BUSY, "load", "max_graphs_per_store", self.limits.max_graphs_per_store)

    def add_graph(self, graph: BackendGraph) -> int:
        """Give ``graph`` the next graph handle."""
        handle = self.next_graph
        self.next_graph += 1
        self.graphs[handle] = graph
        return handle

    def check_context_room(self) -> None:
        """Refuse (busy) a new context beyond ``max_contexts_per_store`` or ``max_contexts_total``."""
        self.limits.check_context_room("init_execution_context", len(self.contexts), self._counter.value)

    def add_context(self, context: ExecutionContext) -> int:
        """Give ``context`` the next context handle."""
        handle = self.next_context
        self.next_context += 1
        self.contexts[handle] = context
        self._counter.add(1)
        self._named(handle)
        return handle

    def finalize(self, handle: int) -> None:
        """Free the context behind ``handle``; an invalid argument if there is none."""
        context = self.contexts.pop(handle & U32_MASK, None)
        if context is None:
            raise invalid(f"execution context handle {handle & U32_MASK} does not exist in this store")
        if context is self._current:
            self._current = None
        if handle & U32_MASK == self._last_named:
            self._last_named = -1
        self._resident.pop(handle & U32_MASK, None)
        self._counter.add(-1)
        context.close()

    def unload(self, handle: int) -> None:
        """Forget the graph behind ``handle`` (its name's cache entry too) and let the backend go of it."""
        graph = self.graph(handle)
        del self.graphs[handle & U32_MASK]
        if graph.name is not None and self.by_name.get(graph.name) == handle & U32_MASK:
            del self.by_name[graph.name]
        graph.close()

    def reap_idle(self, idle_seconds: float) -> int:
        """Finalise contexts unused for ``idle_seconds`` (not during a call); return how many."""
        now = time.monotonic()
        stale = [h for h, c in list(self.contexts.items()) if not c.busy and now - c.last_used > idle_seconds]
        for handle in stale:
            try:
                self.finalize(handle)
            except Exception:  # finalised by the guest meanwhile
                continue
        return len(stale)

    def close(self) -> None:
        """Free every context and graph of this Store."""
        if self.closed:
            return
        self.closed = True
        self.stdout.close()
        for handle in list(self.contexts):
            self.finalize(handle)
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
        self.by_name.clear()
        self.memory = None
