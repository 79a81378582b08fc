"""Inference from Python without a guest, through the same backend protocol guests use.

>>> with WasiNN(preload=["default:GGML:AUTO:model.gguf"]).session("default", {"n-predict": 16}) as s:
...     print(s.complete("Once upon a time"))
...     for piece in s.stream("Tell me more"):
...         sys.stdout.buffer.write(piece)
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import orjson

from .backend.protocol import Backend
from .core.config.keys import EMPTY_CONFIG, ParsedConfig, parse_config
from .core.errors import ErrorKind, WasiNNError
from .core.generation import StopReason
from .guest.files import give_image_reader, with_guest_projector
from .guest.stdout import PieceSink, guarded, python_stdout


def _parsed(config: Mapping[str, Any] | str | bytes | None) -> ParsedConfig:
    if config is None:
        return EMPTY_CONFIG
    if isinstance(config, (str, bytes)):
        return parse_config(config)
    return parse_config(orjson.dumps(dict(config)))


class Session:
    """One execution context on a preloaded model name, on any backend (local or remote).

    ``dirs`` are (host directory, guest path) pairs, as a guest's ``--dir`` mappings: the ``image``
    config key names a file through them (over RPC too: the file travels inline); without them the
    key is refused.  ``stdout`` receives the pieces of a :meth:`complete` whose config has
    ``stream-stdout`` (default: ``sys.stdout`` as it is at the time).
    """

    def __init__(
        self,
        backend: Backend,
        name: str,
        config: Mapping[str, Any] | str | bytes | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = python_stdout,
    ) -> None:
        parsed = _parsed(config)
        self._stdout = guarded(stdout, "the session's stdout")
        self._n_predict: int = parsed.stopping.get("n_predict", -1)
        """The session's ``n-predict`` (-1: none), which bounds :meth:`stream` as it bounds :meth:`complete`."""
        self._graph = backend.load_by_name(name, with_guest_projector(parsed, dirs))
        try:
            self._context = self._graph.open_context()
        except BaseException:
            self._graph.close()
            raise
        if dirs and not give_image_reader(self._context, dirs):
            self.close()
            raise WasiNNError(ErrorKind.UNSUPPORTED, "this backend reads no image files (dirs=)")

    def configure(self, config: Mapping[str, Any] | str | bytes) -> None:
        """Change this session's sampling and stop rules (per-context keys)."""
        parsed = _parsed(config)
        self._context.configure(parsed)
        self._n_predict = parsed.stopping.get("n_predict", self._n_predict)

    def complete(self, prompt: str | bytes) -> str:
        """Generate the whole answer (the end-of-generation piece included, as guests see it)."""
        self._context.set_prompt(prompt.encode() if isinstance(prompt, str) else prompt)
        self._context.generate(stdout=self._stdout)
        return self._context.output.decode("utf-8", "replace")

    def embed(self, text: str | bytes) -> list[float]:
        """The embedding of ``text`` on a model loaded with ``embedding`` (normalised by ``embd-normalize``);
        on a reranker (``reranking``), the score of ``text`` as one sequence, in a list of one."""
        self._context.set_prompt(text.encode() if isinstance(text, str) else text)
        self._context.generate(stdout=self._stdout)
        return self._vector()

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """A reranker's score of each document for ``query`` (a model loaded with ``reranking``), in the
        documents' order: the guest's ``{"query": ..., "documents": [...]}`` prompt, from Python."""
        self._context.set_prompt(orjson.dumps({"query": query, "documents": list(documents)}))
        self._context.generate(stdout=self._stdout)
        return self._vector()

    def _vector(self) -> list[float]:
        vector = self._context.embedding
        if vector is None:  # a remote backend hands over the guest's embedding JSON
            output = bytes(self._context.output)
            vector = orjson.loads(output).get("embedding") if output.startswith(b"{") else None
        if vector is None:
            raise WasiNNError(ErrorKind.INVALID_ARGUMENT, "the model is not loaded with embedding or reranking")
        return [float(v) for v in vector]

    def stream(self, prompt: str | bytes, max_tokens: int | None = None) -> Iterator[bytes]:
        """Yield the generated text as it comes, in whole UTF-8 characters (a token that ends inside a
        character adds its bytes to the next piece), from at most the session's ``n-predict`` and
        ``max_tokens`` tokens."""
        self._context.set_prompt(prompt.encode() if isinstance(prompt, str) else prompt)
        limit = self._stream_limit(max_tokens)
        produced = 0
        try:
            while limit is None or produced < limit:
                result = self._context.stream_step()
                if result.stop_reason is StopReason.EOS:
                    return
                if result.stop_reason is StopReason.CONTEXT_FULL:
                    raise WasiNNError(ErrorKind.CONTEXT_FULL, "the context is full (ctx-size reached)")
                produced += 1
                if self._context.last_piece:  # empty while a UTF-8 character is incomplete
                    yield self._context.last_piece
        finally:
            self._context.end_stream()

    def _stream_limit(self, max_tokens: int | None) -> int | None:
        """The tokens a stream makes at most: the lower of ``max_tokens`` and ``n-predict`` (None: no limit)."""
        limits = [n for n in (max_tokens, self._n_predict if self._n_predict >= 0 else None) if n is not None]
        return min(limits) if limits else None

    @property
    def metadata(self) -> dict[str, Any]:
        """Usage of the last computation (token counts, timings, stop reason ...)."""
        return self._context.metadata()

    def close(self) -> None:
        """Free the execution context and the graph."""
        self._context.close()
        self._graph.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
