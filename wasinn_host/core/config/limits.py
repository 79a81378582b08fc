"""Host limits: what one guest (Store) and the whole process may use.

Every refusal names the limit and how to raise it.  Capacity limits (queue, contexts,
graphs) are refused as busy; size limits (prompt, output, model bytes) as too large; a config
value above a limit as an invalid argument.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ErrorKind, WasiNNError
from ..images import MAX_IMAGE_BYTES, inline_image_bytes

INLINE_IMAGE_ROOM = 4 * -(-MAX_IMAGE_BYTES // 3) + 1024
"""Bytes a prompt may hold beyond ``max_prompt_bytes`` in inline ``<img>`` tags: one image of
``MAX_IMAGE_BYTES`` in base64 (or several smaller ones), with its tag."""


@dataclass(frozen=True)
class Limits:
    """Defaults protect a host without getting in the way of normal use."""

    max_contexts_per_store: int = 16_384
    """Execution contexts one guest may hold.  Servers built for WasmEdge (LlamaEdge's) open one per request
    and never finalize it; an idle context holds no sequence, sampler or duplicate buffer (about 1 kB plus
    4 bytes a token, see README "Many guests at once"), so thousands cost little until ``idle_timeout_ms``
    finalizes them."""
    max_contexts_total: int = 65_536
    """Execution contexts of all guests of the process together."""
    max_graphs_per_store: int = 16
    max_queue: int = 256
    """Requests of this instance's guests waiting for a free sequence, per model; a full queue is Busy at once."""
    queue_timeout_ms: int = 0
    """Default time a request may wait in the queue (0 = no limit; the ``queue-timeout-ms`` key overrides)."""
    idle_timeout_ms: int = 300_000
    """An execution context unused this long is finalised, its handle invalid from then on (0 = never).  Long
    before, an idle one has given up its sequence and sampler (``engine.WARM_CONTEXTS``) but kept its handle."""
    max_prompt_bytes: int = 1 << 20
    """Bytes of one prompt's text; inline ``<img>`` images are counted apart (:data:`INLINE_IMAGE_ROOM`)."""
    max_output_bytes: int = 16 << 20
    max_n_predict: int = 1 << 20
    allow_load_bytes: bool = True
    max_load_bytes: int = 4 << 30
    max_kv_bytes: int = 0
    """KV cache of all loaded models together, checked when this instance loads one; 0 = half the machine's memory."""

    def kv_budget(self) -> int:
        """``max_kv_bytes`` resolved (0 becomes half the physical memory)."""
        return self.max_kv_bytes or physical_memory() // 2

    def refuse(self, kind: ErrorKind, what: str, limit_name: str, value: int) -> WasiNNError:
        """The error for exceeding ``limit_name``; the message says how to raise it."""
        option = "--" + limit_name.replace("_", "-")
        return WasiNNError(
            kind,
            f"{what}: limit {limit_name}={value} reached "
            f"(raise it with Limits({limit_name}=...) or `wasinn run {option}`)",
        )

    def check_prompt_bytes(self, what: str, size: int, data: bytes | None = None) -> None:
        """Refuse (too large) an input of ``size`` bytes whose text is over ``max_prompt_bytes``: inline
        ``<img>`` images do not count, up to :data:`INLINE_IMAGE_ROOM` bytes of them (a 20 MiB image in
        base64).  Without ``data`` (not read yet) only that upper bound is checked."""
        if size <= self.max_prompt_bytes:
            return
        text = size - inline_image_bytes(data) if data is not None else size - INLINE_IMAGE_ROOM
        if size > self.max_prompt_bytes + INLINE_IMAGE_ROOM or text > self.max_prompt_bytes:
            raise self.refuse(
                ErrorKind.TOO_LARGE,
                f"{what} of {size} bytes (inline images not counted: {max(text, 0)})",
                "max_prompt_bytes",
                self.max_prompt_bytes,
            )

    def check_context_room(self, what: str, in_store: int, in_process: int) -> None:
        """Refuse (busy) one more execution context beyond ``max_contexts_per_store`` (``in_store``
        open in the caller's Store) or ``max_contexts_total`` (``in_process`` open in all)."""
        if in_store >= self.max_contexts_per_store:
            raise self.refuse(ErrorKind.BUSY, what, "max_contexts_per_store", self.max_contexts_per_store)
        if in_process >= self.max_contexts_total:
            raise self.refuse(ErrorKind.BUSY, what, "max_contexts_total", self.max_contexts_total)


def physical_memory() -> int:
    """Bytes of RAM on this machine (16 GiB if it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30
