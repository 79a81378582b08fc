"""Graphs and execution contexts as a guest sees them, in WasmEdge's GGML semantics.

A :class:`Graph` is a guest's handle on a :class:`~wasinn_host.registry.LoadedModel`
plus the default per-context parameters it was loaded with.  An
:class:`ExecutionContext` holds one conversation: its prompt, its parameters, its
output text and tokens, and the streaming state of ``compute_single``.  Generation
itself is a job for the model's worker (``engine.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import orjson

from .chat_prompt import render_chat_prompt
from .config import MODEL_KEY_NAMES, ContextParams, ModelParams, ParsedConfig, parse_config
from .embedding import normalize
from .limits import Limits
from .log_setup import apply_logging_keys
from .engine import Job, Sequence, print_piece
from .errors import Errno, WasiNNError, invalid
from .llama_backend import LLAMA_BUILD_NUMBER, LLAMA_COMMIT, check_sampling
from .registry import LoadedModel, ModelRegistry

log = logging.getLogger("wasinn_host")

METADATA_INDEX = 1
INT32_MAX = 2**31 - 1


@dataclass(eq=False)
class Graph:
    """A loaded graph handle's target."""

    model: LoadedModel
    defaults: ContextParams
    name: str | None
    unloaded: bool = False

    @classmethod
    def create(cls, model: LoadedModel, config: ParsedConfig, name: str | None) -> "Graph":
        """A graph with the config's per-context defaults (its grammar checked against the model)."""
        defaults = config.apply_context(ContextParams())
        check_sampling(model.llama, defaults.sampling)
        return cls(model, defaults, name)


def open_graph(registry: ModelRegistry, acquire: Callable[[ModelParams], LoadedModel],
               config: ParsedConfig, name: str | None) -> Graph:
    """Load (or share) the model for ``config``'s load-time keys and wrap it in a Graph.

    ``acquire`` is ``registry.acquire_named`` or ``acquire_bytes`` with its first argument bound;
    the model reference is dropped again if the config's per-context part is refused.
    """
    apply_logging_keys(config)  # before loading, so llama.cpp's load log is shown too
    model = acquire(config.apply_model(ModelParams()))
    try:
        return Graph.create(model, config, name)
    except BaseException:
        registry.release(model)
        raise


