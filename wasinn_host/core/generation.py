"""The records a generation is made of: what is asked, what comes back, and why it stopped.

A :class:`GenerationRequest` asks a model's worker to decode some tokens and then sample up
to ``limit`` more; the worker fills in a :class:`GenerationResult`.  A request that cannot
be served ends with ``result.error`` set (a :class:`~wasinn_host.core.errors.WasiNNError`);
every other ending is a :class:`StopReason`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, cast

from .config.params import SamplingParams, StopParams
from .errors import WasiNNError
from .scheduling.ngram_drafts import DraftSettings


class StopReason(str, enum.Enum):
    """Why a generation ended (the value is what the output metadata shows)."""

    NONE = ""
    EOS = "eos"
    """An end-of-generation token was sampled."""
    N_PREDICT = "n-predict"
    LIMIT = "limit"
    """``n-predict`` 0: the prompt was decoded and nothing sampled."""
    STOP = "stop"
    REVERSE_PROMPT = "reverse-prompt"
    MAX_TIME = "max-time"
    CONTEXT_FULL = "context full"
    TOKEN = "token"
    """One streaming step produced its token (a stream's job: paused, its guest that far behind)."""
    STREAM_ENDED = "stream ended"
    """The guest ended the stream while its job sampled ahead."""
    EMBEDDING = "embedding"
    OUTPUT_LIMIT = "output limit"
    CANCELLED = "cancelled"
    FINALISED = "context finalised"
    MODEL_CLOSED = "model closed"
    QUEUE_FULL = "queue full"
    QUEUE_TIMEOUT = "queue timeout"
    EMPTY_PROMPT = "empty prompt"
    DECODE_FAILED = "decode failed"
    INTERNAL_ERROR = "internal error"
    REJECTED = "rejected"
    """The model refused the request's sampling parameters."""


class PieceOutlet(Protocol):
    """A piece sink that may fall behind (a Store's ``stream-stdout`` queue): while it has no room the
    worker leaves the computation out of its steps; the caller flushes it before returning."""

    def __call__(self, piece: bytes) -> None:
        """Take one piece (without waiting)."""
        ...

    def has_room(self) -> bool:
        """False while the sink is that far behind."""
        ...

    def flush(self) -> None:
        """Wait until every piece given so far is written."""
        ...


def outlet_of(sink: Callable[[bytes], None] | None) -> PieceOutlet | None:
    """``sink`` as a :class:`PieceOutlet` if it is one (found by its ``has_room``: a runtime Protocol
    check costs about 20 us a call), else None."""
    return cast(PieceOutlet, sink) if hasattr(sink, "has_room") else None


@dataclass(frozen=True)
class GenerationRequest:
    """Decode ``tokens`` (prompt plus anything generated before), then sample up to ``limit`` tokens."""

    tokens: tuple[int, ...]
    limit: int
    sampling: SamplingParams
    stopping: StopParams
    streaming: bool = False
    """A ``compute_single`` step: only end-of-generation and a full context stop it."""
    reset_sampler: bool = True
    cache_prompt: bool = True
    cache_name: str = ""
    """``path-prompt-cache``: the entry of the host's prompt cache this prompt is saved under ("" = by content)."""
    priority: int = 0
    queue_timeout_ms: int = 0
    max_queue: int = 256
    ctx_shift: bool = False
    n_keep: int = 0
    max_output_bytes: int = 1 << 62
    embed: bool = False
    """Embedding mode: decode the prompt and return its embedding instead of sampling."""
    on_piece: Callable[[bytes], None] | None = None
    piece_room: Callable[[], bool] | None = None
    """False while ``on_piece`` is too far behind: the job waits out of the worker's steps."""
    drafts: DraftSettings | None = None
    """Speculative decoding with prompt-lookup drafts (``spec-type``); None: off."""
    images: tuple[Any, ...] = ()
    """The prompt's images (``vision.ImageSpan``: start index, token count, libmtmd chunk); their
    positions in ``tokens`` hold placeholder ids, decoded as one image each."""
    regenerate_images: bool = False
    """``always-regenerate-image-embd``: no image is kept from an earlier compute (the KV cache is kept
    only up to the first image)."""


@dataclass(slots=True)
class GenerationResult:
    """What a finished request produced."""

    generated: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    probs: list[tuple[int, list[tuple[int, float]]]] = field(default_factory=list)
    embedding: list[float] = field(default_factory=list)
    stop_reason: StopReason = StopReason.NONE
    error: WasiNNError | None = None
    prompt_ms: float = 0.0
    generation_ms: float = 0.0
    reused_tokens: int = 0
    drafted_tokens: int = 0
    """Draft tokens verified (speculative decoding)."""
    accepted_tokens: int = 0
    """Draft tokens that matched the sampled ones."""
