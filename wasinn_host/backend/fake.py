"""A fake runtime in pure Python: the successor model without llama.cpp, for tests in milliseconds.

:class:`FakeRuntime` implements :class:`~wasinn_host.core.runtime.Runtime` with the successor
table of :mod:`wasinn_host.backend.successor`: tokenization as llama.cpp does it in that
vocabulary, and every "forward pass" predicts the successor of the last decoded token
(``a`` -> ``b`` ... ``z`` -> EOS, ``9`` -> ``0``).  Sampling is always that prediction, so any
sampling parameters give the greedy output of the real successor model.  Everything above it
(the registry, the engine's scheduling, the contexts, the front ends) is the real code, so
:func:`fake_backend` runs the ABI's handle, error, copying and streaming rules, and the
engine's queueing, priorities and prefix reuse, without loading a model.

``decode_delay`` makes each decode take that many seconds, to hold requests in flight; ``token_delay``
adds that many seconds per token of the batch (a decode then costs as on a CPU: a fixed part and a part
per token, as the worker's cost model fits them).
"""

from __future__ import annotations

import threading
import time
from array import array
from pathlib import Path
from typing import Iterable

from ..core.config.limits import Limits
from ..core.config.params import ModelParams, SamplingParams
from ..core.config.preload import Preload
from ..core.errors import ErrorKind, WasiNNError
from ..core.registry import ModelRegistry
from ..core.runtime import KvLayout
from .local import LocalBackend
from .successor import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    CHAR_TOKEN_OFFSET,
    EOS_ID,
    FIRST_PRINTABLE,
    SUCCESSOR_VOCAB_SIZE,
    UNK_ID,
    successor_of,
    successor_tokenize,
)

GGUF_MAGIC = b"GGUF"
GGUF_HEADER_BYTES = 24
FAKE_N_EMBD = 8
KV_BYTES_PER_CELL = 1024
_SPECIAL_TEXT = {"<s>": BOS_ID, "</s>": EOS_ID, "<unk>": UNK_ID}


class FakeModel:
    """The successor vocabulary and table, behind the :class:`~wasinn_host.core.runtime.Model` protocol."""

    def __init__(self, path: Path, n_ctx_train: int) -> None:
        self.path = path
        self.n_vocab = SUCCESSOR_VOCAB_SIZE
        self.n_ctx_train = n_ctx_train
        self.size_bytes = path.stat().st_size
        self.bos = BOS_ID
        self.eos = EOS_ID

    @property
    def description(self) -> str:
        """What llama.cpp would print for the model."""
        return "fake successor model"

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """As llama.cpp tokenizes in the successor vocabulary (special-token text parsed)."""
        decoded = text.decode("utf-8", "replace")
        ids = [BOS_ID] if add_special else []
        rest = decoded
        while rest:
            special = next((s for s in _SPECIAL_TEXT if parse_special and rest.startswith(s)), None)
            if special is not None:
                ids.append(_SPECIAL_TEXT[special])
                rest = rest[len(special) :]
                continue
            ids.extend(successor_tokenize(rest[0], add_bos=False))
            rest = rest[1:]
        return ids

    def piece(self, token: int) -> bytes:
        """The bytes of a token, special tokens rendered."""
        if token == BOS_ID:
            return b"<s>"
        if token == EOS_ID:
            return b"</s>"
        if BYTE_TOKEN_OFFSET <= token < CHAR_TOKEN_OFFSET:
            return bytes([token - BYTE_TOKEN_OFFSET])
        if CHAR_TOKEN_OFFSET <= token < SUCCESSOR_VOCAB_SIZE:
            return chr(token - CHAR_TOKEN_OFFSET + FIRST_PRINTABLE).encode()
        return b""

    def is_eog(self, token: int) -> bool:
        """Only EOS ends a generation."""
        return token == EOS_ID

    def chat_template(self) -> str | None:
        """The fake model has no template."""
        return None

    def check_sampling(self, params: SamplingParams) -> None:
        """Refuse logit-bias tokens outside the vocabulary, as the real runtime does (grammars and JSON schemas
        are not enforced, so not checked: the successor model ignores sampling)."""
        for token, _bias in params.logit_bias:
            if token >= self.n_vocab:
                raise WasiNNError(
                    ErrorKind.INVALID_ARGUMENT,
                    f"config key 'logit-bias': token id {token} is not in the vocabulary of {self.n_vocab}",
                )

    def close(self) -> None:
        """Nothing to free."""