class ExecutionContext:
    """One execution context: prompt in, text out, with WasmEdge's observable behaviour."""

    def __init__(self, graph: Graph, registry: ModelRegistry, limits: Limits | None = None) -> None:
        self.graph = graph
        self.model = graph.model
        self._registry = registry
        self.limits = limits or Limits()
        registry.retain(self.model)
        self.busy = False
        self.last_used = time.monotonic()
        self.params = graph.defaults
        self.sequence = Sequence()
        self.prompt_tokens: list[int] | None = None
        self.output = bytearray()
        self.output_tokens: list[int] = []
        self.last_piece = b""
        self.started = False
        self.closed = False
        self.last_job: Job | None = None

    # -- set_input -----------------------------------------------------------------

    def set_input(self, index: int, data: bytes) -> None:
        """Index 1: metadata JSON; any other index: the prompt text."""
        self.started = False
        if index == METADATA_INDEX:
            self.apply_metadata(parse_config(data))
            return
        if self.params.options.chat_template is not False:
            data = render_chat_prompt(self.model.llama, self.params.options.chat_template, data)
        self.prompt_tokens = self.model.llama.tokenize(data, add_special=True, parse_special=True)

    def apply_metadata(self, config: ParsedConfig) -> None:
        """Per-context keys change this context; load-time keys are never applied here."""
        params = config.apply_context(self.params)
        if params.stopping.n_predict > self.limits.max_n_predict:
            raise self.limits.refuse(Errno.INVALID_ARGUMENT, f"n-predict {params.stopping.n_predict}",
                                     "max_n_predict", self.limits.max_n_predict)
        if params.sampling != self.params.sampling:
            check_sampling(self.model.llama, params.sampling)
        self.params = params
        apply_logging_keys(config)
        changed = [
            f"{MODEL_KEY_NAMES[k]}={v!r} (loaded with {getattr(self.model.params, k)!r})"
            for k, v in config.model.items() if getattr(self.model.params, k) != v
        ]
        if changed:
            log.warning(
                "model %s: load-time keys in set_input metadata are ignored, the model is not reloaded: %s; "
                "pass them to load_by_name_with_config instead",
                self.model.label, ", ".join(changed),
            )

    # -- compute -------------------------------------------------------------------

    def _checked_prompt(self) -> list[int]:
        if self.graph.unloaded:
            raise invalid("compute on a context whose graph was unloaded")
        if self.prompt_tokens is None:
            raise invalid("compute before set_input: no prompt has been set")
        limit = self.model.n_ctx_seq - 4
        if len(self.prompt_tokens) > limit:
            raise WasiNNError(
                Errno.PROMPT_TOO_LONG,
                f"prompt of {len(self.prompt_tokens)} tokens exceeds ctx-size {self.model.n_ctx_seq} - 4 = {limit}",
            )
        return self.prompt_tokens

    def compute(self) -> Errno:
        """Generate the whole answer (or the embedding); return 0, 101 (context full) or 5."""
        tokens = self._checked_prompt()
        self.started = False
        self._clear_output()
        if self.model.params.embedding:
            return self._compute_embedding(tokens)
        stop = self.params.stopping
        limit = stop.n_predict if stop.n_predict >= 0 else INT32_MAX
        job = self._job(list(tokens), limit=min(limit, self.limits.max_n_predict))
        job.on_piece = print_piece if stop.stream_stdout else None
        self._run(job)
        return job.errno

    def _job(self, tokens: list[int], limit: int, **kwargs: object) -> Job:
        options = self.params.options
        queue_timeout = options.queue_timeout_ms if options.queue_timeout_ms >= 0 else self.limits.queue_timeout_ms
        return Job(
            self.sequence, tokens, limit=limit, sampling=self.params.sampling, stopping=self.params.stopping,
            cache_prompt=options.cache_prompt, priority=options.priority, queue_timeout_ms=queue_timeout,
            ctx_shift=options.ctx_shift, n_keep=options.n_keep, max_output_bytes=self.limits.max_output_bytes,
            **kwargs,  # type: ignore[arg-type]
        )

    def _compute_embedding(self, tokens: list[int]) -> Errno:
        n_batch = self.model.worker.context.n_batch
        if len(tokens) > n_batch:
            raise WasiNNError(Errno.PROMPT_TOO_LONG,
                              f"embedding input of {len(tokens)} tokens exceeds batch-size {n_batch}")
        job = self._job(list(tokens), limit=0, embed=True)
        self._run(job)
        vector = normalize(job.embedding, self.params.options.embd_normalize)
        self.output = bytearray(
            f'{{"n_embedding": {len(vector)}, "embedding": [{",".join(format(v, ".10g") for v in vector)}]}}'.encode()
        )
        return job.errno

    def compute_single(self) -> Errno:
        """Generate one token; 100 at end of generation, 101 when the context is full."""
        prompt = self._checked_prompt()
        first = not self.started
        if first:
            self._clear_output()
            self.started = True
        job = self._job(prompt + self.output_tokens, limit=1, streaming=True, reset_sampler=first)
        self._run(job)
        if job.errno != Errno.SUCCESS:
            self.started = False
        return job.errno

    def fini_single(self) -> None:
        """End a stream: clear the output; the next ``compute_single`` starts from the prompt."""
        self.started = False
        self._clear_output()

    def _run(self, job: Job) -> None:
        self.busy = True
        try:
            self.model.worker.submit(job)
        finally:
            self.busy = False
            self.last_used = time.monotonic()
        self.last_job = job
        self.output += job.text
        self.output_tokens += job.generated
        if job.generated:
            self.last_piece = self.model.llama.piece(job.generated[-1])
        if job.errno in (Errno.RUNTIME_ERROR, Errno.BUSY, Errno.INVALID_ARGUMENT, Errno.TOO_LARGE):
            raise WasiNNError(job.errno, f"compute on model {self.model.label}: {job.stop_reason}")

    def _clear_output(self) -> None:
        self.output = bytearray()
        self.output_tokens = []
        self.last_piece = b""

    # -- get_output ----------------------------------------------------------------

    def get_output(self, index: int) -> bytes:
        """Index 1: the metadata JSON; otherwise the whole output text."""
        return self.metadata_json() if index == METADATA_INDEX else bytes(self.output)

    def get_output_single(self, index: int) -> bytes:
        """Index 1: the metadata JSON; otherwise the last token's piece."""
        return self.metadata_json() if index == METADATA_INDEX else self.last_piece

    def metadata_json(self) -> bytes:
        """WasmEdge's exact output metadata, then (after a compute) this host's additions.

        ``{"input_tokens": N, "output_tokens": M, "llama_build_number": B, "llama_commit": "C"``
        byte for byte as WasmEdge writes it, followed by ``"stop_reason"``, ``"prompt_ms"``,
        ``"generation_ms"``, ``"tokens_per_second"``, ``"reused_tokens"`` and, with ``n-probs``,
        ``"probs"``.
        """
        n_input = len(self.prompt_tokens) if self.prompt_tokens is not None else 0
        head = (
            f'{{"input_tokens": {n_input}, "output_tokens": {len(self.output_tokens)}, '
            f'"llama_build_number": {LLAMA_BUILD_NUMBER}, "llama_commit": {orjson.dumps(LLAMA_COMMIT).decode()}'
        )
        job = self.last_job
        if job is None:
            return (head + "}").encode()
        extra: dict[str, object] = {
            "stop_reason": job.stop_reason,
            "prompt_ms": round(job.prompt_ms, 3),
            "generation_ms": round(job.generation_ms, 3),
            "tokens_per_second": round(len(job.generated) / (job.generation_ms / 1000.0), 3)
            if job.generation_ms > 0 else 0.0,
            "reused_tokens": job.reused_tokens,
        }
        if job.probs:
            piece = self.model.llama.piece
            extra["probs"] = [
                {"id": token, "piece": piece(token).decode("utf-8", "replace"),
                 "top": [{"id": t, "piece": piece(t).decode("utf-8", "replace"), "p": round(p, 6)} for t, p in top]}
                for token, top in job.probs
            ]
        return (head + ", " + orjson.dumps(extra).decode()[1:]).encode()

    # -- lifetime ------------------------------------------------------------------

    def cancel(self) -> None:
        """Abort a computation in flight (it ends with errno 5)."""
        self.sequence.cancelled = True

    def close(self) -> None:
        """Free the sequence and drop the model reference (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.model.worker.release(self.sequence)
        self._registry.release(self.model)
