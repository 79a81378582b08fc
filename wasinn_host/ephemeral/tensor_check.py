"""The checks on an input tensor that WasmEdge's dialect accepts (prompt or metadata bytes).

Shared by the core-module imports (tensors read from guest memory) and the RPC server
(tensors sent by a client), so both refuse the same things with the same message.
"""

from __future__ import annotations

from typing import Sequence

from ..core.errors import ErrorKind, invalid
from ..core.limits import Limits

U8_TYPES = (2, 3)  # U8 is 3 since WasmEdge 0.14.1_plugin_lts, 2 before
MAX_DIMS = 8


def check_dims_count(count: int) -> None:
    """Refuse more dimensions than a prompt tensor can sensibly have."""
    if count > MAX_DIMS:
        raise invalid(f"set_input: {count} dimensions; at most {MAX_DIMS} are accepted ([1] or [len])")


def check_input_tensor(ttype: int, dims: Sequence[int], data_len: int, limits: Limits) -> None:
    """Refuse a non-U8 tensor, dims that do not describe the data, or more than ``max_prompt_bytes``."""
    if ttype not in U8_TYPES:
        raise invalid(
            f"set_input: tensor type {ttype} is not accepted; prompt and metadata are "
            f"bytes: U8 (3, or 2 before WasmEdge 0.14.1)"
        )
    check_dims_count(len(dims))
    product = 1
    for d in dims:
        product *= d
    if dims and product not in (1, data_len):
        raise invalid(f"set_input: dims {list(dims)} do not describe {data_len} bytes; use [1] or [{data_len}]")
    if data_len > limits.max_prompt_bytes:
        raise limits.refuse(
            ErrorKind.TOO_LARGE, f"set_input: input of {data_len} bytes", "max_prompt_bytes", limits.max_prompt_bytes
        )