class FakeBatch:
    """A list of (token, position, sequence id, wants logits)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.n = 0
        self.tokens: list[tuple[int, int, int, bool]] = []
        self.rewrites = 0
        """Tokens put in place by :meth:`rewrite` (a plan carried from the step before)."""

    def clear(self) -> None:
        """Empty the batch."""
        self.n = 0
        self.tokens.clear()

    def add(self, token: int, pos: int, seq_id: int, want_logits: bool) -> int:
        """Append a token; return its index."""
        if self.n >= self.capacity:
            raise AssertionError(f"batch overflow: {self.capacity} tokens")  # llama.cpp would abort
        self.tokens.append((token, pos, seq_id, want_logits))
        self.n += 1
        return self.n - 1

    def rewrite(self, index: int, token: int, pos: int) -> None:
        """Put another token and position at ``index`` (its sequence and logits flag stay)."""
        _, _, seq_id, want_logits = self.tokens[index]
        self.tokens[index] = (token, pos, seq_id, want_logits)
        self.rewrites += 1

    def close(self) -> None:
        """Nothing to free."""


class FakeSampler:
    """Always the successor of the token whose logits are asked for."""

    argmax_only = True
    """The successor is the fake's most likely token: rows are sampled together (:meth:`FakeContext.greedy_tokens`)."""
    draws_together = False
    """Never drawn as arrays (it is greedy)."""

    def sample(self, ctx: "FakeContext", batch_index: int) -> int:
        """The prediction at ``batch_index`` of the last decode."""
        return successor_of(ctx.predicted_from(batch_index))

    def reset(self) -> None:
        """No state."""

    def close(self) -> None:
        """Nothing to free."""


