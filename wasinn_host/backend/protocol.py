"""The protocol between the front ends and whatever serves the models.

A front end (the ``wasi_ephemeral_nn`` imports, the Python :class:`~wasinn_host.Session`,
the component model later) only ever talks to a :class:`Backend`, the
:class:`BackendGraph` objects it loads and the :class:`BackendContext` objects they open.
:class:`~wasinn_host.backend.local.LocalBackend` serves them from this process's registry
and engine; :func:`~wasinn_host.backend.fake.fake_backend` does the same with a pure-Python
model for fast tests; :class:`~wasinn_host.rpc.client.RemoteBackend` implements the same
three protocols over gRPC, so a guest cannot tell where its model runs.  Every method raises
:class:`~wasinn_host.core.errors.WasiNNError` with a neutral kind on failure.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..core.config.keys import ParsedConfig
from ..core.generation import GenerationResult


class BackendContext(Protocol):
    """One conversation: configure, set a prompt, generate (whole or step by step), read usage."""

    busy: bool
    last_used: float
    revision: int
    """Changes whenever the output or :meth:`metadata` may have changed."""

    @property
    def output(self) -> bytearray:
        """The text generated so far (of the last computation or the stream in progress)."""

    @property
    def last_piece(self) -> bytes:
        """The bytes of the last token generated."""

    @property
    def embedding(self) -> list[float] | None:
        """The embedding of the last computation on an embedding model."""

    def configure(self, config: ParsedConfig) -> None:
        """Apply per-context keys (sampling, stop rules, prompt options)."""

    def set_prompt(self, data: bytes) -> None:
        """Set the prompt (text, or JSON messages with ``chat-template``)."""

    def generate(
        self, on_piece: Callable[[bytes], None] | None = None, stdout: Callable[[bytes], None] | None = None
    ) -> GenerationResult:
        """Generate the whole answer; its stop reason says why it ended.  ``on_piece`` receives each
        token's bytes as it comes; without it, the context's ``stream-stdout`` sends them to ``stdout``,
        the caller's stdout (nowhere without one: a backend never prints on its own)."""

    def stream_step(self) -> GenerationResult:
        """Generate one token; the stop reason is ``TOKEN`` while the stream goes on."""

    def end_stream(self) -> None:
        """End a stream and clear its output."""

    def ready_pieces(self, limit: int) -> list[bytes]:
        """The ``last_piece`` of up to ``limit`` next :meth:`stream_step` calls whose tokens are already
        made, without taking them (none where the backend cannot tell)."""

    def metadata(self) -> dict[str, Any]:
        """Usage of the last computation (token counts, timings, stop reason ...)."""

    def cancel(self) -> None:
        """Abort a computation in flight."""

    def close(self) -> None:
        """Free the context (idempotent)."""


class BackendGraph(Protocol):
    """A loaded model as one caller holds it."""

    name: str | None

    @property
    def stale(self) -> bool:
        """True once a hot swap replaced the model: a new load by name gets the new one."""

    def open_context(self) -> BackendContext:
        """A new conversation on this graph."""

    def close(self) -> None:
        """Let go of the graph (contexts already open keep working)."""


class Backend(Protocol):
    """Loads graphs and reports status."""

    def load_by_name(self, name: str, config: ParsedConfig) -> BackendGraph:
        """The model preloaded as ``name``, with ``config``'s load-time and default keys."""

    def load_bytes(self, data: bytes, config: ParsedConfig) -> BackendGraph:
        """A model from GGUF bytes the caller sent."""

    def status(self) -> dict[str, Any]:
        """Queue, memory, performance and model information (JSON-ready)."""

    def close(self) -> None:
        """Free everything this backend holds."""
