"""An execution context as a ``wasi_ephemeral_nn`` guest sees it, over a backend context.

WasmEdge's rules live here: tensor index 1 is the metadata JSON (in and out), any other
index the prompt or the text; ``compute`` keeps the output of a full context and reports
it (context full); ``compute_single`` generates one token, ending with end-of-sequence
or a full context; ``get_output_single`` is the last token's piece; ``fini_single`` ends a
stream; an embedding model's output is WasmEdge's embedding JSON.

A Store's least recently used idle contexts are spilled (:meth:`ExecutionContext.spill`): the backend
context goes to the process's spill store (:mod:`~wasinn_host.core.cold_store`) and comes back, the same,
the next time anything reads :attr:`ExecutionContext.inner`.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..backend.protocol import BackendContext, BackendGraph
from ..core.cold_store import COLD_STORE
from ..core.config.keys import ParsedConfig, parse_config
from ..core.errors import ErrorKind, WasiNNError, invalid
from ..core.generation import GenerationResult, StopReason
from ..guest.metadata import embedding_json, metadata_json

METADATA_INDEX = 1
_NO_METADATA: tuple[int, bytes] = (-1, b"")
_SPILLED = "spilled"
_SPILLED_CANCELLED = "spilled, then cancelled"
_FINALISED = "finalised while spilled"


class ExecutionContext:
    """One guest execution context: WasmEdge's indices and streaming calls over a backend context."""

    __slots__ = ("graph", "_inner", "stdout", "_metadata", "touched")

    def __init__(
        self, graph: BackendGraph, inner: BackendContext, stdout: Callable[[bytes], None] | None = None
    ) -> None:
        self.graph = graph
        self._inner: BackendContext | str = inner
        """The backend context, or a marker while it is in the spill store under ``id(self)``."""
        self.stdout = stdout
        """Where ``stream-stdout`` pieces go: the guest's stdout."""
        self._metadata = _NO_METADATA
        self.touched = time.monotonic()
        """When a guest call last named this context."""

    @property
    def inner(self) -> BackendContext:
        """The backend context (taken back from the spill store if it was spilled)."""
        inner = self._inner
        if isinstance(inner, str):
            with COLD_STORE.lock:
                inner = self._inner
                if inner is _FINALISED:
                    raise invalid("execution context was finalised")
                if isinstance(inner, str):
                    thawed: BackendContext = COLD_STORE.take(id(self))
                    self._inner = thawed
                    if inner is _SPILLED_CANCELLED:
                        thawed.cancel()
                    return thawed
        assert not isinstance(inner, str)
        return inner

    @property
    def spilled(self) -> bool:
        """The backend context is in the spill store now."""
        return isinstance(self._inner, str)

    def spill(self) -> bool:
        """Put the backend context into the spill store if it is idle enough (see its ``freeze``);
        whether it went.  Only the Store's own thread spills its contexts."""
        with COLD_STORE.lock:
            inner: Any = self._inner
            freeze = getattr(inner, "freeze", None)
            frozen = freeze() if freeze is not None else None
            if frozen is None or not COLD_STORE.put(id(self), frozen):
                return False
            self.touched = max(self.touched, inner.last_used)
            self._inner = _SPILLED
            self._metadata = _NO_METADATA
            return True

    @property
    def busy(self) -> bool:
        """A computation is in flight."""
        inner = self._inner
        return not isinstance(inner, str) and inner.busy

    @property
    def last_used(self) -> float:
        """``time.monotonic()`` of the last call naming this context or the end of its last computation."""
        inner = self._inner
        return self.touched if isinstance(inner, str) else max(self.touched, inner.last_used)

    def set_input(self, index: int, data: bytes) -> None:
        """Index 1: metadata JSON (per-context keys); any other index: the prompt."""
        if index == METADATA_INDEX:
            self.configure(parse_config(data))
        else:
            self.inner.set_prompt(data)

    def configure(self, config: ParsedConfig) -> None:
        """Apply per-context keys already parsed (and, from a remote client, screened)."""
        self.inner.configure(config)

    def compute(self, on_piece: Callable[[bytes], None] | None = None) -> None:
        """Generate the whole answer (each token's bytes to ``on_piece`` as it comes, if given, else with
        ``stream-stdout`` to the guest's stdout); a full context keeps the output and is reported."""
        _raise_for_stop(self.inner.generate(on_piece, self.stdout))

    def compute_single(self) -> None:
        """Generate one token; end-of-sequence and a full context are reported."""
        result = self.inner.stream_step()
        if result.stop_reason is StopReason.EOS:
            raise WasiNNError(ErrorKind.END_OF_SEQUENCE, "end of sequence")
        _raise_for_stop(result)

    def ready_pieces(self, limit: int) -> list[bytes]:
        """The pieces the next ``limit`` ``compute_single`` calls would give, for tokens already sampled
        (see :meth:`.InferenceContext.ready_pieces`)."""
        return self.inner.ready_pieces(limit)

    def fini_single(self) -> None:
        """End a stream: clear the output; the next ``compute_single`` starts from the prompt."""
        self.inner.end_stream()

    def get_output(self, index: int) -> bytes:
        """Index 1: the metadata JSON; otherwise the whole output (text, or the embedding JSON)."""
        if index == METADATA_INDEX:
            return self.metadata_json()
        if self.inner.embedding is not None:
            return embedding_json(self.inner.embedding)
        return bytes(self.inner.output)

    def get_output_single(self, index: int) -> bytes:
        """Index 1: the metadata JSON; otherwise the last token's piece."""
        return self.metadata_json() if index == METADATA_INDEX else self.inner.last_piece

    def metadata_json(self) -> bytes:
        """WasmEdge's metadata string plus this host's keys, built once per change of the context."""
        revision = self.inner.revision
        if self._metadata[0] != revision:
            self._metadata = (revision, metadata_json(self.inner.metadata()))
        return self._metadata[1]

    def forget_metadata(self) -> None:
        """Drop the cached metadata JSON (built again when asked): the Store's other contexts keep none."""
        self._metadata = _NO_METADATA

    def cancel(self) -> None:
        """Abort a computation in flight (a spilled context, which has none, is cancelled when taken back)."""
        with COLD_STORE.lock:
            if isinstance(self._inner, str):
                self._inner = _SPILLED_CANCELLED
                return
        self.inner.cancel()

    def close(self) -> None:
        """Free the backend context (a spilled one without taking it back)."""
        with COLD_STORE.lock:
            inner = self._inner
            if inner is _FINALISED:
                return
            if isinstance(inner, str):
                self._inner = _FINALISED
        if isinstance(inner, str):
            COLD_STORE.drop(id(self))
        else:
            inner.close()


def _raise_for_stop(result: GenerationResult) -> None:
    if result.stop_reason is StopReason.CONTEXT_FULL:
        raise WasiNNError(ErrorKind.CONTEXT_FULL, "the context is full (ctx-size reached); the output so far is kept")
