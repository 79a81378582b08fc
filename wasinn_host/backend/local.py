"""The local backend: this process's model registry and scheduler behind the backend protocol.

It also wires the core to its one real runtime: a :class:`ModelRegistry` made without one gets
llama.cpp's (:mod:`wasinn_host.llama`), imported when the first such registry is made.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..core.config.keys import ParsedConfig
from ..core.config.limits import Limits
from ..core.inference import Graph, InferenceContext, open_graph
from ..core.prompt_cache.cache import PromptCache
from ..core.registry import ModelRegistry, default_registry
from ..core.runtime import Runtime
from .status import model_status


def llama_runtime() -> Runtime:
    """The llama.cpp runtime (llama.cpp is imported here, on the first registry made without a runtime)."""
    from ..llama.runtime import LlamaRuntime

    return LlamaRuntime()


ModelRegistry.default_runtime = llama_runtime


class LocalGraph:
    """A :class:`~wasinn_host.core.inference.Graph` as the backend protocol hands it out."""

    def __init__(self, graph: Graph, registry: ModelRegistry, limits: Limits) -> None:
        self.graph = graph
        self.name = graph.name
        self._registry = registry
        self._limits = limits

    @property
    def stale(self) -> bool:
        """Replaced by a hot swap."""
        return self.graph.stale

    def open_context(self) -> InferenceContext:
        """A new conversation on this graph's model."""
        return InferenceContext(self.graph, self._registry, self._limits)

    def close(self) -> None:
        """Drop the graph's model reference; contexts on it fail from now on, as in WasmEdge."""
        if not self.graph.unloaded:
            self.graph.unloaded = True
            self._registry.release(self.graph.model)


class LocalBackend:
    """Models served in this process: ``registry`` (default: the process-wide one) under ``limits``;
    ``prompt_cache`` (a directory or a :class:`PromptCache`) keeps prompt prefixes on disk for warm
    starts across processes (given to the registry, for the models it loads from then on)."""

    def __init__(
        self,
        registry: ModelRegistry | None = None,
        limits: Limits | None = None,
        prompt_cache: str | os.PathLike[str] | PromptCache | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry()
        self.limits = limits or Limits()
        if prompt_cache is not None:
            self.use_prompt_cache(prompt_cache)

    def use_prompt_cache(self, cache: str | os.PathLike[str] | PromptCache) -> PromptCache:
        """Keep prompt prefixes in ``cache`` (a directory, bounded to the default size, or a
        :class:`PromptCache`) for the models the registry loads from now on."""
        self.registry.prompt_cache = cache if isinstance(cache, PromptCache) else PromptCache(cache)
        return self.registry.prompt_cache

    def load_by_name(self, name: str, config: ParsedConfig) -> LocalGraph:
        """The preloaded model ``name`` (loaded on first use, then shared)."""
        acquire = functools.partial(self.registry.acquire_named, name, kv_budget=self.limits.max_kv_bytes)
        return self._graph(open_graph(self.registry, acquire, config, name))

    def load_bytes(self, data: bytes, config: ParsedConfig) -> LocalGraph:
        """A model from GGUF bytes (checked in a child process first)."""
        acquire = functools.partial(self.registry.acquire_bytes, data, kv_budget=self.limits.max_kv_bytes)
        return self._graph(open_graph(self.registry, acquire, config, None))

    def _graph(self, graph: Graph) -> LocalGraph:
        return LocalGraph(graph, self.registry, self.limits)

    def has_name(self, name: str) -> bool:
        """Whether ``name`` is preloaded."""
        return self.registry.has_preload(name)

    def swap_model(self, name: str, path: str | os.PathLike[str] | None = None) -> None:
        """Hot swap: new loads of ``name`` get the model at ``path`` (or its file re-read)."""
        self.registry.swap(name, path)

    def status(self) -> dict[str, Any]:
        """Queue, memory, performance and model sections of the status."""
        status = model_status(self.registry, self.limits)
        if self.registry.prompt_cache is not None:
            status["prompt_cache"] = self.registry.prompt_cache.status()
        return status

    def close(self) -> None:
        """Free every model of the registry."""
        self.registry.close()
