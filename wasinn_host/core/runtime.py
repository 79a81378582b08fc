"""What the core needs from an inference library, as protocols.

Objects pass between one runtime's own classes (its contexts decode its batches), so those
parameters are typed ``Any`` here.

The engine and the registry are written against these, not against llama.cpp: the real
implementation is :mod:`wasinn_host.llama.runtime` (llama-cpp-python), and
:mod:`wasinn_host.backend.fake` answers deterministically in pure Python so scheduling and
the front ends can be tested in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .config.params import ModelParams, SamplingParams

MAX_DEFAULT_CTX = 4096
"""Without ``ctx-size``, a sequence holds the model's training context, at most this many tokens."""
DEFAULT_SEQUENCES = 4
"""Without ``n-parallel``, a model starts with this many sequences and grows with demand."""


@dataclass(frozen=True)
class KvLayout:
    """How a context's KV cache is laid out: sequences and their length."""

    n_ctx_seq: int
    """Tokens one sequence (execution context) may hold."""
    n_seq: int
    """Sequence ids: how many execution contexts can decode at once."""

    @property
    def n_cells(self) -> int:
        """KV cells of all sequences together."""
        return self.n_ctx_seq * self.n_seq


class Model(Protocol):
    """Loaded weights and vocabulary (read-only after load, shared by contexts)."""

    path: Path
    n_vocab: int
    n_ctx_train: int
    size_bytes: int
    bos: int
    eos: int

    @property
    def description(self) -> str:
        """One line: architecture, size, quantisation."""

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids (BOS added, special-token text parsed)."""

    def piece(self, token: int) -> bytes:
        """The bytes of one token, special tokens rendered."""

    def is_eog(self, token: int) -> bool:
        """Whether the token ends a generation."""

    def chat_template(self) -> str | None:
        """The model's chat template, if it has one."""

    def check_sampling(self, params: SamplingParams) -> None:
        """Refuse (invalid argument) sampling parameters this model cannot use (a grammar or JSON schema
        the backend cannot parse or convert included)."""

    def close(self) -> None:
        """Free what it holds."""


class Batch(Protocol):
    """A reusable batch of tokens, each for one sequence id."""

    capacity: int
    n: int

    def clear(self) -> None:
        """Empty the batch."""

    def add(self, token: int, pos: int, seq_id: int, want_logits: bool) -> int:
        """Append a token; return its index in the batch."""

    def rewrite(self, index: int, token: int, pos: int) -> None:
        """Put another token and position at ``index``; its sequence id and logits flag stay."""

    def close(self) -> None:
        """Free what it holds."""


class Sampler(Protocol):
    """A sampler chain for one execution context."""

    @property
    def argmax_only(self) -> bool:
        """Whether its choice is the most likely token of the raw logits and accepting it changes nothing
        (plain greedy): the worker then samples such rows together (:meth:`Context.greedy_tokens`)."""

    @property
    def draws_together(self) -> bool:
        """Whether its rows are drawn as arrays with other such samplers' rows
        (:meth:`Context.drawn_tokens`), the tokens its chain would draw."""

    def sample(self, ctx: Any, batch_index: int) -> int:
        """Sample (and accept) a token from the logits at ``batch_index`` of ``ctx``'s last decode."""

    def reset(self) -> None:
        """Forget the history (penalties, mirostat state)."""

    def close(self) -> None:
        """Free what it holds."""


class Context(Protocol):
    """An inference context with ``n_seq`` sequences of up to ``n_ctx_seq`` tokens each."""

    @property
    def model(self) -> Model:
        """The model this context runs."""

    n_seq: int
    n_ctx_seq: int
    n_batch: int
    threads: int
    kv_bytes: int
    offloaded: bool
    """Whether the model's layers run on a GPU."""

    def new_batch(self) -> Batch:
        """A batch of up to ``n_batch`` tokens."""

    def new_sampler(self, params: SamplingParams) -> Sampler:
        """A sampler chain for one execution context."""

    def decode(self, batch: Any, first: int = 0, count: int | None = None) -> int:
        """Decode ``count`` tokens (None: the rest) from index ``first`` of a batch this context made; 0 on
        success.  Batch indices of the logits are then counted from ``first``."""

    def synchronize(self) -> None:
        """Wait until the last decode has finished on its device (a GPU backend decodes asynchronously
        until its outputs are read; on a CPU the decode has finished when it returns)."""

    def decode_image(self, span: Any, pos: int, seq_id: int) -> int:
        """Decode one image of a prompt (a ``vision.ImageSpan``) into ``seq_id`` at ``pos``; 0 on success."""

    def seq_rm(self, seq_id: int, start: int) -> None:
        """Drop a sequence's cells from ``start`` on."""

    def seq_copy(self, src: int, dst: int) -> None:
        """Replace ``dst``'s cells by a copy of all of ``src``'s (shared prompt prefixes)."""

    def seq_length(self, seq_id: int) -> int:
        """Cells the sequence holds (its highest position + 1; 0 if empty)."""

    def state_get(self, seq_id: int) -> memoryview:
        """The KV state of one sequence (for the prompt cache)."""

    def state_set(self, seq_id: int, data: memoryview) -> bool:
        """Load a sequence's KV state made by :meth:`state_get`; False if it does not fit this context."""

    def can_shift(self) -> bool:
        """Whether cell positions can move (context shift)."""

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None:
        """Drop ``discard`` cells after the first ``keep`` and move the rest back."""

    def embeddings(self, seq_id: int, batch_index: int) -> list[float]:
        """The embedding of a sequence (pooled, or the token at ``batch_index``)."""

    def top_probabilities(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        """The ``n`` most likely next tokens and their probabilities."""

    def greedy_tokens(self, batch_indices: list[int]) -> list[int]:
        """The most likely token at each batch index of the last decode (the first of equal maxima)."""

    def drawn_tokens(self, batch_indices: list[int], samplers: list[Any]) -> list[int]:
        """The token each sampler (one whose ``draws_together``) draws at its batch index of the last
        decode, the rows sampled together."""

    def close(self) -> None:
        """Free what it holds."""


class Runtime(Protocol):
    """Loads models and creates contexts; knows the library's version."""

    build_number: int
    commit: str

    def load_model(self, path: Path, params: ModelParams) -> Model:
        """Load weights and vocabulary (invalid argument if the file cannot be loaded)."""

    def new_context(self, model: Any, params: ModelParams, layout: KvLayout) -> Context:
        """A context on a model this runtime loaded."""

    def kv_cache_bytes(self, model: Any, n_ctx: int, params: ModelParams) -> int:
        """Bytes of KV cache for ``n_ctx`` cells of a model this runtime loaded, of the cache types
        (``type-k``, ``type-v``) ``params`` name."""

    def check_model_file(self, path: Path) -> None:
        """Refuse (invalid argument) an untrusted file before it is loaded in this process."""