class FakeContext:
    """Sequences of cells, checked as llama.cpp checks them (consecutive positions, capacity)."""

    def __init__(
        self, model: FakeModel, params: ModelParams, layout: KvLayout, decode_delay: float, token_delay: float = 0.0
    ) -> None:
        self.model = model
        self.n_seq = layout.n_seq
        self.n_ctx_seq = layout.n_ctx_seq
        self.n_batch = params.batch_size
        self.threads = params.threads if params.threads > 0 else 1
        self.offloaded = False
        self.kv_bytes = KV_BYTES_PER_CELL * layout.n_cells
        self.embedding_mode = params.embedding
        self._cells: list[list[int]] = [[] for _ in range(self.n_seq)]
        self._last: list[tuple[int, int, int, bool]] = []
        self._delay = decode_delay
        self._token_delay = token_delay
        self.greedy_calls = 0
        """Calls of :meth:`greedy_tokens` (each samples the rows of one decoded part together)."""

    def new_batch(self) -> FakeBatch:
        """A batch of ``n_batch`` tokens."""
        return FakeBatch(self.n_batch)

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        """The successor sampler (parameters do not change it)."""
        self.model.check_sampling(params)
        return FakeSampler()

    def decode(self, batch: FakeBatch, first: int = 0, count: int | None = None) -> int:
        """Store each token of ``count`` (None: the rest) from ``first`` at its position; refuse a gap
        (llama.cpp's rule) with 1."""
        tokens = batch.tokens[first:] if count is None else batch.tokens[first : first + count]
        if self._delay or self._token_delay:
            time.sleep(self._delay + self._token_delay * len(tokens))
        for token, pos, seq_id, _logits in tokens:
            cells = self._cells[seq_id]
            if pos != len(cells) or len(cells) >= self.n_ctx_seq:
                return 1
            cells.append(token)
        self._last = list(tokens)
        return 0

    def synchronize(self) -> None:
        """Nothing to wait for: a fake decode has finished when it returns."""

    def greedy_tokens(self, batch_indices: list[int]) -> list[int]:
        """The successor of the token at each batch index (what :class:`FakeSampler` samples there)."""
        self.greedy_calls += 1
        return [successor_of(self.predicted_from(index)) for index in batch_indices]

    def drawn_tokens(self, batch_indices: list[int], samplers: list[object]) -> list[int]:
        """Each sampler's token (the fake's samplers are greedy: the successor)."""
        return [successor_of(self.predicted_from(index)) for index in batch_indices]

    def decode_image(self, span: object, pos: int, seq_id: int) -> int:
        """The fake model has no projector: every image fails to decode."""
        return 1

    def predicted_from(self, batch_index: int) -> int:
        """The token at ``batch_index`` of the last decode (its logits were asked for)."""
        token, _pos, _seq, wants = self._last[batch_index]
        if not wants:
            raise AssertionError(f"no logits were requested at batch index {batch_index}")
        return token

    def seq_rm(self, seq_id: int, start: int) -> None:
        """Drop the sequence's cells from ``start`` on."""
        del self._cells[seq_id][start:]

    def seq_copy(self, src: int, dst: int) -> None:
        """Replace ``dst``'s cells by a copy of ``src``'s."""
        self._cells[dst] = list(self._cells[src])

    def seq_length(self, seq_id: int) -> int:
        """Cells the sequence holds."""
        return len(self._cells[seq_id])

    def state_get(self, seq_id: int) -> memoryview:
        """The sequence's tokens as 32-bit integers (the fake KV state)."""
        return memoryview(array("i", self._cells[seq_id]).tobytes())

    def state_set(self, seq_id: int, data: memoryview) -> bool:
        """Tokens saved by :meth:`state_get`; False if they do not fit."""
        if len(data) % 4 or len(data) // 4 > self.n_ctx_seq:
            return False
        self._cells[seq_id] = list(array("i", bytes(data)))
        return True

    def can_shift(self) -> bool:
        """Positions can move."""
        return True

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None:
        """Drop ``discard`` cells after the first ``keep``."""
        del self._cells[seq_id][keep : keep + discard]

    def embeddings(self, seq_id: int, batch_index: int) -> list[float]:
        """A deterministic vector from the sequence's tokens."""
        cells = self._cells[seq_id]
        return [float(sum(cells) % (i + 7) + 1) for i in range(FAKE_N_EMBD)]

    def top_probabilities(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        """The successor with probability 1, then zeros."""
        best = successor_of(self.predicted_from(batch_index))
        others = [t for t in range(self.model.n_vocab) if t != best][: max(n - 1, 0)]
        return [(best, 1.0)] + [(t, 0.0) for t in others]

    def close(self) -> None:
        """Nothing to free."""


class FakeRuntime:
    """Loads any file that starts with ``GGUF`` as the successor model."""

    build_number = 0
    commit = "fake"

    def __init__(self, n_ctx_train: int = 512, decode_delay: float = 0.0, token_delay: float = 0.0) -> None:
        self.n_ctx_train = n_ctx_train
        self.decode_delay = decode_delay
        self.token_delay = token_delay
        self.loads = 0
        self._lock = threading.Lock()

    def load_model(self, path: Path, params: ModelParams) -> FakeModel:
        """The successor model, if ``path`` holds GGUF bytes."""
        with open(path, "rb") as handle:
            magic = handle.read(4)
        if magic != GGUF_MAGIC:
            raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"could not load model file {str(path)!r}: not a GGUF file")
        with self._lock:
            self.loads += 1
        return FakeModel(path, self.n_ctx_train)

    def new_context(self, model: FakeModel, params: ModelParams, layout: KvLayout) -> FakeContext:
        """A context laid out as ``layout`` says."""
        return FakeContext(model, params, layout, self.decode_delay, self.token_delay)

    def kv_cache_bytes(self, model: FakeModel, n_ctx: int, params: ModelParams) -> int:
        """A fixed size per cell, whatever the cache types."""
        return KV_BYTES_PER_CELL * n_ctx

    def check_model_file(self, path: Path) -> None:
        """A file without a GGUF header (magic, version 2 or 3, tensor and key counts) is refused."""
        with open(path, "rb") as handle:
            header = handle.read(GGUF_HEADER_BYTES)
        version = int.from_bytes(header[4:8], "little") if len(header) == GGUF_HEADER_BYTES else 0
        if not header.startswith(GGUF_MAGIC) or version not in (2, 3):
            raise WasiNNError(ErrorKind.INVALID_ARGUMENT, "model rejected: not a GGUF header")


def fake_backend(
    preloads: Iterable[Preload | str] = (), limits: Limits | None = None, runtime: FakeRuntime | None = None
) -> LocalBackend:
    """A :class:`~wasinn_host.backend.local.LocalBackend` whose models are all the fake successor model."""
    registry = ModelRegistry(preloads, runtime=runtime or FakeRuntime())
    return LocalBackend(registry, limits)
