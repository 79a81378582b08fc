"""KV cache types: the load-time keys ``type-k`` and ``type-v``.

The names are llama.cpp's (``--cache-type-k``/``--cache-type-v``, ``-ctk``/``-ctv``: ggml's type names):
``f16`` (the default), ``f32``, ``bf16``, ``q8_0``, ``q4_0``, ``q4_1``, ``iq4_nl``, ``q5_0``, ``q5_1``.
WasmEdge's GGML plugin spells the keys ``cache-type-k``/``cache-type-v`` and takes ggml's type number
(``8`` for ``q8_0``); both spellings are accepted here, with either value.

A quantized V cache needs flash attention in llama.cpp: with ``flash-attn`` ``auto`` (the default)
llama.cpp turns it on, as it does for ``-ctv q8_0``; with ``flash-attn`` ``off`` the load is refused
(:func:`check_flash_attn`), where llama.cpp would fail to create the context.
"""

from __future__ import annotations

from typing import Any

from ..errors import WasiNNError, invalid
from .params import ModelParams

GGML_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q4_0": 2,
    "q4_1": 3,
    "iq4_nl": 20,
    "q5_0": 6,
    "q5_1": 7,
}
"""The KV cache types llama.cpp accepts, by name, with ggml's type number (``enum ggml_type``)."""

UNQUANTIZED = frozenset({"f32", "f16", "bf16"})
ACCEPTED = ", ".join(GGML_TYPES) + " (or ggml's type number, as WasmEdge's cache-type-k/-v take)"
"""What the keys accept, for error messages."""


def kv_type(value: Any) -> Any:
    """A key's value as a type name: a name in any case, or ggml's type number (WasmEdge's spelling; a
    number of no KV cache type becomes its text, which the key's check refuses).  Anything else is
    returned as it is, for the type check to refuse."""
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, int) and not isinstance(value, bool):
        return next((name for name, number in GGML_TYPES.items() if number == value), str(value))
    return value


def is_kv_type(value: Any) -> bool:
    """Whether ``value`` names a KV cache type."""
    return value in GGML_TYPES


def is_quantized(name: str) -> bool:
    """Whether a KV cache type is a block-quantized one (not f32, f16 or bf16)."""
    return name not in UNQUANTIZED


def cache_layout(params: ModelParams) -> str:
    """What of the load-time keys decides the layout of a saved KV state: the flash-attn setting, and
    the cache types when they are not the default (so f16 prompt-cache entries keep their key)."""
    if (params.type_k, params.type_v) == ("f16", "f16"):
        return params.flash_attn
    return f"{params.flash_attn} {params.type_k}/{params.type_v}"


def check_flash_attn(type_v: str, flash_attn: str) -> None:
    """Refuse a quantized V cache with flash attention turned off (llama.cpp cannot make that context)."""
    if is_quantized(type_v) and flash_attn in ("off", "disabled"):
        raise flash_attn_refusal(type_v, flash_attn)


def flash_attn_refusal(type_v: str, flash_attn: str) -> WasiNNError:
    """The invalid-argument error of a quantized V cache without flash attention."""
    return invalid(
        f"config key 'type-v': a {type_v} V cache needs flash attention, but flash-attn is {flash_attn!r}; "
        f"set flash-attn to 'auto' (the default) or 'on', or type-v to f16"
    )
