"""Graphs and inference contexts: the neutral objects every front end drives.

A :class:`Graph` is a handle on a :class:`~wasinn_host.core.registry.LoadedModel` plus the
default per-context parameters it was loaded with.  An :class:`InferenceContext` holds one
conversation: prompt bytes in (rendered with a chat template when asked, then tokenized),
a generation or one streaming step at a time through the model's worker, and out the text,
tokens, embedding, usage figures and stop reason.  Failures raise
:class:`~wasinn_host.core.errors.WasiNNError` with a neutral kind; how a front end shows
them (an errno, a WIT error, a gRPC status) is its own business.
"""

from __future__ import annotations

import copy
import logging
import marshal
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, NamedTuple, Sequence

from ..observability.log_setup import apply_logging_keys
from .cold_store import Frozen
from .config.keys import MODEL_KEY_NAMES, ParsedConfig, as_json
from .config.limits import Limits
from .config.params import POOLING_RANK, ContextParams, ModelParams
from .embedding import normalize
from .errors import ErrorKind, WasiNNError, invalid
from .generation import GenerationRequest, GenerationResult, StopReason, outlet_of
from .images import place_image, split_inline_images
from .registry import LoadedModel, ModelRegistry
from .rerank import parse_rerank_input
from .scheduling.ngram_drafts import draft_settings
from .scheduling.scheduler import ContextState
from .scheduling.stream_feed import LOOKAHEAD, Outlook, StreamFeed
from .tts.graph import FileAccess, save_speech, speak, tts_model_params, tts_prompt
from .utf8_pieces import PieceJoiner

log = logging.getLogger("wasinn_host")

INT32_MAX = 2**31 - 1
PROMPT_MARGIN = 4
"""Tokens a prompt must leave free in its sequence (WasmEdge's rule: ctx-size - 4)."""
SHARED_PARAMS = 64
"""Distinct per-context parameter sets a graph shares among its contexts (then it starts again)."""

GenerationSteps = Generator[GenerationRequest, GenerationResult, GenerationResult]
"""A computation as steps (:meth:`InferenceContext.generation`): yields requests, is sent their results."""


def run_steps(steps: GenerationSteps, submit: Callable[[GenerationRequest], GenerationResult]) -> GenerationResult:
    """Drive ``steps`` to its end, each request through ``submit`` (which waits for the result)."""
    try:
        request = next(steps)
        while True:
            request = steps.send(submit(request))
    except StopIteration as end:
        result: GenerationResult = end.value
        return result


@dataclass(eq=False)
class Graph:
    """A loaded model as one caller holds it, with its per-context defaults."""

    model: LoadedModel
    defaults: ContextParams
    name: str | None
    unloaded: bool = False
    _shared: dict[ContextParams, ContextParams] = field(default_factory=dict, repr=False)

    @property
    def stale(self) -> bool:
        """Replaced by a hot swap: a new load by name gets the new model."""
        return self.model.stale

    def shared(self, params: ContextParams) -> ContextParams:
        """``params``, or the equal parameters another context of this graph holds: contexts configured
        alike (LlamaEdge sends every context the same metadata) keep one copy between them."""
        if params == self.defaults:
            return self.defaults
        found = self._shared.get(params)
        if found is None:
            if len(self._shared) >= SHARED_PARAMS:
                self._shared.clear()
            self._shared[params] = found = params
        return found


def open_graph(
    registry: ModelRegistry, acquire: Callable[[ModelParams], LoadedModel], config: ParsedConfig, name: str | None
) -> Graph:
    """Load (or share) the model for ``config``'s load-time keys and wrap it in a Graph.

    ``acquire`` is ``registry.acquire_named`` or ``acquire_bytes`` with its other arguments
    bound; the model reference is dropped again if the config's per-context part is refused.
    """
    apply_logging_keys(config)  # before loading, so llama.cpp's load log is shown too
    model = acquire(tts_model_params(config.apply_model(ModelParams())))
    try:
        defaults = config.apply_context(ContextParams())
        model.weights.check_sampling(defaults.sampling)
        return Graph(model, defaults, name)
    except BaseException:
        registry.release(model)
        raise


