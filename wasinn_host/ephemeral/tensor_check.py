"""The checks on an input tensor that WasmEdge's dialect accepts (prompt or metadata bytes).

Shared by the core-module imports (tensors read from guest memory) and the RPC server
(tensors sent by a client), so both refuse the same things with the same message.
"""

from __future__ import annotations

from typing import Sequence

from ..core.config.limits import Limits
from ..core.errors import invalid

ACCEPTED_TYPES = (0, 1, 2, 3, 4)
"""Tensor types taken for the prompt and metadata bytes (the GGML backend ignores the type): every value
some WasmEdge release accepts: 0, 1, 3 and 4 since 0.15.0 (U8 is 3 there, 4 in the RPC proto's enum),
0-3 in 0.14.x (U8 was 2).  5 and above (I64; the proto's I32 and I64) are refused, as in WasmEdge."""
MAX_DIMS = 8


def check_dims_count(count: int) -> None:
    """Refuse more dimensions than a prompt tensor can sensibly have."""
    if count > MAX_DIMS:
        raise invalid(f"set_input: {count} dimensions; at most {MAX_DIMS} are accepted ([1] or [len])")


def check_input_tensor(ttype: int, dims: Sequence[int], data_len: int, limits: Limits) -> None:
    """Refuse a tensor type WasmEdge refuses, dims that do not describe the data, or more bytes than
    ``max_prompt_bytes`` and the room for inline images (the text alone: :func:`check_input_data`)."""
    if ttype not in ACCEPTED_TYPES:
        raise invalid(
            f"set_input: tensor type {ttype} is not accepted; prompt and metadata are bytes, sent as "
            f"U8 (3; 2 before WasmEdge 0.14.1; 4 in the RPC proto), and types 0-4 are taken as WasmEdge does"
        )
    check_dims_count(len(dims))
    product = 1
    for d in dims:
        product *= d
    if dims and product not in (1, data_len):
        raise invalid(f"set_input: dims {list(dims)} do not describe {data_len} bytes; use [1] or [{data_len}]")
    limits.check_prompt_bytes("set_input: input", data_len)


def check_input_data(data: bytes, limits: Limits) -> None:
    """Refuse input bytes whose text, inline images left out, is over ``max_prompt_bytes``."""
    limits.check_prompt_bytes("set_input: input", len(data), data)
