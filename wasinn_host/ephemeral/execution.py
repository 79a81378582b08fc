"""An execution context as a ``wasi_ephemeral_nn`` guest sees it, over a backend context.

WasmEdge's rules live here: tensor index 1 is the metadata JSON (in and out), any other
index the prompt or the text; ``compute`` keeps the output of a full context and reports
it (context full); ``compute_single`` generates one token, ending with end-of-sequence
or a full context; ``get_output_single`` is the last token's piece; ``fini_single`` ends a
stream; an embedding model's output is WasmEdge's embedding JSON.
"""

from __future__ import annotations

import time
from typing import Callable

from ..backend.protocol import BackendContext, BackendGraph
from ..core.config import ParsedConfig, parse_config
from ..core.errors import ErrorKind, WasiNNError
from ..core.generation import GenerationResult, StopReason
from ..guest.metadata import embedding_json, metadata_json

METADATA_INDEX = 1
_NO_METADATA: tuple[int, bytes] = (-1, b"")


class ExecutionContext:
    """One guest execution context: WasmEdge's indices and streaming calls over a backend context."""

    def __init__(
        self, graph: BackendGraph, inner: BackendContext, stdout: Callable[[bytes], None] | None = None
    ) -> None:
        self.graph = graph
        self.inner = inner
        self.stdout = stdout
        """Where ``stream-stdout`` pieces go: the guest's stdout."""
        self._metadata = _NO_METADATA
        self.touched = time.monotonic()
        """When a guest call last named this context."""

    @property
    def busy(self) -> bool:
        """A computation is in flight."""
        return self.inner.busy

    @property
    def last_used(self) -> float:
        """``time.monotonic()`` of the last call naming this context or the end of its last computation."""
        return max(self.touched, self.inner.last_used)

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
        """Abort a computation in flight."""
        self.inner.cancel()

    def close(self) -> None:
        """Free the backend context."""
        self.inner.close()


def _raise_for_stop(result: GenerationResult) -> None:
    if result.stop_reason is StopReason.CONTEXT_FULL:
        raise WasiNNError(ErrorKind.CONTEXT_FULL, "the context is full (ctx-size reached); the output so far is kept")