class Usage(NamedTuple):
    """What the last computation's metadata reports (kept instead of its whole result)."""

    stop_reason: StopReason
    prompt_ms: float
    generation_ms: float
    reused_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    probs: list[tuple[int, list[tuple[int, float]]]]

    @classmethod
    def of(cls, result: GenerationResult) -> Usage:
        """The usage ``result`` reports."""
        return cls(
            result.stop_reason,
            result.prompt_ms,
            result.generation_ms,
            result.reused_tokens,
            result.drafted_tokens,
            result.accepted_tokens,
            result.probs,
        )


class InferenceContext:
    """One conversation on a graph's model: prompt in; text, tokens, embedding and usage out.

    Guests built for WasmEdge keep thousands of these idle, so an idle one is small: its tokens 4 bytes
    each, its output once, its usage as a small tuple, its parameters shared with the graph's other
    contexts configured alike, and, once its model's worker evicts it, no sampler and no sequence.
    A front end may go further and :meth:`freeze` an idle one into the spill store
    (:mod:`~wasinn_host.core.cold_store`): only its own state goes there, as bytes.
    """

    __slots__ = (
        "graph",
        "model",
        "_registry",
        "limits",
        "busy",
        "last_used",
        "params",
        "state",
        "prompt_tokens",
        "image_prompt",
        "rerank_prompts",
        "read_image",
        "guest_files",
        "output",
        "output_tokens",
        "last_piece",
        "_joiner",
        "_feed",
        "stream_listener",
        "stream_lookahead",
        "_embedding",
        "streaming",
        "closed",
        "last_usage",
        "last_generated",
        "revision",
    )

    def __init__(self, graph: Graph, registry: ModelRegistry, limits: Limits | None = None) -> None:
        self.graph = graph
        self.model = graph.model
        self._registry = registry
        self.limits = limits or Limits()
        registry.retain(self.model)
        self.busy = False
        self.last_used = time.monotonic()
        self.params = graph.defaults
        self.state = ContextState()
        self.prompt_tokens: array[int] | None = None
        """The prompt's tokens (4 bytes each: thousands of idle contexts hold their conversations compactly)."""
        self.image_prompt: Any = None
        """The ``vision.ImagePrompt`` of a prompt with images (keeps their libmtmd chunks alive)."""
        self.rerank_prompts: list[array[int]] | None = None
        """A reranker's (query, document) sequences of a ``/rerank`` prompt, one score each (``rerank.py``)."""
        self.read_image: Callable[[str], bytes] | None = None
        """Reads the ``image`` key's file; set by the front end (guests: through their preopened dirs)."""
        self.guest_files: FileAccess | None = None
        """Reads and writes a TTS graph's speaker and output files; set by the front end, as ``read_image``."""
        self.output = bytearray()
        self.output_tokens: array[int] = array("i")
        self.last_piece = b""
        """The last token's piece; in a stream, the bytes that step completes (whole UTF-8 characters)."""
        self._joiner: PieceJoiner | None = None
        """Holds back an unfinished UTF-8 character between streaming steps (made by a stream's first step)."""
        self._feed: StreamFeed | None = None
        """The tokens the stream's job sampled ahead of the guest (:mod:`.scheduling.stream_feed`)."""
        self.stream_listener: Callable[[], None] | None = None
        """Given to each stream feed (:attr:`.StreamFeed.listener`): a server pushing the stream wakes by it."""
        self.stream_lookahead = LOOKAHEAD
        """Each stream job's lookahead (:attr:`.StreamFeed.lookahead`): a server pushing the stream sets a
        longer one (:data:`~wasinn_host.rpc.stream_push.PUSH_LOOKAHEAD`)."""
        self._embedding: array[float] | None = None
        self.streaming = False
        self.closed = False
        self.last_usage: Usage | None = None
        """The last computation's usage (its text, tokens and embedding are the context's own fields)."""
        self.last_generated = 0
        """Tokens the last computation generated (a streaming step: one)."""
        self.revision = 0
        """Bumped on every change a caller can observe in :meth:`metadata` or the output."""

    # -- input ---------------------------------------------------------------------

    def configure(self, config: ParsedConfig) -> None:
        """Per-context keys change this context; load-time keys are never applied here."""
        params = config.apply_context(self.params)
        if params.stopping.n_predict > self.limits.max_n_predict:
            raise self.limits.refuse(
                ErrorKind.INVALID_ARGUMENT,
                f"n-predict {params.stopping.n_predict}",
                "max_n_predict",
                self.limits.max_n_predict,
            )
        if params.sampling != self.params.sampling:
            self.model.weights.check_sampling(params.sampling)
        self.params = self.graph.shared(params)
        self._end_feed()
        apply_logging_keys(config)
        self._warn_load_time_keys(config)

    def _warn_load_time_keys(self, config: ParsedConfig) -> None:
        changed = [
            f"{MODEL_KEY_NAMES[k]}={as_json(v)} (loaded with {_loaded_value(self.model, k)})"
            for k, v in config.model.items()
            if _effective(self.model, k) != v and not _same_projector(k, v, self.model)
        ]
        if changed:
            log.warning(
                "model %s: load-time keys in per-context metadata are ignored, the model is not reloaded: %s; "
                "pass them when loading the graph instead",
                self.model.label,
                ", ".join(changed),
            )

    def set_prompt(self, data: bytes) -> None:
        """The prompt text (or, with ``chat-template``, JSON messages); ends a stream in progress.

        On a model with a projector, inline ``<img src="data:...">`` images and the ``image`` key's
        file (read by the front end's ``read_image``) become image tokens (see ``vision.py``).
        """
        self._end_feed()
        self.rerank_prompts = None
        if self._is_reranker() and self._set_rerank_prompt(data):
            self.revision += 1
            return
        if self.params.options.chat_template is not False:
            from .chat_prompt import render_chat_prompt  # Jinja, for the contexts that ask for templating

            data = render_chat_prompt(self.model.weights, self.params.options.chat_template, data)
        if self.model.params.tts:  # an OuteTTS prompt (tts/graph.py)
            weights, label = self.model.weights, self.model.label
            self.image_prompt = None
            self.prompt_tokens = array("i", tts_prompt(weights, data, self.params.options, self.guest_files, label))
            self.revision += 1
            return
        vision = getattr(self.model.weights, "vision", None)
        image_key = self.params.options.image
        if vision is None:
            if image_key:
                raise invalid(
                    f"config key 'image' {image_key!r}: model {self.model.label} has no multimodal projector "
                    f"(the host configures one with the model's name)"
                )
            self.image_prompt = None
            self.prompt_tokens = array("i", self.model.weights.tokenize(data, add_special=True, parse_special=True))
        else:
            text, images = split_inline_images(data, vision.marker)
            if image_key:
                if self.read_image is None:
                    raise invalid(f"config key 'image' {image_key!r}: this front end cannot read files")
                text, images = place_image(text, images, self.read_image(image_key), vision.marker)
            prompt = vision.tokenize(text, images)
            if prompt.tokens and prompt.tokens[-1] < 0:
                raise invalid("prompt: an image must be followed by text (the model answers after the prompt's text)")
            self.image_prompt = prompt if prompt.spans else None
            self.prompt_tokens = array("i", prompt.tokens)
        self.revision += 1

    def _is_reranker(self) -> bool:
        params = self.model.params
        return params.embedding and params.pooling_type == POOLING_RANK

    def _set_rerank_prompt(self, data: bytes) -> bool:
        """Take a ``/rerank`` request's pairs as the prompt; False if ``data`` is not one."""
        request = parse_rerank_input(data)
        if request is None:
            return False
        rerank_tokens = getattr(self.model.weights, "rerank_tokens", None)
        if rerank_tokens is None:
            raise WasiNNError(ErrorKind.UNSUPPORTED, f"model {self.model.label}: this runtime cannot rerank")
        query, documents = request
        self.image_prompt = None
        self.rerank_prompts = [array("i", rerank_tokens(query, document)) for document in documents]
        self.prompt_tokens = array("i", [t for tokens in self.rerank_prompts for t in tokens])
        return True

    def _checked_prompt(self) -> array[int]:
        if self.graph.unloaded:
            raise invalid("compute on a context whose graph was unloaded")
        if self.prompt_tokens is None:
            raise invalid("compute before set_input: no prompt has been set")
        limit = self.model.n_ctx_seq - PROMPT_MARGIN
        if len(self.prompt_tokens) > limit:
            raise WasiNNError(
                ErrorKind.PROMPT_TOO_LONG,
                f"prompt of {len(self.prompt_tokens)} tokens exceeds ctx-size {self.model.n_ctx_seq} - "
                f"{PROMPT_MARGIN} = {limit}",
            )
        return self.prompt_tokens

    # -- generation ----------------------------------------------------------------

    def generate(
        self, on_piece: Callable[[bytes], None] | None = None, stdout: Callable[[bytes], None] | None = None
    ) -> GenerationResult:
        """The whole answer (or the embedding, for an embedding model).

        A failure raises, with the output produced so far kept; a stop (end of generation,
        ``n-predict``, a stop string, a full context ...) is the result's ``stop_reason``.
        ``on_piece`` receives each token's bytes as it is generated; without it, ``stream-stdout``
        sends them to ``stdout``, the caller's (the front end's sink for its guest's stdout).
        """
        return run_steps(
            self.generation(on_piece, stdout), lambda request: self.model.worker.submit(request, self.state)
        )

    def generation(
        self,
        on_piece: Callable[[bytes], None] | None = None,
        stdout: Callable[[bytes], None] | None = None,
        max_tokens: int | None = None,
    ) -> GenerationSteps:
        """:meth:`generate` as steps, for a caller that submits the requests itself: the generator yields
        each request for the model's worker and is sent its result; its return value is
        :meth:`generate`'s.  An asyncio caller awaits each result instead of a thread waiting for it
        (:mod:`wasinn_host.aio`).  ``max_tokens`` caps the tokens generated below ``n-predict``."""
        if self.rerank_prompts is not None:
            return (yield from self._generate_scores(self.rerank_prompts))
        tokens = self._checked_prompt()
        self._end_feed()
        self._clear_output()
        if self.model.params.embedding:
            return (yield from self._generate_embedding(tokens))
        stop = self.params.stopping
        limit = stop.n_predict if stop.n_predict >= 0 else INT32_MAX
        if max_tokens is not None:
            limit = min(limit, max(max_tokens, 0))
        sink = on_piece or (stdout if stop.stream_stdout else None)
        outlet = outlet_of(sink)
        try:
            result = yield from self._run(
                self._request(
                    tokens,
                    limit=min(limit, self.limits.max_n_predict),
                    on_piece=sink,
                    piece_room=outlet.has_room if outlet is not None else None,
                )
            )
        finally:
            if outlet is not None:
                outlet.flush()  # the pieces land before whatever the caller writes next
        if self.model.params.tts:
            self._speak()
        return result

    def _speak(self) -> None:
        """A TTS graph's generation to speech: the WAV replaces the output, the audio codes its tokens; the
        file is written last (a failure to write it keeps the WAV in the output, as WasmEdge does)."""
        wav, codes = speak(self.model.weights, self.output_tokens, self.model.label)
        self.output = bytearray(wav)
        self.output_tokens = array("i", codes)
        self.revision += 1
        save_speech(wav, self.params.options, self.guest_files)

    def _generate_embedding(self, tokens: Sequence[int]) -> GenerationSteps:
        n_batch = self.model.worker.context.n_batch
        if len(tokens) > n_batch:
            raise WasiNNError(
                ErrorKind.PROMPT_TOO_LONG, f"embedding input of {len(tokens)} tokens exceeds batch-size {n_batch}"
            )
        return (yield from self._run(self._request(tokens, limit=0, embed=True)))

    def _generate_scores(self, prompts: list[array[int]]) -> GenerationSteps:
        """A reranker's score of each (query, document) sequence, one after the other; ``embedding`` holds them."""
        if self.graph.unloaded:
            raise invalid("compute on a context whose graph was unloaded")
        limit = min(self.model.worker.context.n_batch, self.model.n_ctx_seq - PROMPT_MARGIN)
        for i, tokens in enumerate(prompts):
            if len(tokens) > limit:
                raise WasiNNError(
                    ErrorKind.PROMPT_TOO_LONG,
                    f"rerank document {i}: {len(tokens)} tokens with the query exceed the limit of {limit} "
                    f"(batch-size, and ctx-size - {PROMPT_MARGIN})",
                )
        self._end_feed()
        self._clear_output()
        scores: list[float] = []
        prompt_ms = 0.0
        result = GenerationResult()
        for tokens in prompts:
            result = yield from self._run(self._request(tokens, limit=0, embed=True))
            scores.append(result.embedding[0] if result.embedding else float("nan"))
            prompt_ms += result.prompt_ms
        self.embedding = scores
        if self.last_usage is not None:
            self.last_usage = self.last_usage._replace(prompt_ms=prompt_ms)
        return result

    def stream_step(self) -> GenerationResult:
        """Generate one token (the first step starts a stream and clears the output).

        The token comes from the stream's feed (:mod:`.scheduling.stream_feed`): its job samples ahead of the
        guest, so a step waits only for a token not made yet.  ``last_piece`` is then what the step adds
        to the stream in whole UTF-8 characters: a token that ends inside a character gives the bytes
        before it, the token completing it the whole character.  The stream ends by itself when the
        step's stop reason is not ``TOKEN`` (end of generation or a full context).
        """
        first = self._begin_stream()
        feed = self._feed
        self.busy = True  # waiting for a token is computing (the idle reaper leaves the context alone)
        try:
            result = feed.take() if feed is not None else None
            if result is None and (feed is None or feed.final is None or feed.final.error is None):
                feed = self._start_job(first)
                result = feed.take()
        finally:
            self.busy = False
        if result is None:  # the job ended without a token: its error
            assert feed is not None and feed.final is not None
            result = feed.final
            if result.error is None:
                result.error = WasiNNError(ErrorKind.RUNTIME_ERROR, f"compute on model {self.model.label}: no token")
        try:
            self._take_result(result)
        except WasiNNError:
            self.streaming = False
            self._feed = None
            raise
        ended = result.stop_reason is not StopReason.TOKEN
        if self._joiner is None:
            self._joiner = PieceJoiner()
        self.last_piece = self._joiner.push(self.last_piece if self.last_generated else b"", last=ended)
        if ended:
            self.streaming = False
            self._feed = None
            self._joiner = None  # the last piece released whatever it held
        return result

    def _begin_stream(self) -> bool:
        """Check the prompt; at a stream's first step, end whatever went before and clear the output.
        Whether this is the first step."""
        self._checked_prompt()
        first = not self.streaming
        if first:
            self._end_feed()
            self._clear_output()
            self.streaming = True
        return first

    def _start_job(self, first: bool) -> StreamFeed:
        """Start the stream's next job from the tokens the guest has seen; its feed."""
        prompt = self._checked_prompt()
        request = self._request(prompt + self.output_tokens, limit=INT32_MAX, streaming=True, reset_sampler=first)
        self._feed = feed = StreamFeed(
            self.stream_lookahead, listener=self.stream_listener, interval=self.params.options.stream_interval
        )
        self.model.worker.start_stream(request, self.state, feed)
        return feed

    def open_stream(self) -> Outlook:
        """Make the stream's job sample ahead without taking a token: a stream's start (as its first
        :meth:`stream_step`), or the next job once the guest has taken every token of a paused one; then
        what follows the tokens sampled (a server pushing the stream's pieces asks, :mod:`.stream_push`)."""
        first = self._begin_stream()
        feed = self._feed
        if feed is not None:
            feed.listener = self.stream_listener
        if feed is None or (feed.backlog == 0 and feed.outlook() is Outlook.PAUSED):
            feed = self._start_job(first)
        return feed.outlook()

    def stream_outlook(self) -> Outlook:
        """What follows the tokens the stream's job has sampled (outside a stream: its end)."""
        feed = self._feed
        return feed.outlook() if self.streaming and feed is not None else Outlook.ENDS

    def ready_pieces(self, limit: int) -> list[bytes]:
        """What the next ``limit`` :meth:`stream_step` calls would put in ``last_piece``, for the tokens
        the stream's job has already sampled (fewer when it has not, none outside a stream), without
        taking them: a remote client answers those steps itself and reports them later."""
        feed = self._feed
        if not self.streaming or feed is None or limit <= 0:
            return []
        joiner = copy.copy(self._joiner) if self._joiner is not None else PieceJoiner()
        return [
            joiner.push(self.model.weights.piece(item.generated[-1]) if item.generated else b"")
            for item in feed.peek(limit)
        ]

    def end_stream(self) -> None:
        """End a stream: clear the output; the next step starts from the prompt."""
        self._end_feed()
        self._clear_output()

    def _end_feed(self) -> None:
        """End the stream in progress, if any: its job stops sampling ahead (see :meth:`.StreamFeed.end`)."""
        self.streaming = False
        feed, self._feed = self._feed, None
        if feed is not None and feed.running:
            feed.end()

    def _request(self, tokens: Sequence[int], limit: int, **kwargs: Any) -> GenerationRequest:
        options = self.params.options
        queue_timeout = options.queue_timeout_ms if options.queue_timeout_ms >= 0 else self.limits.queue_timeout_ms
        return GenerationRequest(
            tuple(tokens),
            limit=limit,
            sampling=self.params.sampling,
            stopping=self.params.stopping,
            cache_prompt=options.cache_prompt,
            cache_name=options.path_prompt_cache,
            priority=options.priority,
            queue_timeout_ms=queue_timeout,
            max_queue=self.limits.max_queue,
            ctx_shift=options.ctx_shift,
            n_keep=options.n_keep,
            max_output_bytes=self.limits.max_output_bytes,
            drafts=draft_settings(options),
            images=tuple(self.image_prompt.spans.values()) if self.image_prompt is not None else (),
            regenerate_images=options.always_regenerate_image_embd,
            **kwargs,
        )

    def _run(self, request: GenerationRequest) -> GenerationSteps:
        self.busy = True
        try:
            result = yield request
        finally:
            self.busy = False
        if request.embed and result.error is None:  # a reranker's scores are not normalised
            rank = self._is_reranker()
            self.embedding = (
                result.embedding if rank else normalize(result.embedding, self.params.options.embd_normalize)
            )
        self._take_result(result)
        return result

    def _take_result(self, result: GenerationResult) -> None:
        """Add what a computation (or one streamed token) produced to the output and usage; raise its error."""
        self.last_used = time.monotonic()
        self.output += result.text
        self.output_tokens.extend(result.generated)
        if result.generated:
            self.last_piece = self.model.weights.piece(result.generated[-1])
        self.last_generated = len(result.generated)
        self.last_usage = Usage.of(result)
        self.revision += 1
        if result.error is not None:
            raise result.error

    @property
    def embedding(self) -> list[float] | None:
        """The last computation's embedding (kept as 8-byte floats, returned as a new list)."""
        return None if self._embedding is None else self._embedding.tolist()

    @embedding.setter
    def embedding(self, value: Sequence[float] | None) -> None:
        self._embedding = None if value is None else array("d", value)

    def _clear_output(self) -> None:
        self.output = bytearray()
        self.output_tokens = array("i")
        self.last_piece = b""
        self._joiner = None
        self.embedding = None
        self.revision += 1

    # -- usage ---------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """Usage of the last computation, in a fixed key order.

        ``input_tokens``, ``output_tokens``, ``llama_build_number``, ``llama_commit`` always;
        after a computation also ``stop_reason``, ``prompt_ms``, ``generation_ms``,
        ``tokens_per_second``, ``reused_tokens``, with speculation on (``spec-type``) ``draft_tokens`` and
        ``accepted_draft_tokens`` (0 when nothing was drafted) and, with ``n-probs``, ``probs``.
        """
        runtime = self._registry.runtime
        meta: dict[str, Any] = {
            "input_tokens": len(self.prompt_tokens) if self.prompt_tokens is not None else 0,
            "output_tokens": len(self.output_tokens),
            "llama_build_number": runtime.build_number,
            "llama_commit": runtime.commit,
        }
        result = self.last_usage
        if result is None:
            return meta
        meta.update(
            stop_reason=result.stop_reason.value,
            prompt_ms=round(result.prompt_ms, 3),
            generation_ms=round(result.generation_ms, 3),
            tokens_per_second=round(self.last_generated / (result.generation_ms / 1000.0), 3)
            if result.generation_ms > 0
            else 0.0,
            reused_tokens=result.reused_tokens,
        )
        if result.drafted_tokens or draft_settings(self.params.options) is not None:  # 0 too: speculation is on
            meta.update(draft_tokens=result.drafted_tokens, accepted_draft_tokens=result.accepted_tokens)
        if result.probs:
            piece = self.model.weights.piece
            meta["probs"] = [
                {
                    "id": token,
                    "piece": piece(token).decode("utf-8", "replace"),
                    "top": [{"id": t, "piece": piece(t).decode("utf-8", "replace"), "p": round(p, 6)} for t, p in top],
                }
                for token, top in result.probs
            ]
        return meta

    # -- lifetime ------------------------------------------------------------------

    def cancel(self) -> None:
        """Abort a computation in flight (it fails with a runtime error)."""
        self.state.cancelled = True

    def freeze(self) -> Frozen | None:
        """The idle context as the spill store keeps it, or None if it cannot go there now.

        It can while nothing of it is in native memory but a stream's sampler: not computing, no
        sequence claimed and no sampler beyond the one a stream left midway keeps (its model's worker
        evicted it), no images (their libmtmd chunks), not cancelled.  The bytes hold its prompt's and
        output's tokens, its output, last piece, held-back bytes, embedding, stream flag, usage, revision
        and the tokens a paused stream sampled ahead; the graph, registry, limits, image reader and
        parameters are shared references; the stream's sampler stays in memory as ``kept``.  The model
        reference stays held.
        """
        state = self.state
        if (
            self.busy
            or self.closed
            or self.image_prompt is not None
            or self.rerank_prompts is not None
            or state.slot is not None
            or state.cancelled
            or state.closed
            or (state.sampler is not None and not state.mid_stream)
            or (self._feed is not None and self._feed.running)
        ):
            return None
        usage = self.last_usage
        record = (
            None if self.prompt_tokens is None else self.prompt_tokens.tobytes(),
            bytes(self.output),
            self.output_tokens.tobytes(),
            self.last_piece,
            None if self._joiner is None else self._joiner.held,
            None if self._embedding is None else self._embedding.tobytes(),
            self.streaming,
            None if usage is None else (usage.stop_reason.value, *usage[1:]),
            self.last_generated,
            self.revision,
            self.last_used,
            None if self._feed is None else self._feed.record(),
        )
        shared = (self.graph, self._registry, self.limits, self.read_image, self.guest_files, self.params)
        return Frozen(
            InferenceContext,
            shared,
            tuple(map(id, shared)),
            marshal.dumps(record),
            state if state.sampler is not None else None,
        )

    @classmethod
    def thaw(cls, shared: tuple[Any, ...], blob: bytes, kept: Any) -> InferenceContext:
        """The context :meth:`freeze` gave, rebuilt (holding the model reference it kept)."""
        prompt, output, output_tokens, last_piece, held, embedding, streaming, usage, generated, revision, *rest = (
            marshal.loads(blob)
        )
        used, fed = rest
        self = cls.__new__(cls)
        self.graph, self._registry, self.limits, self.read_image, self.guest_files, self.params = shared
        self.model = self.graph.model
        self.busy = False
        self.last_used = used
        self.state = kept if kept is not None else ContextState()
        self.prompt_tokens = None if prompt is None else _int_array(prompt)
        self.image_prompt = None
        self.rerank_prompts = None
        self.output = bytearray(output)
        self.output_tokens = _int_array(output_tokens)
        self.last_piece = last_piece
        self._joiner = None
        self._feed = None if fed is None else StreamFeed.resumed(fed)
        self.stream_listener = None
        self.stream_lookahead = LOOKAHEAD
        if held is not None:
            self._joiner = PieceJoiner()
            self._joiner.held = held
        self._embedding = None
        if embedding is not None:
            self._embedding = array("d")
            self._embedding.frombytes(embedding)
        self.streaming = streaming
        self.closed = False
        self.last_usage = None if usage is None else Usage(StopReason(usage[0]), *usage[1:])
        self.last_generated = generated
        self.revision = revision
        return self

    @classmethod
    def drop_frozen(cls, shared: tuple[Any, ...], kept: Any) -> None:
        """Close a frozen context without rebuilding it: its stream's sampler and its model reference go."""
        graph, registry = shared[0], shared[1]
        if kept is not None:
            graph.model.worker.release(kept)
        registry.release(graph.model)

    def close(self) -> None:
        """Free the sequence and drop the model reference (idempotent)."""
        if self.closed:
            return
        self.closed = True
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.ended = True  # the release below drops its job
        self.model.worker.release(self.state)
        self._registry.release(self.model)


def _effective(model: LoadedModel, field: str) -> Any:
    """A load-time parameter of ``model``; for an unset ``n-gpu-layers``, the layers the target chose."""
    value = getattr(model.params, field)
    if field == "n_gpu_layers" and value is None:
        return getattr(model.weights, "n_gpu_layers", 0)
    return value


def _same_projector(field: str, value: Any, model: LoadedModel) -> bool:
    """A guest's ``mmproj`` (or ``model-vocoder``) naming the loaded file by its name (WasmEdge's examples
    repeat the load config in the context's metadata): not a change."""
    if field not in ("mmproj", "vocoder") or not value:
        return False
    return Path(str(value)).name == Path(getattr(model.params, field)).name


def _loaded_value(model: LoadedModel, field: str) -> str:
    """The value a load-time key has in ``model``; a 0 that means "the default" says which."""
    value = _effective(model, field)
    if field == "ctx_size" and value == 0:
        return f"the default ({model.n_ctx_seq})"
    if field in ("threads", "threads_batch") and value <= 0:
        return f"the default ({model.worker.context.threads})"
    return as_json(value)


def _int_array(data: bytes) -> array[int]:
    tokens = array("i")
    tokens.frombytes(data)
    return tokens
