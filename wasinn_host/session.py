"""Inference from Python without a guest: the same graphs, contexts and worker guests use.

>>> with WasiNN(preload=["default:GGML:AUTO:model.gguf"]).session("default", {"n-predict": 16}) as s:
...     print(s.complete("Once upon a time"))
...     for piece in s.stream("Tell me more"):
...         sys.stdout.buffer.write(piece)
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Mapping

import orjson

from .config import EMPTY_CONFIG, parse_config
from .errors import Errno, WasiNNError
from .execution import ExecutionContext, open_graph
from .registry import ModelRegistry


def _config_bytes(config: Mapping[str, Any] | str | bytes | None) -> bytes:
    if config is None:
        return b""
    if isinstance(config, (str, bytes)):
        return config.encode() if isinstance(config, str) else config
    return orjson.dumps(dict(config))


class Session:
    """One execution context on a preloaded model name."""

    def __init__(self, registry: ModelRegistry, name: str,
                 config: Mapping[str, Any] | str | bytes | None = None) -> None:
        text = _config_bytes(config)
        parsed = parse_config(text) if text else EMPTY_CONFIG
        self._registry = registry
        self._graph = open_graph(registry, functools.partial(registry.acquire_named, name), parsed, name)
        try:
            self._context = ExecutionContext(self._graph, registry)
        finally:
            registry.release(self._graph.model)  # the context holds its own reference

    def configure(self, config: Mapping[str, Any] | str | bytes) -> None:
        """Change this session's sampling and stop rules (like a metadata ``set_input``)."""
        self._context.set_input(1, _config_bytes(config))

    def complete(self, prompt: str | bytes) -> str:
        """Generate the whole answer (the end-of-generation piece included, as guests see it)."""
        self._context.set_input(0, prompt.encode() if isinstance(prompt, str) else prompt)
        errno = self._context.compute()
        if errno not in (Errno.SUCCESS, Errno.CONTEXT_FULL):
            raise WasiNNError(errno, "compute failed")
        return self._context.get_output(0).decode("utf-8", "replace")

    def stream(self, prompt: str | bytes, max_tokens: int | None = None) -> Iterator[bytes]:
        """Yield each generated token's bytes (a piece may end inside a UTF-8 character)."""
        self._context.set_input(0, prompt.encode() if isinstance(prompt, str) else prompt)
        produced = 0
        try:
            while max_tokens is None or produced < max_tokens:
                errno = self._context.compute_single()
                if errno == Errno.END_OF_SEQUENCE:
                    return
                if errno != Errno.SUCCESS:
                    raise WasiNNError(errno, "compute_single failed")
                produced += 1
                yield self._context.get_output_single(0)
        finally:
            self._context.fini_single()

    @property
    def metadata(self) -> dict[str, Any]:
        """The output metadata of the last computation (as ``get_output`` index 1)."""
        result: dict[str, Any] = orjson.loads(self._context.metadata_json())
        return result

    def close(self) -> None:
        """Free the execution context."""
        self._context.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
