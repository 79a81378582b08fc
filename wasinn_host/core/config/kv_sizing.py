"""KV cache sizing: how many sequences of how many cells a model's inference context gets within
the ``max_kv_bytes`` budget, how far it grows, and the error when it does not fit."""

from __future__ import annotations

from typing import Callable

from ..errors import ErrorKind, WasiNNError
from ..runtime import DEFAULT_SEQUENCES, KvLayout
from .params import ModelParams

MAX_SEQUENCES = 256
"""llama.cpp's limit on sequence ids (``llama_max_parallel_sequences``)."""


def kv_layout(
    params: ModelParams,
    n_ctx_seq: int,
    cell_bytes: int,
    make_room: Callable[[int], int],
    label: str,
    expected: int = 0,
) -> KvLayout:
    """The KV layout of a new model context, within what ``make_room`` can free under the budget.

    ``n-parallel`` N: N sequences of ``n_ctx_seq`` cells each, as asked, or a too-large error.
    Unset (0): ``DEFAULT_SEQUENCES`` to start with, or room for the ``expected`` contexts computing at
    once (rounded up to a power of two, within llama.cpp's limit and the batch size) where the caller
    knows that many guests come (``wasinn run --instances N``), so none of them waits for the context
    to grow; fewer if the budget is short, never less than one.  The worker asks for more when more
    contexts compute at once (:func:`grown_layout`).
    """
    n_seq = params.n_parallel or max(DEFAULT_SEQUENCES, _sequences_for(expected, params))
    room = make_room(n_seq * n_ctx_seq * cell_bytes)
    if not params.n_parallel:
        n_seq = min(n_seq, room // max(n_ctx_seq * cell_bytes, 1))
    if n_seq < 1 or n_seq * n_ctx_seq * cell_bytes > room:
        what = f"{params.n_parallel or 1} sequences x {n_ctx_seq} tokens"
        raise kv_refusal(label, max(n_seq, 1) * n_ctx_seq * cell_bytes, room, what)
    return KvLayout(n_ctx_seq, n_seq)


def _sequences_for(wanted: int, params: ModelParams) -> int:
    """``wanted`` sequences rounded up to a power of two, within llama.cpp's limit and the batch size
    (llama.cpp reserves an output row per sequence)."""
    return min(MAX_SEQUENCES, params.batch_size, 1 << max(wanted - 1, 0).bit_length())


def grown_layout(
    params: ModelParams, current: KvLayout, wanted: int, cell_bytes: int, make_room: Callable[[int], int]
) -> KvLayout | None:
    """A layout with room for ``wanted`` sequences, rounded up to a power of two and at least double the
    current number (so growth is rare: guests arriving one by one do not ask for one more sequence at
    a time), within llama.cpp's limit, the batch size (llama.cpp reserves an output row per sequence)
    and the KV budget; None if not even one more sequence fits."""
    per_seq = current.n_ctx_seq * cell_bytes
    target = max(_sequences_for(wanted, params), min(MAX_SEQUENCES, params.batch_size, 2 * current.n_seq))
    room = make_room((target - current.n_seq) * per_seq)
    n_seq = min(target, current.n_seq + room // max(per_seq, 1))
    if n_seq <= current.n_seq:
        return None
    return KvLayout(current.n_ctx_seq, n_seq)


def kv_refusal(label: str, needed: int, room: int, what: str) -> WasiNNError:
    """The too-large error for a KV cache of ``needed`` bytes where ``room`` is left under the budget."""
    return WasiNNError(
        ErrorKind.TOO_LARGE,
        f"model {label}: a KV cache of {needed >> 20} MiB ({what}) exceeds the {room >> 20} MiB left under limit "
        f"max_kv_bytes (lower ctx-size or n-parallel, or raise it with Limits(max_kv_bytes=...) or "
        f"`wasinn run --max-kv-bytes`)",
    )
