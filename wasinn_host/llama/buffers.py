"""The memory of a llama.cpp context, as llama.cpp reports it when it creates one, and how many logits
rows it is asked to hold.

llama.cpp logs each buffer it allocates for a context (``CPU KV buffer size = 432.00 MiB``,
``CPU  output buffer size = 32.00 MiB``, ``CPU compute buffer size = 34.50 MiB``, one line per device
and per cache); :func:`context_buffers` sums them by kind.  The output buffer holds the logits rows of
the last decode: llama.cpp reserves one per sequence and grows it when a batch asks for more; the
compute buffers are reserved for the largest graph, whose logits are ``n_outputs_max`` rows of the
vocabulary (``n_batch`` rows by default: 512 MiB for a 262,144-token vocabulary).  :func:`max_outputs`
is the bound the worker keeps to.  The worker decodes at most ``decode-logits-rows`` rows at a time
(``core/scheduling/decode_parts.py``), so that the decodes only ever write those first rows of each buffer: a
compute buffer's pages are resident only where a graph wrote them, and :func:`release_output_rows`
gives back the rest of the output buffer, which llama.cpp writes whole when it makes the context.
"""

from __future__ import annotations

import ctypes
import re

from ..core.heap_trim import release_pages
from ..core.scheduling.speculation import MAX_SPECULATIVE_BATCH
from .bindings import llama_cpp

_BUFFER = re.compile(r"(KV|output|compute) buffer size =\s*([0-9.]+) MiB")
_KINDS = {"KV": "kv", "output": "output", "compute": "compute"}


def context_buffers(lines: list[str]) -> dict[str, int]:
    """Bytes of the ``kv``, ``output`` and ``compute`` buffers named in llama.cpp's log of a context's
    creation (kinds it did not name are left out)."""
    sizes: dict[str, int] = {}
    for line in lines:
        if match := _BUFFER.search(line):
            kind = _KINDS[match.group(1)]
            sizes[kind] = sizes.get(kind, 0) + round(float(match.group(2)) * (1 << 20))
    return sizes


def max_outputs(n_seq: int) -> int:
    """The most logits rows the worker asks of one batch of a context of ``n_seq`` sequences: one for
    each sequence that samples after it, or, in a batch with drafts, one per token of at most
    :data:`~wasinn_host.core.scheduling.speculation.MAX_SPECULATIVE_BATCH` tokens.  (llama.cpp asserts that a context
    has room for at least one row per sequence, so ``decode-logits-rows`` cannot make this smaller.)"""
    return max(n_seq, MAX_SPECULATIVE_BATCH)


def release_output_rows(ctx: ctypes.c_void_p, keep: int, rows: int, n_vocab: int) -> int:
    """Release the resident pages of a new context's output buffer (``rows`` logits rows of ``n_vocab``
    floats, llama.cpp's ``llama_get_logits``) after the first ``keep`` (0: keep all): a decode of at most
    ``keep`` rows never writes them, and the system gives zeroed pages back if one ever does.  The bytes
    released.  For a buffer in host memory only (a GPU backend's pinned output buffer is left alone)."""
    if keep <= 0 or keep >= rows:
        return 0
    address = ctypes.cast(llama_cpp.llama_get_logits(ctx), ctypes.c_void_p).value
    if not address:
        return 0
    row = n_vocab * ctypes.sizeof(ctypes.c_float)
    return release_pages(address + keep * row, (rows - keep) * row)
